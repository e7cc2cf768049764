"""The llama weight layout: the one explicit name map, per-linear formats, and the strict loader.

Slots (arena buffers, fixed before a byte is read):

    embed                      [V, D] bf16             embed_tokens.weight (cast from f32/f16 as HF's bf16 load does)
    L{i}.in_norm, L{i}.post_norm, final_norm  [D] bf16 RMSNorm weights
    L{i}.attn.qkv.*            rows q_proj | k_proj | v_proj   [Hq*Dh + 2*Hkv*Dh, D]
    L{i}.attn.o.*              o_proj                  [D, Hq*Dh]
    L{i}.mlp.gate_up.*         rows gate_proj | up_proj [2F, D] (the SwiGLU layout of kernels/linear)
    L{i}.mlp.down.*            down_proj               [D, F]
    lm_head                    [V, D] bf16 — absent when the embeddings are tied (the embed slot is read);
                               a quantized lm_head (`modeld convert --lm-head P`) is refused by name

A linear slot holds one of three formats, decided per slot by what the artifact stores
(docs/interfaces.md "Quantized weight layouts"): `.weight` bf16; `.weight` e4m3 + `.weight_scale` f32
(fp8); `.qweight` u8 + `.scales` + `.mins` f16 (int4 groupwise asymmetric, any even group —
the lossless Q4_1 import is g32). Concatenating parts along rows never changes a row's math, and
every format's per-row tensors concatenate the same way. Loading is strict (STYLE.md habit 8):
missing, leftover, misshapen or mistyped tensors and mixed formats inside one slot each raise a
named error before anything is copied.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from modeld.execution.arena import Arena, BufferSpec
from modeld.execution.errors import (MissingTensorError, TensorDtypeMismatch, TensorShapeMismatch,
                                     UnexpectedTensorError, WeightParityError)
from modeld.execution.sources import TensorSource
from modeld.models.llama.config import LlamaConfig

BF16 = torch.bfloat16
FLOATS = (torch.bfloat16, torch.float16, torch.float32)
PREFIXES = ("model.", "")           # HF checkpoint directory, .mspec (canonical names)
FORMATS = ("bf16", "fp8", "int4")


@dataclass(frozen=True)
class LinearSlot:
    """One linear slot: artifact bases (name without `.weight`) stacked along rows, N x K."""

    slot: str
    parts: tuple[tuple[str, int], ...]   # (base, rows)
    k: int

    @property
    def n(self) -> int:
        return sum(r for _, r in self.parts)


@dataclass(frozen=True)
class LinearWeight:
    """A loaded linear slot: its format and views of its arena buffers (read-only by contract)."""

    fmt: str                                   # "bf16" | "fp8" | "int4"
    tensors: tuple[torch.Tensor, ...]          # (weight,) | (weight, weight_scale) | (qweight, scales, mins)


@dataclass(frozen=True)
class LoadReport:
    arena_bytes: int
    consumed: int                              # artifact tensors read
    formats: dict[str, int]                    # linear slots per format
    casts: tuple[str, ...]                     # slots filled from another dtype (f32 -> bf16)


def linear_slots(c: LlamaConfig) -> list[LinearSlot]:
    D, F = c.hidden, c.intermediate
    out = []
    for i in range(c.layers):
        a, m = f"layers.{i}.self_attn.", f"layers.{i}.mlp."
        out += [LinearSlot(f"L{i}.attn.qkv", ((a + "q_proj", c.q_dim), (a + "k_proj", c.kv_dim), (a + "v_proj", c.kv_dim)), D),
                LinearSlot(f"L{i}.attn.o", ((a + "o_proj", D),), c.q_dim),
                LinearSlot(f"L{i}.mlp.gate_up", ((m + "gate_proj", F), (m + "up_proj", F)), D),
                LinearSlot(f"L{i}.mlp.down", ((m + "down_proj", D),), F)]
    return out


def vector_slots(c: LlamaConfig) -> list[tuple[str, str, tuple[int, ...]]]:
    """(slot, artifact name, shape) of every plain bf16 slot."""
    out = [("embed", "embed_tokens.weight", (c.vocab, c.hidden))]
    for i in range(c.layers):
        out += [(f"L{i}.in_norm", f"layers.{i}.input_layernorm.weight", (c.hidden,)),
                (f"L{i}.post_norm", f"layers.{i}.post_attention_layernorm.weight", (c.hidden,))]
    return out + [("final_norm", "norm.weight", (c.hidden,))]


def _keys(fmt: str) -> tuple[str, ...]:
    return {"bf16": ("weight",), "fp8": ("weight", "weight_scale"), "int4": ("qweight", "scales", "mins")}[fmt]


class LlamaWeights:
    """Plans the layout from the artifact (formats per slot), then owns one weight arena.

    `w[slot]` is a plain bf16 slot; `linear(slot)` a LinearWeight; `lm_head` the logits matrix.
    Raises the strict-loading errors of `modeld.execution.errors` from the constructor.
    """

    def __init__(self, config: LlamaConfig, source: TensorSource, device: torch.device | str) -> None:
        self.config = config
        names = set(source.names())
        self.prefix = next((p for p in PREFIXES if p + "embed_tokens.weight" in names), None)
        if self.prefix is None:
            raise MissingTensorError("artifact has no embed_tokens.weight (as `model.` or bare name)")
        self._src = source
        quantized_head = sorted(n for n in names if n.startswith("lm_head.") and n != "lm_head.weight")
        if quantized_head:  # `modeld convert --lm-head P`: served by the qwen3_5 package only
            raise TensorDtypeMismatch(f"the llama layout serves a bf16 lm_head only; this artifact stores a quantized "
                                      f"lm_head ({', '.join(quantized_head)}): convert with --lm-head bf16")
        self.has_lm_head = "lm_head.weight" in names
        if not self.has_lm_head and not config.tied_embeddings:
            raise MissingTensorError("artifact lacks lm_head.weight and the config does not tie embeddings")
        self.linears = linear_slots(config)
        self.formats = {ls.slot: self._format(ls, names) for ls in self.linears}
        specs, self._plan = [], []   # _plan: (buffer name, [(artifact name, rows)], dtypes accepted)
        for slot, name, shape in vector_slots(config) + ([("lm_head", "lm_head.weight", (config.vocab, config.hidden))]
                                                         if self.has_lm_head else []):
            specs.append(BufferSpec(slot, shape, BF16))
            self._plan.append((slot, [(self._name(name), shape[0])], FLOATS))
        for ls in self.linears:
            fmt = self.formats[ls.slot]
            for key in _keys(fmt):
                dtype, tail = self._buffer_meta(ls, fmt, key)
                specs.append(BufferSpec(f"{ls.slot}.{key}", (ls.n, *tail), dtype))
                accept = FLOATS if fmt == "bf16" else (dtype,)
                self._plan.append((f"{ls.slot}.{key}", [(self._name(f"{b}.{key}"), r) for b, r in ls.parts], accept))
        wanted = {n for _, parts, _ in self._plan for n, _ in parts}
        leftover = sorted(names - wanted)
        if leftover:
            raise UnexpectedTensorError(f"artifact tensors not used by the llama layout: {leftover[:5]}")
        for buf, parts, accept in self._plan:
            spec = next(s for s in specs if s.name == buf)
            for name, rows in parts:
                dtype, shape = source.meta(name)
                if tuple(shape) != (rows, *spec.shape[1:]):
                    raise TensorShapeMismatch(f"{name}: artifact shape {list(shape)}, layout expects {[rows, *spec.shape[1:]]}")
                if dtype not in accept:
                    raise TensorDtypeMismatch(f"{name}: artifact dtype {dtype}, layout accepts {accept}")
        # zeroed: alignment padding is deterministic, so the arena can be hashed or compared whole
        self.arena = Arena.from_specs(specs, device)

    # ------------------------------------------------------------------ planning
    def _name(self, canonical: str) -> str:
        return canonical if canonical == "lm_head.weight" else self.prefix + canonical

    def _format(self, ls: LinearSlot, names: set[str]) -> str:
        fmts = set()
        for base, _ in ls.parts:
            if self._name(base + ".qweight") in names:
                fmts.add("int4")
            elif self._name(base + ".weight") not in names:
                raise MissingTensorError(f"artifact lacks {self._name(base + '.weight')} (or its int4 .qweight)")
            elif self._src.meta(self._name(base + ".weight"))[0] == torch.float8_e4m3fn:
                fmts.add("fp8")
            else:
                fmts.add("bf16")
        if len(fmts) != 1:
            raise TensorDtypeMismatch(f"slot {ls.slot} mixes weight formats {sorted(fmts)} across {[b for b, _ in ls.parts]}")
        return fmts.pop()

    def _buffer_meta(self, ls: LinearSlot, fmt: str, key: str) -> tuple[torch.dtype, tuple[int, ...]]:
        if key == "weight":
            return (torch.float8_e4m3fn if fmt == "fp8" else BF16), (ls.k,)
        if key == "weight_scale":
            return torch.float32, ()
        if key == "qweight":
            return torch.uint8, (ls.k // 2,)
        groups = {self._src.meta(self._name(f"{b}.scales"))[1][1] for b, _ in ls.parts}
        if len(groups) != 1 or ls.k % next(iter(groups)):
            raise TensorShapeMismatch(f"slot {ls.slot}: int4 parts disagree on the group count {sorted(groups)}")
        return torch.float16, (groups.pop(),)

    # ------------------------------------------------------------------ access
    def __getitem__(self, slot: str) -> torch.Tensor:
        return self.arena[slot]

    def linear(self, slot: str) -> LinearWeight:
        fmt = self.formats[slot]
        return LinearWeight(fmt, tuple(self.arena[f"{slot}.{k}"] for k in _keys(fmt)))

    @property
    def lm_head(self) -> torch.Tensor:
        return self.arena["lm_head" if self.has_lm_head else "embed"]

    @property
    def nbytes(self) -> int:
        return self.arena.nbytes

    def profile(self) -> str:
        """"bf16", "fp8", "int4", or "mixed(...)" over the linear slots."""
        used = sorted(set(self.formats.values()))
        return used[0] if len(used) == 1 else "mixed(" + "+".join(used) + ")"

    # ------------------------------------------------------------------ loading
    def load(self, progress=None) -> LoadReport:
        """Copy every buffer from the artifact (mutates the arena only); `progress(name)` per buffer."""
        casts, consumed = [], 0
        release = getattr(self._src, "release", None)  # drop each artifact tensor's pages once copied
        for buf, parts, _ in self._plan:
            dst, row = self.arena[buf], 0
            for name, rows in parts:
                src = self._src.tensor(name)
                if src.dtype != dst.dtype:
                    casts.append(buf)
                dst[row : row + rows].copy_(src.to(dst.dtype))
                del src
                if release is not None:
                    release(name)
                row += rows
                consumed += 1
            if progress is not None:
                progress(buf)
        counts = {f: sum(1 for v in self.formats.values() if v == f) for f in FORMATS}
        return LoadReport(self.arena.nbytes, consumed, counts, tuple(dict.fromkeys(casts)))

    def verify_parity(self) -> int:
        """Every buffer equals its artifact tensors (cast the documented way) byte for byte.
        Returns the number of artifact tensors checked. Raises WeightParityError."""
        checked = 0
        for buf, parts, _ in self._plan:
            dst, row = self.arena[buf], 0
            for name, rows in parts:
                want = self._src.tensor(name).to(dst.dtype)
                got = dst[row : row + rows].to("cpu")
                if not torch.equal(got.view(torch.uint8), want.contiguous().view(torch.uint8)):
                    raise WeightParityError(f"{buf} rows {row}..{row + rows} differ from {name}")
                row += rows
                checked += 1
        return checked
