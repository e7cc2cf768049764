"""One set of weights for both sides of a certification: an HF model's parameters as the engine's
tensor source, the converter's quantization of them, and the dequantized HF reference.

Generating the 27B synthetic checkpoint costs minutes, so it is streamed once into HF's
`Qwen3_5ForCausalLM` (modeld.qualify.synth_stream) and everything else reads those parameters:

* `HFParamSource` — a TensorSource (names(), meta(), tensor()) that answers with the *synth
  checkpoint's* names (`model.language_model.…`, `lm_head.weight`) and hands out HF's parameter
  tensors (on HF's device, no copy). Tensors that synth stores as F32 (A_log and the GDN norm
  weight of the 27B preset) come from `f32_source` — the synth values themselves, not HF's
  bf16-rounded copies — so the engine sees exactly what `modeld convert` would read.
* `QuantizedSource` — the same tensors with every linear the converter quantizes (families
  `_qwen_role == "linear"`; with `lm_head=True` the lm_head too, as `modeld convert --lm-head P`, or with
  `lm_head="fp8"` in fp8 beside int4 linears)
  replaced by its fp8 / int4 components, computed with the converter's own functions
  (modeld.convert.quantize) on the parameter's device.
* `DequantSwap` — turns HF's model into the *dequantized reference* of a profile: every such
  linear W (and, built with `lm_head=True`, the lm_head when `apply(p, lm_head=True)`) is overwritten
  in place by bf16(dequant(quant(W))); `backup()` first copies the
  originals to host memory and `restore()` copies them back, proven by a checksum taken on the
  device before the backup and after the restore.

Mutation: only `DequantSwap.apply/restore` mutate (the HF parameters). Errors: `SwapStateError`
when apply/restore are called out of order or the restore checksum differs; the sources raise
MissingTensorError for unknown names and synth_stream.SynthStreamMismatch for a foreign model.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from modeld.convert.qwen3_5_spec import TEXT_PREFIX, Qwen35Shape, checkpoint_inventory
from modeld.convert.recipe import INT4_GROUP  # the converter's int4 group: the engine must see its layout
from modeld.errors import ModeldError
from modeld.qualify.synth_stream import hf_name, match_parameters


class SwapStateError(ModeldError):
    """DequantSwap used out of order (apply before backup, apply twice) or a restore that does not
    reproduce the original checksum."""


def linear_bases(synth_names) -> list[str]:
    """Synth names (without `.weight`) of the linears `modeld convert` quantizes in fp8/int4."""
    from modeld.convert.families import _qwen_role

    return sorted(n.removesuffix(".weight") for n in synth_names
                  if n.startswith(TEXT_PREFIX) and _qwen_role(n.removeprefix(TEXT_PREFIX)) == "linear")


class HFParamSource:
    """TensorSource over an HF Qwen3_5ForCausalLM's parameters, named like the synth checkpoint.

    `f32_source` supplies the tensors synth stores as F32 (anything with `.tensor(name)`, e.g.
    bench/engine_qwen3_5.SynthSource). Raises SynthStreamMismatch when the model does not match
    `shape`, MissingTensorError for unknown names."""

    def __init__(self, model, shape: Qwen35Shape, f32_source) -> None:
        self.specs = {s.name: s for s in checkpoint_inventory(shape, include_mtp=False)}
        match_parameters(model, shape)
        self.params = dict(model.named_parameters())
        self.f32_source = f32_source

    def names(self) -> list[str]:
        return sorted(self.specs)

    def _spec(self, name: str):
        from modeld.execution.errors import MissingTensorError

        spec = self.specs.get(name)
        if spec is None:
            raise MissingTensorError(f"the synth inventory has no tensor {name!r}")
        return spec

    def meta(self, name: str):
        import torch

        spec = self._spec(name)
        return (torch.float32 if spec.dtype == "F32" else torch.bfloat16), tuple(spec.shape)

    def tensor(self, name: str):
        spec = self._spec(name)
        if spec.dtype == "F32":
            return self.f32_source.tensor(name)
        return self.params[hf_name(name)].detach()


def quantize_parts(w, profile: str, name: str, group: int = INT4_GROUP) -> dict:
    """The converter's components of one linear W [N, K] on W's device: fp8 {weight, weight_scale}
    or int4 {qweight, scales, mins}. Raises the converter's Quantization*Error."""
    from modeld.convert import quantize as Q

    if profile == "fp8":
        q, sc = Q.quantize_fp8(w, name, out_device=w.device)
        return {"weight": q, "weight_scale": sc}
    if profile == "int4":
        qw, sc, mn = Q.quantize_int4(w, group, name, out_device=w.device)
        return {"qweight": qw, "scales": sc, "mins": mn}
    raise ValueError(f"unknown quantized profile {profile!r}")


def dequantize_parts(parts: dict):
    """float32 W_hat [N, K] from `quantize_parts` output (the layout's exact inverse)."""
    from modeld.convert import quantize as Q

    if "weight_scale" in parts:
        return Q.dequantize_fp8(parts["weight"], parts["weight_scale"])
    return Q.dequantize_int4(parts["qweight"], parts["scales"], parts["mins"])


class QuantizedSource:
    """`base` with every converter-quantized linear stored as its fp8 / int4 components (the
    bytes `modeld convert --profile P` writes), quantized lazily on `device` (default: the base
    tensor's; a CPU source such as bench/engine_qwen3_5.py's SynthSource passes "cuda", since the
    converter's functions are device-exact and 16 CPU cores are slow for 27B).
    A small LRU keeps the components of the last few linears, because the engine asks for one
    component of every part of a fused slot before the next component."""

    def __init__(self, base, profile: str, group: int = INT4_GROUP, keep: int = 6, device=None,
                 lm_head: bool | str = False) -> None:
        """`lm_head`: False / "bf16" keeps it as stored, True quantizes it in `profile`'s format, "fp8" / "int4" in
        that one (`modeld convert --lm-head`)."""
        if profile not in ("fp8", "int4"):
            raise ValueError(f"unknown quantized profile {profile!r}")
        if lm_head not in (False, True, "bf16", "fp8", "int4"):
            raise ValueError(f"unknown lm_head format {lm_head!r}")
        head = profile if lm_head is True else (lm_head if lm_head in ("fp8", "int4") else None)
        self.base, self.profile, self.group, self.keep, self.device = base, profile, group, keep, device
        self.formats = {b: profile for b in linear_bases(base.names())} | ({"lm_head": head} if head else {})
        self.linear = set(self.formats)
        comps = {"fp8": ("weight", "weight_scale"), "int4": ("qweight", "scales", "mins")}
        self._names = sorted([n for n in base.names() if n.removesuffix(".weight") not in self.linear]
                             + [f"{b}.{c}" for b, f in self.formats.items() for c in comps[f]])
        self._cache: OrderedDict[str, dict] = OrderedDict()

    def names(self) -> list[str]:
        return self._names

    def _split(self, name: str):
        b, _, comp = name.rpartition(".")
        return (b, comp) if b in self.linear else (None, None)

    def parts(self, base: str) -> dict:
        if base not in self._cache:
            w = self.base.tensor(base + ".weight")
            if self.device is not None:
                w = w.to(self.device)
            self._cache[base] = quantize_parts(w, self.formats[base], base, self.group)
            while len(self._cache) > self.keep:
                self._cache.popitem(last=False)
        self._cache.move_to_end(base)
        return self._cache[base]

    def meta(self, name: str):
        import torch

        b, comp = self._split(name)
        if b is None:
            return self.base.meta(name)
        n, k = self.base.meta(b + ".weight")[1]
        shapes = {"weight": ((n, k), torch.float8_e4m3fn), "weight_scale": ((n,), torch.float32),
                  "qweight": ((n, k // 2), torch.uint8), "scales": ((n, k // self.group), torch.float16),
                  "mins": ((n, k // self.group), torch.float16)}
        shape, dtype = shapes[comp]
        return dtype, shape

    def tensor(self, name: str):
        b, comp = self._split(name)
        return self.base.tensor(name) if b is None else self.parts(b)[comp]

    def clear(self) -> None:
        """Drop the cached components (frees their device memory)."""
        self._cache.clear()


def tensor_checksum(t) -> tuple[int, int]:
    """(sum, sum of squares) of the tensor's 16-bit words as int64, computed on its device."""
    import torch

    x = t.detach().reshape(-1).view(torch.int16).to(torch.int64)
    return int(x.sum()), int((x * x).sum())


class DequantSwap:
    """Swap an HF model's quantizable linears for their dequantized profile and back.

    Order: `backup()` once, then per profile `apply(p)` … `restore()`. Mutates the HF
    parameters (apply/restore) and holds a host copy of the originals (≈ 50 GB at 27B)."""

    def __init__(self, model, shape: Qwen35Shape, group: int = INT4_GROUP, lm_head: bool = False) -> None:
        match_parameters(model, shape)
        params = dict(model.named_parameters())
        names = [s.name for s in checkpoint_inventory(shape, include_mtp=False)]
        bases = linear_bases(names) + (["lm_head"] if lm_head else [])   # backed up (and restored) once
        self.targets = {hf_name(b + ".weight"): params[hf_name(b + ".weight")] for b in bases}
        self.head = hf_name("lm_head.weight") if lm_head else None
        self.group = group
        self.backup_cpu: dict | None = None
        self.original: str | None = None
        self.applied: str | None = None

    def checksum(self) -> str:
        """sha256 over every target's (sum, sum of squares) — equal iff (practically) unchanged."""
        h = hashlib.sha256()
        for name in sorted(self.targets):
            h.update(f"{name}:{tensor_checksum(self.targets[name])}".encode())
        return h.hexdigest()

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.targets.values())

    def backup(self) -> str:
        """Checksum the originals on the device, then copy them to host memory. Returns the checksum."""
        if self.applied is not None:
            raise SwapStateError("backup() after apply(): the originals are already overwritten")
        self.original = self.checksum()
        self.backup_cpu = {n: p.detach().to("cpu", copy=True) for n, p in self.targets.items()}  # copy: a CPU model would alias
        return self.original

    def apply(self, profile: str, lm_head: bool | str = False) -> int:
        """Overwrite every layer linear W (and the lm_head if `lm_head`: True in `profile`'s format, "fp8" /
        "int4" in that one) by bf16(dequant(quant_format(W))). Returns the count. Raises SwapStateError unless
        backed up and currently original, or for `lm_head` on a swap built without it."""
        import torch

        lm_head = False if lm_head == "bf16" else lm_head
        if self.backup_cpu is None or self.applied is not None:
            raise SwapStateError(f"apply({profile!r}) needs backup() first and no swap in place (now: {self.applied})")
        if lm_head and self.head is None:
            raise SwapStateError("apply(lm_head=True) needs a DequantSwap built with lm_head=True")
        head_fmt = profile if lm_head is True else lm_head
        todo = {n: p for n, p in self.targets.items() if lm_head or n != self.head}
        with torch.no_grad():
            for name, p in todo.items():
                fmt = head_fmt if name == self.head else profile
                p.copy_(dequantize_parts(quantize_parts(p.detach(), fmt, name, self.group)).to(p.dtype))
        self.applied = profile + (f"+lm_head:{head_fmt}" if lm_head else "")
        return len(todo)

    def restore(self) -> str:
        """Copy the originals back and prove it by checksum. Returns the checksum.
        Raises SwapStateError when there is no backup or the checksum differs."""
        import torch

        if self.backup_cpu is None:
            raise SwapStateError("restore() without backup()")
        with torch.no_grad():
            for name, p in self.targets.items():
                p.copy_(self.backup_cpu[name])
        got = self.checksum()
        if got != self.original:
            raise SwapStateError(f"restored weights checksum {got[:16]} != original {self.original[:16]}")
        self.applied = None
        return got

    def drop_backup(self) -> None:
        """Free the host copy (no restore possible afterwards)."""
        self.backup_cpu = None
