"""Test-only kernel shims that round exactly where HF's bf16 modules round (eager attention,
separate gate/up projections). The shipped kernels round once in fp32 instead (documented in
their references); with these shims bound, the engine's schedule can be checked against HF
layer by layer with (almost) bit-exact results, so any schedule bug shows up as a large error.
"""

from __future__ import annotations

import dataclasses
import types

import torch
import torch.nn.functional as F

from modeld.execution.bindings import KernelSet
from modeld.kernels.attention import reference as A
from modeld.kernels.linear import reference as L


def _swiglu_hf(x, weight, out_dtype=torch.bfloat16):
    f = weight.shape[0] // 2
    y = L.linear(x, weight)  # gate and up rounded to bf16, as two HF nn.Linear calls
    return F.silu(y[:, :f]) * y[:, f:]


def _attend(q, keys, values, q_pos, scale):
    group = q.shape[1] // keys.shape[1]
    kf, vf = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    scores = torch.einsum("thd,lhd->htl", q, kf) * scale  # bf16, as eager_attention_forward
    future = torch.arange(keys.shape[0], device=q.device)[None, :] > q_pos[:, None]
    p = torch.softmax(scores.float().masked_fill(future[None], float("-inf")), dim=-1).to(q.dtype)
    return torch.einsum("htl,lhd->thd", p, vf)  # bf16 p @ v


def _attn_module():
    mod = types.ModuleType("hf_rounding_attention")

    def wrap(fn):
        def run(*args, **kw):
            saved = A._attend, A._gate
            A._attend, A._gate = _attend, lambda o, gate: o if gate is None else o * torch.sigmoid(gate)
            try:
                return fn(*args, **kw)
            finally:
                A._attend, A._gate = saved
        return run

    mod.attention_prefill = wrap(A.attention_prefill)
    mod.attention_decode = wrap(A.attention_decode)
    return mod


def hf_rounding(ks: KernelSet) -> KernelSet:
    lin = types.ModuleType("hf_rounding_linear")
    for name in L.__all__:
        setattr(lin, name, getattr(L, name))
    lin.swiglu_linear = _swiglu_hf
    return dataclasses.replace(ks, name="reference+hf-rounding", linear=lin, attention=_attn_module())
