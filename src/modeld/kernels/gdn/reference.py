"""Gated DeltaNet reference (the spec). Shape letters: kernels/README.md.

Inputs per token (after the short conv): q, k [.., Hk, Dk], v [.., Hv, Dv] in the activation dtype;
a, b [.., Hv] (the `in_proj_a` / `in_proj_b` outputs); parameters A_log, dt_bias [Hv] (bf16 or fp32).
Value head j reads q/k head j // (Hv / Hk). Per token and value head (HF 5.17 rounding):

    beta = sigmoid(b)                      in b's dtype (HF rounds it to bf16), then fp32
    g    = −exp(A_log32) · softplus(a32 + dt_bias32)      fp32, softplus linear above 20
    q̂    = l2norm(q32) / sqrt(Dk),   k̂ = l2norm(k32),   l2norm(x) = x · rsqrt(Σx² + 1e−6)
    S    ← e^g · S                      S ∈ R^{Dk×Dv}, fp32
    δ    = beta · (v32 − Sᵀ k̂)
    S    ← S + k̂ δᵀ
    o    = Sᵀ q̂                         (read after the update), rounded to v's dtype

Chunked form (`gdn_prefill_chunked`, chunk C=64): with γ the in-chunk cumsum of g,
D[r,s] = e^{γr−γs} (s ≤ r), L = strict_lower(diag(β) K Kᵀ ⊙ D), U = (I+L)⁻¹ diag(β) V,
W = (I+L)⁻¹ diag(β e^γ) K; per chunk with entering state S: Vn = U − W S,
O = (Q̂ e^γ) S + (Q̂ Kᵀ ⊙ D) Vn, S ← e^{γ_C} S + (K e^{γ_C−γ})ᵀ Vn.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from typing import NamedTuple

from modeld.kernels._checks import check_positive, check_tensor, same_device
from modeld.kernels.errors import KernelDtypeError, KernelShapeError, KernelStrideError, KernelValueError
from modeld.kernels.gated_rmsnorm import reference as gated_norm_ref

__all__ = ["fuses_gated_norm", "gdn_decode", "gdn_prefill", "gdn_prefill_checkpointed", "gdn_prefill_chunked"]
REFERENCE_ONLY = ("gdn_prefill_chunked",)  # no Triton twin; tests compare it with gdn_prefill

ACT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
PARAM_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
CHUNK = 64


def _check_heads(name: str, t: torch.Tensor, n: int) -> None:
    """[n, H, D] with the last two dims dense (token stride free)."""
    check_tensor(name, t, dtypes=ACT_DTYPES, contiguous=False)
    if t.dim() != 3 or t.shape[0] != n:
        raise KernelShapeError(f"{name} must be [{n}, H, D], got {list(t.shape)}")
    if t.stride(2) != 1 or t.stride(1) != t.shape[2]:
        raise KernelStrideError(f"{name} must be dense in its last two dims, got strides {t.stride()}")


def check_gdn_inputs(q, k, v, a, b, A_log, dt_bias, state, decode: bool) -> tuple[int, int, int, int, int]:
    """Validate shapes/dtypes/strides; return (N, Hk, Hv, Dk, Dv) where N = B (decode) or T.

    q, k [N, Hk, Dk]; v [N, Hv, Dv] (one dtype, dense last two dims); a, b [N, Hv] unit stride on Hv;
    A_log, dt_bias [Hv] contiguous; state fp32 contiguous [B, Hv, Dk, Dv] (decode) or [Hv, Dk, Dv].
    Raises KernelInputError subclasses.
    """
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        raise KernelShapeError(f"q must be [N, Hk, Dk], got {getattr(q, 'shape', type(q).__name__)}")
    N = q.shape[0]
    _check_heads("q", q, N)
    _check_heads("k", k, N)
    _check_heads("v", v, N)
    if k.shape != q.shape:
        raise KernelShapeError(f"k shape {list(k.shape)} must equal q shape {list(q.shape)}")
    if len({q.dtype, k.dtype, v.dtype}) != 1:
        raise KernelDtypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    Hk, Dk, Hv, Dv = q.shape[1], q.shape[2], v.shape[1], v.shape[2]
    if Hk == 0 or Hv % Hk:
        raise KernelShapeError(f"Hv={Hv} must be a positive multiple of Hk={Hk}")
    for name, t in (("a", a), ("b", b)):
        check_tensor(name, t, dtypes=ACT_DTYPES, shape=[N, Hv], contiguous=False)
        if t.stride(1) != 1:
            raise KernelStrideError(f"{name} must have unit stride on Hv, got strides {t.stride()}")
    check_tensor("A_log", A_log, dtypes=PARAM_DTYPES, shape=[Hv])
    check_tensor("dt_bias", dt_bias, dtypes=PARAM_DTYPES, shape=[Hv])
    want = [N, Hv, Dk, Dv] if decode else [Hv, Dk, Dv]
    check_tensor("state", state, dtypes=(torch.float32,), shape=want)
    return N, Hk, Hv, Dk, Dv


class GateNorm(NamedTuple):
    """The gated RMSNorm applied to gdn_prefill's output when passed as `gate` (kernels/gated_rmsnorm's spec; any
    (z, weight, eps) tuple will do): z [T, Hv, Dv] like v (contiguous, or each token's Hv x Dv dense at any token
    stride: the GDN in_proj's gate columns read in place), weight [Dv] of v's dtype, eps > 0."""
    z: torch.Tensor
    weight: torch.Tensor
    eps: float


def check_gate_norm(gate: GateNorm | None, v) -> None:
    """gdn_prefill's optional `gate`. Raises KernelInputError subclasses (the device is checked with the rest)."""
    if gate is None:
        return
    if not isinstance(gate, tuple) or len(gate) != 3:
        raise KernelShapeError(f"gate must be a (z, weight, eps) tuple, got {type(gate).__name__}")
    z, weight, eps = gate
    check_tensor("gate.z", z, dtypes=(v.dtype,), shape=list(v.shape), contiguous=not gated_norm_ref.gate_rows_dense(z))
    check_tensor("gate.weight", weight, dtypes=(v.dtype,), shape=[v.shape[2]])
    check_positive("gate.eps", eps)


def fuses_gated_norm() -> bool:
    """Whether gdn_prefill applies a passed `gate` inside its own output pass (a caller joining segments passes the
    gate only then). The reference has no output pass to fuse into: False."""
    return False


def check_gdn_out(out, v) -> None:
    """gdn_prefill's optional `out`: None, or a contiguous tensor shaped and typed like v ([T, Hv, Dv]).
    Raises KernelInputError subclasses (the device is checked with the other tensors)."""
    if out is not None:
        check_tensor("out", out, dtypes=(v.dtype,), shape=list(v.shape))


def gdn_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor):
    """(g, beta) fp32 [N, Hv] exactly as HF: beta rounded in b's dtype, g ≤ 0."""
    beta = torch.sigmoid(b).float()
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float())
    return g, beta


def _prepare(q, k, Hv):
    """l2-normalised fp32 q̂ (scaled) and k̂, repeated to the value heads: [N, Hv, Dk]."""
    rep = Hv // q.shape[1]
    q32, k32 = q.float(), k.float()
    qn = q32 * torch.rsqrt((q32 * q32).sum(-1, keepdim=True) + 1e-6) * (q.shape[2] ** -0.5)
    kn = k32 * torch.rsqrt((k32 * k32).sum(-1, keepdim=True) + 1e-6)
    return qn.repeat_interleave(rep, dim=1), kn.repeat_interleave(rep, dim=1)


def _step(S, qt, kt, vt, gt, bt):
    """One recurrence step for all heads. S [.., Hv, Dk, Dv]; qt, kt [.., Hv, Dk]; vt [.., Hv, Dv]."""
    S = S * torch.exp(gt)[..., None, None]
    kv = torch.einsum("...kv,...k->...v", S, kt)
    delta = bt[..., None] * (vt - kv)
    S = S + kt[..., :, None] * delta[..., None, :]
    return S, torch.einsum("...kv,...k->...v", S, qt)


def gdn_decode(q, k, v, a, b, A_log, dt_bias, state) -> torch.Tensor:
    """One token for each of B sequences. q, k [B, Hk, Dk]; v [B, Hv, Dv]; a, b [B, Hv];
    A_log, dt_bias [Hv]; state [B, Hv, Dk, Dv] fp32.

    Returns o [B, Hv, Dv] in v's dtype. Mutates `state` in place (the updated recurrent state).
    Raises KernelInputError subclasses.
    """
    check_gdn_inputs(q, k, v, a, b, A_log, dt_bias, state, decode=True)
    same_device(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state)
    g, beta = gdn_gates(a, b, A_log, dt_bias)
    qn, kn = _prepare(q, k, v.shape[1])
    S, o = _step(state, qn, kn, v.float(), g, beta)
    state.copy_(S)
    return o.to(v.dtype)


def gdn_prefill(q, k, v, a, b, A_log, dt_bias, state, out=None, gate=None) -> torch.Tensor:
    """T tokens of one sequence, by the exact recurrence. q, k [T, Hk, Dk]; v [T, Hv, Dv];
    a, b [T, Hv]; A_log, dt_bias [Hv]; state [Hv, Dk, Dv] fp32 (zeros for a fresh sequence).

    Returns o [T, Hv, Dv] in v's dtype, or with `gate` (a GateNorm) gated_rms_norm(o, *gate) — the model's GDN
    output norm, which a kernel can apply before o leaves registers. Written into `out` when given (contiguous, v's
    shape and dtype: a caller joining segments passes row slices of one buffer instead of concatenating), else a new
    tensor. Mutates `state`: read as the initial state, overwritten with the final one. Raises KernelInputError
    subclasses.
    """
    check_gdn_inputs(q, k, v, a, b, A_log, dt_bias, state, decode=False)
    check_gdn_out(out, v)
    check_gate_norm(gate, v)
    same_device(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state, out=out,
                z=None if gate is None else gate[0], weight=None if gate is None else gate[1])
    g, beta = gdn_gates(a, b, A_log, dt_bias)
    qn, kn = _prepare(q, k, v.shape[1])
    v32 = v.float()
    S = state.clone()
    o32 = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    for t in range(v.shape[0]):
        S, o32[t] = _step(S, qn[t], kn[t], v32[t], g[t], beta[t])
    state.copy_(S)
    o = o32.to(v.dtype)
    if gate is not None:
        o = gated_norm_ref.gated_rms_norm(o, *gate)
    return o if out is None else out.copy_(o)


def gdn_prefill_checkpointed(q, k, v, a, b, A_log, dt_bias, state, ends, snapshots, out=None) -> torch.Tensor:
    """`gdn_prefill` over T tokens that also keeps the recurrent state after the first ends[j] tokens in
    snapshots[j] (an engine's checkpoints inside one prefill piece). ends: strictly increasing ints in (0, T) (may
    be empty); snapshots: fp32 [len(ends), Hv, Dk, Dv] contiguous (None when ends is empty); out as for
    gdn_prefill. Returns o [T, Hv, Dv]; mutates state (initial → final), snapshots and out. Raises
    KernelInputError subclasses."""
    check_gdn_inputs(q, k, v, a, b, A_log, dt_bias, state, decode=False)
    check_gdn_out(out, v)
    same_device(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state, out=out)
    ends = check_snapshots(ends, snapshots, v, state)
    return checkpointed_loop(gdn_prefill, q, k, v, a, b, A_log, dt_bias, state, ends, snapshots, out)


def check_snapshots(ends, snapshots, v, state) -> tuple[int, ...]:
    """`gdn_prefill_checkpointed`'s ends and snapshots (see there); returns ends as a tuple of ints. Raises
    KernelValueError (ends) or KernelInputError subclasses (snapshots)."""
    T = v.shape[0]
    try:
        ends = tuple(int(e) for e in ends)
    except (TypeError, ValueError):
        raise KernelValueError(f"ends must be a sequence of token counts, got {ends!r}") from None
    if any(not 0 < e < T for e in ends) or any(e1 <= e0 for e0, e1 in zip(ends, ends[1:])):
        raise KernelValueError(f"ends must increase strictly inside (0, {T}), got {list(ends)}")
    if snapshots is None:
        if ends:
            raise KernelShapeError(f"snapshots: {len(ends)} ends need an fp32 [{len(ends)}, Hv, Dk, Dv] buffer")
        return ends
    check_tensor("snapshots", snapshots, dtypes=(torch.float32,), shape=[len(ends), *state.shape])
    same_device(v=v, snapshots=snapshots)
    return ends


def checkpointed_loop(prefill, q, k, v, a, b, A_log, dt_bias, state, ends, snapshots, out) -> torch.Tensor:
    """`gdn_prefill_checkpointed` as one `prefill` (a gdn_prefill) per segment, the state copied after each: the
    reference, and the Triton op's form where its one-pass kernel does not apply. Arguments already checked."""
    o = out if out is not None else torch.empty(v.shape, dtype=v.dtype, device=v.device)
    r0 = 0
    for j, r1 in enumerate((*ends, v.shape[0])):
        prefill(q[r0:r1], k[r0:r1], v[r0:r1], a[r0:r1], b[r0:r1], A_log, dt_bias, state, out=o[r0:r1])
        if j < len(ends):
            snapshots[j].copy_(state)
        r0 = r1
    return o


def gdn_prefill_chunked(q, k, v, a, b, A_log, dt_bias, state) -> torch.Tensor:
    """`gdn_prefill` computed with the chunk-64 algebra of the module docstring (fp32).

    Same arguments, result and mutation as `gdn_prefill`; agrees with it to fp32 rounding.
    """
    check_gdn_inputs(q, k, v, a, b, A_log, dt_bias, state, decode=False)
    same_device(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state)
    g, beta = gdn_gates(a, b, A_log, dt_bias)  # [T, Hv]
    qn, kn = _prepare(q, k, v.shape[1])  # [T, Hv, Dk]
    # head-major fp32: [Hv, T, .]
    Q, K, V = qn.transpose(0, 1), kn.transpose(0, 1), v.float().transpose(0, 1)
    G, Bt = g.t(), beta.t()
    S = state.clone()  # [Hv, Dk, Dv]
    T = v.shape[0]
    out = torch.empty(V.shape, dtype=torch.float32, device=v.device)  # [Hv, T, Dv]
    for c0 in range(0, T, CHUNK):
        sl = slice(c0, min(c0 + CHUNK, T))
        q_c, k_c, v_c, b_c = Q[:, sl], K[:, sl], V[:, sl], Bt[:, sl]
        gam = torch.cumsum(G[:, sl], dim=1)  # [Hv, c]
        n = gam.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=v.device).tril()
        Dm = torch.exp((gam[:, :, None] - gam[:, None, :]).masked_fill(~causal, float("-inf")))
        L = (b_c[:, :, None] * (k_c @ k_c.transpose(1, 2)) * Dm).tril(-1)
        IL = L + torch.eye(n, device=v.device)
        U = torch.linalg.solve_triangular(IL, b_c[..., None] * v_c, upper=False, unitriangular=True)
        Wm = torch.linalg.solve_triangular(
            IL, (b_c * torch.exp(gam))[..., None] * k_c, upper=False, unitriangular=True
        )
        Vn = U - Wm @ S  # [Hv, c, Dv]
        out[:, sl] = (q_c * torch.exp(gam)[..., None]) @ S + ((q_c @ k_c.transpose(1, 2)) * Dm) @ Vn
        last = gam[:, -1:]  # [Hv, 1]
        S = torch.exp(last)[..., None] * S + (k_c * torch.exp(last - gam)[..., None]).transpose(1, 2) @ Vn
    state.copy_(S)
    return out.transpose(0, 1).to(v.dtype)
