"""The weight recipe: which .mspec objects each source tensor becomes under a profile.

Profiles (docs/interfaces.md): `bf16` (linears and lm_head as bfloat16), `fp8` (linears as
float8_e4m3fn + float32 per-output-channel scales), `int4` (linears as asymmetric g128 int4).
In every profile: embeddings, norms, conv, A_log, dt_bias and the small GDN gate projections
(in_proj_a/b) stay exactly as stored. lm_head stays bfloat16 by default (the recipe records
`"lm_head": "bf16"`: quantizing it costs the most quality per byte saved); `lm_head=P` (P = the
profile, fp8 or int4; or fp8 with int4) stores it in that linear layout instead and records the layout
(`"lm_head": "fp8_e4m3/per-channel/v1"`), so the recipe hash and the weights_id change: the logits
GEMV reads 1/2 (fp8) or ~1/4 (int4) of the bf16 head's bytes per token
(KNOWLEDGE/ah-ha/decode-targets-need-a-quantized-lm-head.md).

`plan_objects(rule, dtype, load)` returns PlannedObjects whose producers call `load()` once per
source tensor (a small refcounted cache shares the quantized parts) and record the reconstruction
error into an `InventoryRow`. With `device` ("cuda"), quantization and its error run there and the
parts come back to the CPU: the bytes are the same as on the CPU (quantize.py's device-exact
contract). `measure_error=False` skips the error columns (identity previews: bytes unchanged).
Raises UnknownProfileError, TensorDtypeError, QuantizationShapeError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from modeld.convert.errors import QuantizationShapeError, TensorDtypeError, UnknownProfileError
from modeld.convert.families import TensorRule
from modeld.mspec import format as F
from modeld.mspec.writer import PlannedObject

PROFILES = ("bf16", "fp8", "int4")
INT4_GROUP = 128
FLOAT_DTYPES = ("bfloat16", "float16", "float32")


# (profile, lm_head) pairs beside the default bf16 head: the profile's own format, or fp8 for an int4 artifact (half
# the bf16 head's bytes at a quarter of the int4 head's error: the int4 head failed the H200 certification's rung 6 by
# one flip in session 26, findings/quantized-lm-head-measured-h200-s26.md)
QUANTIZED_HEADS = (("fp8", "fp8"), ("int4", "int4"), ("int4", "fp8"))


def check_lm_head(profile: str, lm_head: str) -> None:
    """lm_head is "bf16", the (quantized) profile itself, or fp8 for int4. Raises UnknownProfileError."""
    if lm_head != "bf16" and (profile, lm_head) not in QUANTIZED_HEADS:
        raise UnknownProfileError(f"lm_head {lm_head!r} with profile {profile!r}: the lm_head is bf16 or stored in "
                                  f"the profile's own format (fp8 with profile fp8, int4 with profile int4), or "
                                  f"fp8 with profile int4")


def recipe_dict(profile: str, family: str, source_format: str, group: int = INT4_GROUP,
                lm_head: str = "bf16") -> dict:
    if profile not in PROFILES:
        raise UnknownProfileError(f"profile {profile!r}; choose one of {', '.join(PROFILES)}")
    check_lm_head(profile, lm_head)
    layouts = {"bf16": "bfloat16", "fp8": F.FP8_LAYOUT, "int4": F.int4_layout(group)}
    return {
        "converter": "modeld.convert/v1", "family": family, "profile": profile, "source_format": source_format,
        "linear": layouts[profile], "lm_head": "bf16" if lm_head == "bf16" else layouts[lm_head],
        "embeddings": "as stored", "norms_conv_ssm_params": "as stored",
        "kept_linears": ["linear_attn.in_proj_a", "linear_attn.in_proj_b"] if family == "qwen3_5" else [],
    }


@dataclass
class InventoryRow:
    name: str
    source: str
    dtype: str
    shape: tuple[int, ...]
    layout: str
    nbytes: int
    max_abs_err: float | None = None
    rel_fro_err: float | None = None
    note: str = ""

    def as_json(self) -> dict:
        return {"name": self.name, "source": self.source, "dtype": self.dtype, "shape": list(self.shape),
                "layout": self.layout, "bytes": self.nbytes, "max_abs_err": self.max_abs_err,
                "rel_fro_err": self.rel_fro_err, "note": self.note}


@dataclass
class _Shared:
    """Parts of one source tensor's conversion, kept until every part has been written."""
    make: Callable[[], dict]
    pending: int
    parts: dict | None = None

    def take(self, key: str):
        if self.parts is None:
            self.parts = self.make()
        value = self.parts[key]
        self.pending -= 1
        if self.pending == 0:
            self.parts = None           # release the source and every part
        return value


@dataclass
class PlannedTensorSet:
    objects: list[PlannedObject] = field(default_factory=list)
    rows: list[InventoryRow] = field(default_factory=list)


def plan_objects(rule: TensorRule, src_dtype: str, load: Callable, profile: str,
                 group: int = INT4_GROUP, *, device: str | None = None,
                 measure_error: bool = True, lm_head: str = "bf16") -> PlannedTensorSet:
    """Objects for one source tensor (see module doc)."""
    import torch

    from modeld.convert import quantize as Q

    if src_dtype not in FLOAT_DTYPES:
        raise TensorDtypeError(f"{rule.source}: dtype {src_dtype} is not a float type")
    check_lm_head(profile, lm_head)
    out = PlannedTensorSet()
    fmt = {"linear": profile, "lm_head": lm_head}.get(rule.role)   # None: kept as stored
    quantize = fmt in ("fp8", "int4")
    cast_bf16 = fmt == "bf16"
    n, k = (rule.shape + (1,))[:2]

    if not quantize:
        dtype = "bfloat16" if cast_bf16 else src_dtype
        row = InventoryRow(rule.target, rule.source, dtype, rule.shape, F.PLAIN,
                           _nbytes(rule.shape, dtype), note="cast" if dtype != src_dtype else "as stored")

        def produce_plain():
            w = load()
            if dtype == src_dtype:
                return w
            out_t = w.to(torch.bfloat16)
            if not measure_error:
                return out_t
            ref = w.reshape(w.shape[0], -1) if w.dim() >= 2 else w.reshape(1, -1)
            got = out_t.reshape(ref.shape)
            err = Q.reconstruction_error(ref, lambda r0, r1: got[r0:r1].float())
            row.max_abs_err, row.rel_fro_err = err.max_abs, err.rel_fro
            return out_t

        out.objects.append(PlannedObject(rule.target, "tensor", dtype, rule.shape, F.PLAIN, produce_plain))
        out.rows.append(row)
        return out

    base = rule.target[:-len(".weight")] if rule.target.endswith(".weight") else rule.target
    if fmt == "fp8":
        layout = F.FP8_LAYOUT
        specs = {"weight": ("float8_e4m3fn", (n, k)), "weight_scale": ("float32", (n,))}
    else:
        layout = F.int4_layout(group)
        if k % group:
            raise QuantizationShapeError(f"{rule.source}: K={k} is not divisible by the int4 group {group}")
        specs = {"qweight": ("uint8", (n, k // 2)), "scales": ("float16", (n, k // group)),
                 "mins": ("float16", (n, k // group))}
    rows = {key: InventoryRow(f"{base}.{key}", rule.source, dt, shp, layout, _nbytes(shp, dt))
            for key, (dt, shp) in specs.items()}
    primary = rows["weight" if fmt == "fp8" else "qweight"]

    def make() -> dict:
        w = load()
        if device is not None:
            w = w.to(device)
        at = w.device                   # parts stay beside W until the error is measured
        if fmt == "fp8":
            q, s = Q.quantize_fp8(w, rule.source, out_device=at)
            dequant = lambda r0, r1: Q.dequantize_fp8(q[r0:r1], s[r0:r1])          # noqa: E731
            parts = {"weight": q, "weight_scale": s}
        else:
            qw, sc, mn = Q.quantize_int4(w, group, rule.source, out_device=at)
            dequant = lambda r0, r1: Q.dequantize_int4(qw[r0:r1], sc[r0:r1], mn[r0:r1])  # noqa: E731
            parts = {"qweight": qw, "scales": sc, "mins": mn}
        if measure_error:
            err = Q.reconstruction_error(w, dequant)
            primary.max_abs_err, primary.rel_fro_err = err.max_abs, err.rel_fro
        return {key: t.cpu() for key, t in parts.items()}   # the writer takes CPU tensors

    shared = _Shared(make, pending=len(specs))
    for key, (dt, shp) in specs.items():
        out.objects.append(PlannedObject(f"{base}.{key}", "tensor", dt, shp, layout,
                                         lambda key=key: shared.take(key)))
        out.rows.append(rows[key])
    return out


def _nbytes(shape: tuple[int, ...], dtype: str) -> int:
    n = F.DTYPES[dtype][0]
    for d in shape:
        n *= d
    return n
