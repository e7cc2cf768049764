"""A CPU test binding: the reference kernels with each weight's fp32 dequantisation done once.

`kernels/linear/reference.py` dequantises (int4, fp8) or widens (bf16) the whole weight on every
call — the spec, but ~100 ms per int4 call on a loaded 2-core CI box, i.e. 10+ s per SmolLM2
token. This binding computes *the same* `x.float() @ W32.T` with `W32` = the reference's own
`dequantize_*` / `.float()` of that weight, cached by storage pointer (weights live in the
engine's arena and never move). Outputs are bit-identical to the reference
(test_llama_engine.py::test_cached_binding_is_bit_identical proves it per format).
"""

from __future__ import annotations

import dataclasses
import types

import torch

from modeld.execution.bindings import reference_kernels
from modeld.kernels.linear import reference as lin
from modeld.kernels.linear.quant import dequantize_fp8, dequantize_int4


def _cached_linear_module() -> types.ModuleType:
    cache: dict[tuple, torch.Tensor] = {}

    def w32(kind, *ts):
        key = (kind,) + tuple((t.data_ptr(), tuple(t.shape)) for t in ts)
        got = cache.get(key)
        if got is None:
            got = {"bf16": lambda: ts[0].float(), "fp8": lambda: dequantize_fp8(*ts),
                   "int4": lambda: dequantize_int4(*ts)}[kind]()
            cache[key] = got
        return got

    m = types.ModuleType("cached_reference_linear")
    m.linear = lambda x, weight, out_dtype=torch.bfloat16: lin._matmul(x, w32("bf16", weight), out_dtype)
    m.linear_fp8 = lambda x, weight, weight_scale, out_dtype=torch.bfloat16: lin._matmul(
        x, w32("fp8", weight, weight_scale), out_dtype)
    m.linear_int4 = lambda x, qweight, scales, mins, out_dtype=torch.bfloat16: lin._matmul(
        x, w32("int4", qweight, scales, mins), out_dtype)
    m.swiglu_linear = lambda x, weight, out_dtype=torch.bfloat16: lin._swiglu(x, w32("bf16", weight), out_dtype)
    m.swiglu_linear_fp8 = lambda x, weight, weight_scale, out_dtype=torch.bfloat16: lin._swiglu(
        x, w32("fp8", weight, weight_scale), out_dtype)
    m.swiglu_linear_int4 = lambda x, qweight, scales, mins, out_dtype=torch.bfloat16: lin._swiglu(
        x, w32("int4", qweight, scales, mins), out_dtype)
    m.cache = cache
    return m


def cached_reference_kernels():
    """A fresh KernelSet (its own cache): references, linear ops dequantising once per weight."""
    ks = reference_kernels()
    return dataclasses.replace(ks, name="reference", linear=_cached_linear_module())
