"""Gated DeltaNet in Triton. Same functions, signatures and rounding as `reference.py` (the spec).

* `gdn_decode`: one recurrent step per sequence (`_recurrent_kernels.py`), grid (Dv/BLOCK_V, Hv, B).
* `gdn_prefill`: the chunk-64 algorithm (`_chunk_kernels.py`): a parallel per-chunk prep launch
  (gates, l2norm, (I+L)⁻¹, U, W into fp32 scratch) and a sequential scan over chunks per
  (head, Dv slice) holding the state in registers. Heads wider than Dk = 128 (not qwen3_5's) take
  the token-loop kernel instead: the chunk tiles would not fit in shared memory.
Gates, l2norm and the 1/sqrt(Dk) scale are fused; Dk, Dv and the head ratio are constexpr; T and B
are runtime values.
"""

from __future__ import annotations

import torch
import triton

from modeld.kernels._checks import check_same_device
from modeld.kernels.errors import KernelShapeError
from modeld.kernels.gdn._chunk_kernels import _chunk_prep_kernel, _chunk_scan_kernel
from modeld.kernels.gdn._recurrent_kernels import _gdn_recurrent_kernel
from modeld.kernels.gdn.reference import CHUNK, check_gdn_inputs

__all__ = ["gdn_decode", "gdn_prefill"]

MAX_DK = 256
MAX_DV = 256
# the chunk scan keeps [64, Dk] fp32 tiles of q, k and W in shared memory for its dots: at Dk = 256 that
# is 237,568 B > the 232,448 B an sm_90 block may use, so wider heads take the token-loop kernel
MAX_DK_CHUNKED = 128
# recurrent kernel tiles (BLOCK_V, num_warps): decode of one sequence, decode of B > 1 sequences, and
# the token loop. Measured on the H200 only as these defaults (findings/kernels-recurrent-h200.md);
# the bench times alternatives (`--only gdn`) so they can be re-picked from data.
DECODE_TILE = (16, 4)
BATCH_TILE = (32, 4)
LOOP_TILE = (32, 4)
# tl.dot precision of the chunked prefill on the GPU: "tf32" (tensor cores, ~1e-3 relative) or "ieee"
DOT_PRECISION = "tf32"


def _launch_recurrent(q, k, v, a, b, A_log, dt_bias, state, n_seq, n_steps):
    N, Hk, Dk = q.shape
    Hv, Dv = v.shape[1], v.shape[2]
    _check_dims(Dk, Dv)
    o = torch.empty((N, Hv, Dv), dtype=v.dtype, device=v.device)
    if N == 0 or Hv == 0 or Dv == 0:
        return o
    block_k = triton.next_power_of_2(Dk)
    tile_v, warps = LOOP_TILE if n_steps > 1 else (BATCH_TILE if n_seq > 1 else DECODE_TILE)
    block_v = min(tile_v, triton.next_power_of_2(Dv))
    grid = (triton.cdiv(Dv, block_v), Hv, n_seq)
    _gdn_recurrent_kernel[grid](
        q, k, v, a, b, A_log, dt_bias, state, o,
        n_steps, q.stride(0), k.stride(0), v.stride(0), a.stride(0), b.stride(0), Hv, Dk**-0.5,
        HEAD_RATIO=Hv // Hk, DK=Dk, DV=Dv, BLOCK_K=block_k, BLOCK_V=block_v, num_warps=warps,
    )
    return o


def _check_dims(Dk: int, Dv: int) -> None:
    if Dk > MAX_DK or Dv > MAX_DV:
        raise KernelShapeError(f"Dk={Dk}, Dv={Dv}: this kernel keeps [Dk, Dv] tiles in registers (max {MAX_DK})")


def _launch_chunked(q, k, v, a, b, A_log, dt_bias, state):
    T, Hk, Dk = q.shape
    Hv, Dv = v.shape[1], v.shape[2]
    o = torch.empty((T, Hv, Dv), dtype=v.dtype, device=v.device)
    if T == 0 or Hv == 0 or Dv == 0:
        return o
    # fp32 scratch: W [Hv, T, Dk], U [Hv, T, Dv], γ [Hv, T] = Hv·T·(Dk+Dv+1)·4 B (27B, T=8192: 403 MB),
    # allocated per call: callers prefill long prompts in pieces (the state carries over exactly)
    w = torch.empty((Hv, T, Dk), dtype=torch.float32, device=v.device)
    u = torch.empty((Hv, T, Dv), dtype=torch.float32, device=v.device)
    gam = torch.empty((Hv, T), dtype=torch.float32, device=v.device)
    block_k = max(16, triton.next_power_of_2(Dk))
    block_dv = max(16, triton.next_power_of_2(Dv))
    _chunk_prep_kernel[(triton.cdiv(T, CHUNK), Hv)](
        k, v, a, b, A_log, dt_bias, w, u, gam,
        T, k.stride(0), v.stride(0), a.stride(0), b.stride(0), Hv,
        HEAD_RATIO=Hv // Hk, DK=Dk, DV=Dv, BLOCK_K=block_k, BLOCK_DV=block_dv, CHUNK=CHUNK, PRECISION=DOT_PRECISION,
        num_warps=8, num_stages=1,  # pipelined stages overflow shared memory (304 KB > 227 KB on sm_90)
    )
    block_v = min(32, block_dv)
    _chunk_scan_kernel[(triton.cdiv(Dv, block_v), Hv)](
        q, k, w, u, gam, state, o,
        T, q.stride(0), k.stride(0), Hv, Dk**-0.5,
        HEAD_RATIO=Hv // Hk, DK=Dk, DV=Dv, BLOCK_K=block_k, BLOCK_V=block_v, CHUNK=CHUNK, PRECISION=DOT_PRECISION,
        num_warps=8, num_stages=1,  # pipelined stages overflow shared memory (304 KB > 227 KB on sm_90)
    )
    return o


def gdn_decode(q, k, v, a, b, A_log, dt_bias, state) -> torch.Tensor:
    """One token for each of B sequences. q, k [B, Hk, Dk]; v [B, Hv, Dv]; a, b [B, Hv];
    A_log, dt_bias [Hv]; state [B, Hv, Dk, Dv] fp32.

    Returns o [B, Hv, Dv] in v's dtype. Mutates `state` in place (the updated recurrent state).
    Raises KernelInputError subclasses.
    """
    check_gdn_inputs(q, k, v, a, b, A_log, dt_bias, state, decode=True)
    check_same_device(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state)
    return _launch_recurrent(q, k, v, a, b, A_log, dt_bias, state, n_seq=q.shape[0], n_steps=1)


def gdn_prefill(q, k, v, a, b, A_log, dt_bias, state) -> torch.Tensor:
    """T tokens of one sequence, by the exact recurrence. q, k [T, Hk, Dk]; v [T, Hv, Dv];
    a, b [T, Hv]; A_log, dt_bias [Hv]; state [Hv, Dk, Dv] fp32 (zeros for a fresh sequence).

    Returns o [T, Hv, Dv] in v's dtype. Mutates `state`: read as the initial state, overwritten
    with the final one. Raises KernelInputError subclasses.
    """
    check_gdn_inputs(q, k, v, a, b, A_log, dt_bias, state, decode=False)
    check_same_device(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state)
    _check_dims(q.shape[2], v.shape[2])
    if q.shape[2] > MAX_DK_CHUNKED:
        return _launch_recurrent(q, k, v, a, b, A_log, dt_bias, state, n_seq=1, n_steps=q.shape[0])
    return _launch_chunked(q, k, v, a, b, A_log, dt_bias, state)


def _gdn_prefill_recurrent(q, k, v, a, b, A_log, dt_bias, state) -> torch.Tensor:
    """`gdn_prefill` by the token loop of the decode kernel (kept for benchmarks and cross-checks)."""
    check_gdn_inputs(q, k, v, a, b, A_log, dt_bias, state, decode=False)
    check_same_device(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state)
    return _launch_recurrent(q, k, v, a, b, A_log, dt_bias, state, n_seq=1, n_steps=q.shape[0])
