"""The llama forward pass over bound kernels: one code path for prefill (T tokens of one
sequence) and decode (one token for each of B sequences). Rows N = T (prefill) or B (decode).

Per layer (oracle/llama.py):  h += attn(norm_in(h));  h += mlp(norm_post(h))
The residual add of each sublayer is fused into the next norm (`add_rms_norm`), so h is rounded to
bf16 exactly where HF rounds it. Logits: the plain RMSNorm, then `linear` with an fp32 output
(the `logits` op's fused kernel is the zero-centred qwen3_5 norm, not llama's; HF rounds logits to
bf16, we keep fp32 so the sampler sees no artificial ties).

Every linear is bound once, at construction, to the kernel of its slot's format (bf16, fp8, int4):
the schedule never branches on a format while running. Mutates only the KV buffers of the slots
it runs (at the written positions).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from modeld.execution.arena import Arena
from modeld.execution.bindings import KernelSet
from modeld.execution.step import StepContext  # re-exported: tests and engines import it from here
from modeld.models.llama.config import LlamaConfig
from modeld.models.llama.weights import LinearWeight, LlamaWeights

Linear = Callable[[torch.Tensor], torch.Tensor]


@dataclass
class Probe:
    """Optional per-layer capture and injection (parity tests; None in serving; eager only).

    `layer_in(i, h) -> h` sees (and may replace) the residual input of layer i [N, D];
    `layer(i, h)` sees layer i's output [N, D]; `mixer(i, out)` sees the attention output.
    """

    layer_in: Callable[[int, torch.Tensor], torch.Tensor] | None = None
    layer: Callable[[int, torch.Tensor], None] | None = None
    mixer: Callable[[int, torch.Tensor], None] | None = None


def bind_linear(ks: KernelSet, lw: LinearWeight, swiglu: bool = False,
                out_dtype: torch.dtype = torch.bfloat16) -> Linear:
    """x [M, K] -> y [M, N] (or [M, F] for SwiGLU) with the kernel of lw's format, bound now."""
    op = ks.linear
    fn = {("bf16", False): op.linear, ("fp8", False): op.linear_fp8, ("int4", False): op.linear_int4,
          ("bf16", True): op.swiglu_linear, ("fp8", True): op.swiglu_linear_fp8,
          ("int4", True): op.swiglu_linear_int4}[(lw.fmt, swiglu)]
    ts = lw.tensors
    return lambda x: fn(x, *ts, out_dtype=out_dtype)


class LlamaForward:
    """Binds config, weights, state arena and kernels; `__call__` runs the whole stack."""

    def __init__(self, config: LlamaConfig, weights: LlamaWeights, state: Arena, kernels: KernelSet) -> None:
        self.c, self.w, self.s, self.ks = config, weights, state, kernels
        self.scale = config.head_dim ** -0.5
        self.inv_freq = kernels.rope.rope_inv_freq(config.head_dim, config.rope_theta, state.device)
        self.qkv = [bind_linear(kernels, weights.linear(f"L{i}.attn.qkv")) for i in range(config.layers)]
        self.o = [bind_linear(kernels, weights.linear(f"L{i}.attn.o")) for i in range(config.layers)]
        self.gate_up = [bind_linear(kernels, weights.linear(f"L{i}.mlp.gate_up"), swiglu=True)
                        for i in range(config.layers)]
        self.down = [bind_linear(kernels, weights.linear(f"L{i}.mlp.down")) for i in range(config.layers)]
        lm_head = weights.lm_head
        self.lm_head = lambda x: kernels.linear.linear(x, lm_head, out_dtype=torch.float32)

    def attention(self, i: int, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """GQA attention of layer i. x [N, D] bf16 (normed) -> [N, D]. Writes KV at the rows' positions."""
        c, ks = self.c, self.ks
        N, Dh, qd, kvd = x.shape[0], c.head_dim, c.q_dim, c.kv_dim
        qkv = self.qkv[i](x)                                    # [N, Hq*Dh + 2*Hkv*Dh]
        q = qkv[:, :qd].view(N, c.heads, Dh)
        k = qkv[:, qd : qd + kvd].view(N, c.kv_heads, Dh)
        v = qkv[:, qd + kvd :].view(N, c.kv_heads, Dh)
        q = ks.rope.apply_rope(q, ctx.positions, self.inv_freq)  # full-width half-split RoPE
        k = ks.rope.apply_rope(k, ctx.positions, self.inv_freq)
        kc, vc = self.s[f"kv.{i}.k"], self.s[f"kv.{i}.v"]       # [B, S, Hkv, Dh]
        if ctx.decode:
            o = ks.attention.attention_decode(q, k, v, kc, vc, ctx.cache_lens, self.scale)
        else:
            o = ks.attention.attention_prefill(q, k, v, kc[ctx.slot], vc[ctx.slot], ctx.start, self.scale)
        return self.o[i](o.reshape(N, qd))                      # [N, D]

    def __call__(self, ids: torch.Tensor, ctx: StepContext, *, last_only: bool = True,
                 probe: Probe | None = None) -> torch.Tensor:
        """Run every layer on ids [N]; returns fp32 logits [1, V] (prefill, last_only) or [N, V]."""
        c, w, ks = self.c, self.w, self.ks
        h = ks.embedding.embedding(ids, w["embed"])             # [N, D] bf16
        x = None
        for i in range(c.layers):
            if probe is not None and probe.layer_in is not None:
                got = probe.layer_in(i, h)
                if got is not h:
                    h, x = got, None
            if x is None:
                x = ks.rmsnorm.rms_norm(h, w[f"L{i}.in_norm"], c.eps, False)
            m = self.attention(i, x, ctx)
            if probe is not None and probe.mixer is not None:
                probe.mixer(i, m)
            r = ks.rmsnorm.add_rms_norm(m, h, w[f"L{i}.post_norm"], c.eps, False)
            x, h = r.out, r.residual
            m = self.down[i](self.gate_up[i](x))                # SwiGLU MLP [N, D]
            if i + 1 < c.layers and (probe is None or probe.layer_in is None):
                r = ks.rmsnorm.add_rms_norm(m, h, w[f"L{i + 1}.in_norm"], c.eps, False)
                x, h = r.out, r.residual
            else:
                if i + 1 == c.layers and last_only and not ctx.decode:
                    m, h = m[-1:], h[-1:]
                h, x = m + h, None                              # the residual add, rounded to bf16 as HF's
            if probe is not None and probe.layer is not None:
                probe.layer(i, h)
        xn = ks.rmsnorm.rms_norm(h, w["final_norm"], c.eps, False)
        return self.lm_head(xn)                                 # [N or 1, V] fp32
