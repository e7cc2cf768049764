"""Run on the GPU by test_rounding.py in a child process: every kernel family that rounds through `_tl.round_to`
(rms norms, gated norm, rope with the q/k norm, conv1d, the GDN v2 prefill with its output norm after it and fused
into its output pass, the final norm + logits, int4 dequantization) plus `round_to` itself on edge values, on inputs
fixed by a seed. Saves {name: output} with torch.save to argv[1]. `$MODELD_ROUND_BITS` is read when `_tl` is
imported, so the parent runs this once per setting and compares the files: the GPU's convert and the bit trick must
agree bit for bit."""

from __future__ import annotations

import os
import sys

import torch
import triton
import triton.language as tl

from modeld.kernels._tl import round_to


@triton.jit
def _round_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(y_ptr + offs, round_to(x, tl.bfloat16), mask=offs < n)


def edge_values(gen: torch.Generator) -> torch.Tensor:
    """fp32 values at and next to every bf16 rounding tie, subnormals, the overflow edge, ±inf, ±0, and random."""
    ties = torch.randint(0, 1 << 16, (4096,), generator=gen, dtype=torch.int32) << 16 | 0x8000   # exact ties
    near = torch.cat([ties - 1, ties + 1])
    special = torch.tensor([0x00000000, 0x80000000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F7FFF, 0x7F7F8000, 0x7F800000,
                            0xFF800000, 0x00000001, 0x00008000, 0x00018000, 0x007FFFFF, 0x80008000],
                           dtype=torch.int64).to(torch.int32)
    bits = torch.cat([ties, near, special])
    finite = bits.view(torch.float32)
    finite = finite[~torch.isnan(finite)]
    return torch.cat([finite, torch.randn(8192, generator=gen) * 10])


def run(path: str) -> None:
    from modeld.kernels.conv1d import triton as conv
    from modeld.kernels.gated_rmsnorm import triton as gnorm
    from modeld.kernels.gdn import triton as gdn
    from modeld.kernels.linear import dequant
    from modeld.kernels.logits import triton as logits
    from modeld.kernels.rmsnorm import triton as norm
    from modeld.kernels.rope import triton as rope

    gen = torch.Generator().manual_seed(2029)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).bfloat16().cuda()

    out = {}
    x32 = edge_values(gen).cuda()
    y = torch.empty(x32.shape, dtype=torch.bfloat16, device="cuda")
    _round_kernel[(triton.cdiv(x32.numel(), 1024),)](x32, y, x32.numel(), BLOCK=1024)
    out["round_to"], out["round_to_torch"] = y, x32.bfloat16()

    x, res, w = randn(300, 5120, scale=3), randn(300, 5120), randn(5120, scale=0.1)
    out["rms_norm"] = norm.rms_norm(x, w, 1e-6, True)
    added = norm.add_rms_norm(x, res, w, 1e-6, True)
    out["add_rms_norm"], out["add_rms_norm_residual"] = added.out, added.residual
    z = randn(300, 48, 128, scale=2)
    out["gated_rms_norm"] = gnorm.gated_rms_norm(randn(300, 48, 128), z, randn(128, scale=0.3), 1e-6)
    q = randn(300, 24, 256)
    pos = torch.arange(300, device="cuda") + 1000
    inv = rope.rope_inv_freq(64, 1e7, "cuda")
    out["apply_rope"] = rope.apply_rope(q, pos, inv)
    out["qk_norm_rope"] = rope.qk_norm_rope(q, randn(256, scale=0.1), pos, inv, 1e-6)
    cx, cw = randn(700, 10240), randn(10240, 4, scale=0.5)
    state = randn(3, 10240)
    out["conv_prefill"], out["conv_state"] = conv.causal_conv1d_prefill(cx, cw, state), state
    dstate = randn(4, 3, 10240)
    out["conv_decode"], out["conv_decode_state"] = conv.causal_conv1d_decode(randn(4, 10240), cw, dstate), dstate
    T, Hk, Hv, D = 200, 4, 12, 128
    qg, kg, vg = randn(T, Hk, D), randn(T, Hk, D), randn(T, Hv, D)
    a, b = randn(T, Hv, scale=2), randn(T, Hv, scale=2)
    A_log = torch.log(torch.rand(Hv, generator=gen) * 15 + 1).cuda()
    dt_bias = randn(Hv, scale=0.5)
    s = (torch.randn(Hv, D, D, generator=gen) * 0.3).cuda()
    gate = (randn(T, Hv, D, scale=2), randn(D, scale=0.3) + 1, 1e-6)
    s_fused = s.clone()
    out["gdn_prefill_gated"], out["gdn_state"] = gdn.gdn_prefill(qg, kg, vg, a, b, A_log, dt_bias, s, gate=gate), s
    os.environ[gdn.FUSED_NORM_ENV] = "1"   # the norm in the output pass's epilogue (read per call)
    out["gdn_prefill_fused_norm"] = gdn.gdn_prefill(qg, kg, vg, a, b, A_log, dt_bias, s_fused, gate=gate)
    del os.environ[gdn.FUSED_NORM_ENV]
    # the decode-path launches (session 33: the convert moved the 27B engine's short-prompt + decode logits while every
    # prefill-shaped family above agreed): the GDN decode kernel at B 1 and 4, one-row norms, RoPE at T 1
    for B in (1, 4):
        dq, dk, dv = randn(B, Hk, D), randn(B, Hk, D), randn(B, Hv, D)
        dstate_g = (torch.randn(B, Hv, D, D, generator=gen) * 0.3).cuda()
        out[f"gdn_decode_b{B}"] = gdn.gdn_decode(dq, dk, dv, randn(B, Hv, scale=2), randn(B, Hv, scale=2), A_log,
                                                 dt_bias, dstate_g)
        out[f"gdn_decode_b{B}_state"] = dstate_g
    out["rms_norm_row"] = norm.rms_norm(x[:1], w, 1e-6, True)
    out["add_rms_norm_row"] = norm.add_rms_norm(x[:1], res[:1], w, 1e-6, True).out
    out["gated_rms_norm_row"] = gnorm.gated_rms_norm(randn(1, 48, 128), z[:1], randn(128, scale=0.3), 1e-6)
    out["qk_norm_rope_row"] = rope.qk_norm_rope(q[:1], randn(256, scale=0.1), pos[:1], inv, 1e-6)
    out["final_norm_logits"] = logits.final_norm_logits(randn(3, 5120, scale=3), randn(5120, scale=0.1),
                                                        randn(4096, 5120, scale=0.02), 1e-6)
    qweight = torch.randint(0, 256, (512, 1024), generator=gen, dtype=torch.uint8).cuda()
    scales = (torch.rand(512, 16, generator=gen) * 0.02).half().cuda()
    mins = (torch.randn(512, 16, generator=gen) * 0.1).half().cuda()
    out["int4_to_bf16"] = dequant.int4_to_bf16(qweight, scales, mins)
    torch.save({k: v.cpu() for k, v in out.items()}, path)


if __name__ == "__main__":
    run(sys.argv[1])
