"""The qwen3_5 forward pass over bound kernels: one code path for prefill (T tokens of one
sequence) and decode (one token for each of B sequences). Rows N = T (prefill) or B (decode).

Per layer (MODEL-qwen3_5.md):  h += mixer(norm_in(h));  h += mlp(norm_post(h))
The residual add of each sublayer is fused into the next norm (`add_rms_norm`), so the hidden
state h is rounded to bf16 exactly where HF rounds it. Every op goes through `ks.<op>`; the only
tensor code here is views/reshapes into the projection outputs (the gated norm reads the GDN gate z in place, a
column slice) and the final residual add.

Padded prefill (StepContext `valid` / `pad_rows`: the engine's captured suffix bucket): the pad rows' b and a
are set to -inf, so beta = 0 and g = 0 and the GDN recurrence skips them exactly; the conv state is put back to
the last real inputs (`_conv_prefill_padded`); attention reads its start from the positions on the device
(`attention_prefill_at`; pad rows write KV past the real length, which nothing reads before it is overwritten);
the logits are the last real row's.

Prefill snapshots (StepContext `snapshots`): each GDN layer hands the engine its conv and recurrent state after
each of those row offsets (the conv's as a window of its inputs, the recurrence's from `gdn_prefill_checkpointed`),
so a long prefill piece can still be checkpointed every `checkpoint_every` positions; every op sees the whole
piece (the fused output norm's opt-in path runs the recurrence in segments).

Mutates only the state buffers passed in the context (KV at the written positions, conv and
recurrent state of the slots it runs).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from modeld.execution.arena import Arena
from modeld.execution.bindings import KernelSet
from modeld.execution.step import StepContext  # re-exported: tests and engines import it from here
from modeld.models.qwen3_5.config import FULL, Qwen35Config
from modeld.models.qwen3_5.weights import Qwen35Weights


@dataclass
class Probe:
    """Optional per-layer capture and injection (parity tests; None in serving).

    `mixer(i, out) -> out` sees (and may replace) layer i's mixer output [N, D];
    `layer(i, h)` sees layer i's output hidden state [N, D]. Both run eagerly (no graphs).
    """

    mixer: Callable[[int, torch.Tensor], torch.Tensor] | None = None
    layer: Callable[[int, torch.Tensor], None] | None = None


class Qwen35Forward:
    """Binds config, weights, state arena and kernels; `__call__` runs the whole stack."""

    def __init__(self, config: Qwen35Config, weights: Qwen35Weights, state: Arena, kernels: KernelSet) -> None:
        self.c, self.w, self.s, self.ks = config, weights, state, kernels
        self.scale = config.head_dim ** -0.5
        self.inv_freq = kernels.rope.rope_inv_freq(config.rotary_dim, config.rope_theta, state.device)
        self.lin = self._bind_linears()
        self.logits = self._bind_logits()

    def _bind_linears(self) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
        """slot -> y = f(x), bound once for the weights' profile (no per-call dispatch)."""
        w, L = self.w, self.ks.linear
        out: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}
        for i, kind in enumerate(self.c.layer_types):
            slots = ("attn.qkv", "attn.o") if kind == FULL else ("gdn.in_proj", "gdn.out")
            for name in slots + ("mlp.gate_up", "mlp.down"):
                slot = f"L{i}.{name}"
                swiglu = name == "mlp.gate_up"
                prof = w.slot_profiles[slot][0]
                if prof == "bf16":
                    fn, kw = (L.swiglu_linear if swiglu else L.linear), {"weight": w[slot]}
                elif prof == "fp8":
                    fn = L.swiglu_linear_fp8 if swiglu else L.linear_fp8
                    kw = {"weight": w[slot + ".weight"], "weight_scale": w[slot + ".weight_scale"]}
                else:
                    fn = L.swiglu_linear_int4 if swiglu else L.linear_int4
                    kw = {"qweight": w[slot + ".qweight"], "scales": w[slot + ".scales"], "mins": w[slot + ".mins"]}
                out[slot] = functools.partial(fn, **kw)
            if kind != FULL:
                out[f"L{i}.gdn.ba"] = functools.partial(L.linear, weight=w[f"L{i}.gdn.ba"])  # bf16 in every profile
        return out

    def _bind_logits(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """h [M, D] -> fp32 logits [M, V]: final norm + lm_head, bound once for the head's format."""
        w, L, eps = self.w, self.ks.logits, self.c.eps
        norm, prof = w["final_norm"], w.head_profile[0]
        if prof == "fp8":
            q, s = w["lm_head.weight"], w["lm_head.weight_scale"]
            return lambda h: L.final_norm_logits_fp8(h, norm, q, s, eps)
        if prof == "int4":
            qw, sc, mn = w["lm_head.qweight"], w["lm_head.scales"], w["lm_head.mins"]
            return lambda h: L.final_norm_logits_int4(h, norm, qw, sc, mn, eps)
        head = w["lm_head"]
        return lambda h: L.final_norm_logits(h, norm, head, eps)

    # ---------------------------------------------------------------- mixers
    def attention(self, i: int, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """Gated GQA attention of layer i. x [N, D] bf16 (normed) -> [N, D]. Writes KV at the rows' positions."""
        c, w, ks = self.c, self.w, self.ks
        N, Dh, qd, kvd = x.shape[0], c.head_dim, c.q_dim, c.kv_dim
        qkv = self.lin[f"L{i}.attn.qkv"](x)  # [N, 2*Hq*Dh + 2*Hkv*Dh]
        qg = qkv[:, : 2 * qd].view(N, c.heads, 2 * Dh)  # per head: [query Dh | gate Dh]
        q, gate = qg[..., :Dh], qg[..., Dh:]
        k = qkv[:, 2 * qd : 2 * qd + kvd].view(N, c.kv_heads, Dh)
        v = qkv[:, 2 * qd + kvd :].view(N, c.kv_heads, Dh)
        q = ks.rope.qk_norm_rope(q, w[f"L{i}.attn.q_norm"], ctx.positions, self.inv_freq, c.eps)
        k = ks.rope.qk_norm_rope(k, w[f"L{i}.attn.k_norm"], ctx.positions, self.inv_freq, c.eps)
        kc, vc = self.s[f"kv.{i}.k"], self.s[f"kv.{i}.v"]  # [B, S, Hkv, Dh]
        if ctx.decode:
            o = ks.attention.attention_decode(q, k, v, kc, vc, ctx.cache_lens, self.scale, gate)
        elif ctx.valid is not None:  # padded bucket: the start is read from the positions on the device
            o = ks.attention.attention_prefill_at(q, k, v, kc[ctx.slot], vc[ctx.slot], ctx.positions, self.scale, gate)
        else:
            o = ks.attention.attention_prefill(q, k, v, kc[ctx.slot], vc[ctx.slot], ctx.start, self.scale, gate)
        return self.lin[f"L{i}.attn.o"](o.reshape(N, qd))  # [N, D]

    def gdn(self, i: int, x: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """Gated DeltaNet of layer i. x [N, D] bf16 (normed) -> [N, D]. Updates conv and recurrent state."""
        c, w, ks = self.c, self.w, self.ks
        N, C, vd, Hv = x.shape[0], c.conv_dim, c.value_dim, c.lin_v_heads
        proj = self.lin[f"L{i}.gdn.in_proj"](x)  # [N, C + Hv*Dv]
        ba = self.lin[f"L{i}.gdn.ba"](x)  # [N, 2*Hv]
        mixed = proj[:, :C]
        z = proj[:, C:].view(N, Hv, c.lin_v_dim)  # read in place by the gated norm (token stride C + Hv*Dv)
        if ctx.pad_rows is not None:  # padded bucket: b = a = -inf gives the pad rows beta = 0 and g = 0, no update
            ba = ba.masked_fill(ctx.pad_rows[:, None], float("-inf"))
        b, a = ba[:, :Hv], ba[:, Hv:]
        conv_state, rec = self.s[f"gdn.{i}.conv"], self.s[f"gdn.{i}.rec"]  # [B, W-1, C], [B, Hv, Dk, Dv]
        if ctx.decode:
            y = ks.conv1d.causal_conv1d_decode(mixed, w[f"L{i}.gdn.conv"], conv_state)  # [N, C]
            o = self._gdn_core(i, y, a, b, rec, decode=True)  # [N, Hv, Dv]
        elif ctx.valid is not None:
            y = self._conv_prefill_padded(i, mixed, conv_state[ctx.slot], ctx)
            o = self._gdn_core(i, y, a, b, rec[ctx.slot], decode=False)
        else:
            # the conv over the whole piece (its state after each snapshot offset is a window of its inputs); the
            # GDN writes its rows into one output buffer (no concatenation copy: 9 ms of the cold 32k in session 28's
            # kernel table)
            self._conv_with_snapshots(i, mixed, ctx)
            y = ks.conv1d.causal_conv1d_prefill(mixed, w[f"L{i}.gdn.conv"], conv_state[ctx.slot])
            o = torch.empty((N, Hv, c.lin_v_dim), dtype=mixed.dtype, device=mixed.device)
            if ks.gdn.fuses_gated_norm():
                # the output norm fused into the GDN's output pass (opt-in, kernels/gdn/triton.py FUSED_NORM_ENV):
                # one prefill per snapshot segment with its gate rows (the buffer holds the normed output); the
                # recurrent state after each is what the engine checkpoints there (the kernel carries it exactly)
                r0 = 0
                for r1 in (*ctx.snapshots, N):
                    gate = (z[r0:r1], w[f"L{i}.gdn.norm"], c.eps)
                    self._gdn_core(i, y[r0:r1], a[r0:r1], b[r0:r1], rec[ctx.slot], decode=False, out=o[r0:r1],
                                   gate=gate)
                    if r1 < N:
                        ctx.snapshot(r1, f"gdn.{i}.rec", rec[ctx.slot])
                    r0 = r1
                return self.lin[f"L{i}.gdn.out"](o.view(N, vd))  # [N, D]
            # the recurrence as one call that also keeps the state at the offsets (kernels/gdn: in its state pass
            # where it can, kernels/gdn/triton.py SNAPSHOTS_ENV)
            q, k, v = self._qkv(y)
            ends = ctx.snapshots
            snaps = torch.empty((len(ends), *rec.shape[1:]), dtype=rec.dtype, device=rec.device) if ends else None
            ks.gdn.gdn_prefill_checkpointed(q, k, v, a, b, w[f"L{i}.gdn.A_log"], w[f"L{i}.gdn.dt_bias"],
                                            rec[ctx.slot], ends, snaps, out=o)
            for j, r1 in enumerate(ends):
                ctx.snapshot(r1, f"gdn.{i}.rec", snaps[j])
        o = ks.gated_rmsnorm.gated_rms_norm(o, z, w[f"L{i}.gdn.norm"], c.eps)
        return self.lin[f"L{i}.gdn.out"](o.view(N, vd))  # [N, D]

    def _conv_with_snapshots(self, i: int, mixed: torch.Tensor, ctx: StepContext) -> None:
        """Hand the engine layer i's conv state after each snapshot offset r of this piece: the last W-1 inputs
        before row r of [state; mixed] (what the conv kernel would leave after a call ending there), taken before
        the piece's conv overwrites the state."""
        if not ctx.snapshots:
            return
        state = self.s[f"gdn.{i}.conv"][ctx.slot]  # [W-1, C]
        w1 = state.shape[0]
        for r in ctx.snapshots:   # a view of mixed but for r < W-1 (no copy of the piece: session 31 measured 48 ms)
            window = mixed[r - w1 : r] if r >= w1 else torch.cat([state[r:], mixed[:r]])
            ctx.snapshot(r, f"gdn.{i}.conv", window)

    def _qkv(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The conv output's column slices: q, k [n, Hk, Dk] and v [n, Hv, Dv] (views)."""
        c, n = self.c, y.shape[0]
        kd = c.key_dim
        return (y[:, :kd].view(n, c.lin_k_heads, c.lin_k_dim), y[:, kd : 2 * kd].view(n, c.lin_k_heads, c.lin_k_dim),
                y[:, 2 * kd :].view(n, c.lin_v_heads, c.lin_v_dim))

    def _gdn_core(self, i: int, y: torch.Tensor, a: torch.Tensor, b: torch.Tensor, rec: torch.Tensor,
                  decode: bool, out: torch.Tensor | None = None, gate: tuple | None = None) -> torch.Tensor:
        """The gated delta rule on conv outputs y [n, C] (decode: one row per slot, rec [B, Hv, Dk, Dv]; prefill:
        the slot's rows, rec [Hv, Dk, Dv], written into `out` [n, Hv, Dv] when given, gated-normed when `gate`
        (z, weight, eps) is)
        -> o [n, Hv, Dv]. Updates rec."""
        w, ks = self.w, self.ks
        q, k, v = self._qkv(y)
        A_log, dt_bias = w[f"L{i}.gdn.A_log"], w[f"L{i}.gdn.dt_bias"]
        if decode:
            return ks.gdn.gdn_decode(q, k, v, a, b, A_log, dt_bias, rec)
        return ks.gdn.gdn_prefill(q, k, v, a, b, A_log, dt_bias, rec, out=out, gate=gate)

    def _conv_prefill_padded(self, i: int, mixed: torch.Tensor, state: torch.Tensor, ctx: StepContext) -> torch.Tensor:
        """The conv prefill of a padded bucket: its kernel leaves the last W-1 rows of [state; mixed] as the new
        state, pad rows included; put back the last W-1 REAL inputs (rows valid .. valid+W-2 of [old state; mixed])."""
        old = state.clone()
        y = self.ks.conv1d.causal_conv1d_prefill(mixed, self.w[f"L{i}.gdn.conv"], state)
        keep = ctx.valid + torch.arange(old.shape[0], device=old.device)
        state.copy_(torch.cat([old, mixed]).index_select(0, keep))
        return y

    def mlp(self, i: int, x: torch.Tensor) -> torch.Tensor:
        """SwiGLU MLP of layer i: [N, D] -> [N, D]."""
        act = self.lin[f"L{i}.mlp.gate_up"](x)  # [N, F]
        return self.lin[f"L{i}.mlp.down"](act)

    # ---------------------------------------------------------------- stack
    def __call__(self, ids: torch.Tensor, ctx: StepContext, *, last_only: bool = True,
                 probe: Probe | None = None) -> torch.Tensor:
        """Run every layer on ids [N]; returns fp32 logits [1, V] (prefill, last_only) or [N, V]."""
        c, w, ks = self.c, self.w, self.ks
        h = ks.embedding.embedding(ids, w["embed"])  # [N, D] bf16
        x = ks.rmsnorm.rms_norm(h, w["L0.in_norm"], c.eps, True)
        for i, kind in enumerate(c.layer_types):
            m = self.attention(i, x, ctx) if kind == FULL else self.gdn(i, x, ctx)
            if probe is not None and probe.mixer is not None:
                m = probe.mixer(i, m)
            r = ks.rmsnorm.add_rms_norm(m, h, w[f"L{i}.post_norm"], c.eps, True)
            x, h = r.out, r.residual
            m = self.mlp(i, x)
            if i + 1 < c.layers:
                r = ks.rmsnorm.add_rms_norm(m, h, w[f"L{i + 1}.in_norm"], c.eps, True)
                x, h = r.out, r.residual
                if probe is not None and probe.layer is not None:
                    probe.layer(i, h)
            else:
                if last_only and not ctx.decode:
                    if ctx.valid is not None:  # the last real row of a padded bucket
                        m, h = m.index_select(0, ctx.valid - 1), h.index_select(0, ctx.valid - 1)
                    else:
                        m, h = m[-1:], h[-1:]
                h = m + h  # the last layer's residual add (HF rounds it to bf16 the same way)
                if probe is not None and probe.layer is not None:
                    probe.layer(i, h)
        return self.logits(h)
