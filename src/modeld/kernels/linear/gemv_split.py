"""How the v2 / tensor-core decode GEMVs finish split-K partials (cfg.split_k > 1): the policy, the
arrival counters of the fused finish and the two Triton paths that share one summation.

Each program of a split-K launch stores fp32 partials [SPLIT, 2N]; then either a second launch
(`_gemv_finish_kernel`) sums them, or the last arriving program of each row block does it inside the
GEMV launch (`_split_finish`, counters from `kernels/_arrival.py`). Both call `_finish_rows`, in split
order, so the two paths are bit-identical. KNOWLEDGE/optimizations/gemv-split-k-fused-finish.md.
Launchers share the host side (`split_units`, `split_workspace`, `finish_split`); one-tile kernels (gemv_mma,
gemv_hmma) write their output through `_store_rows`.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from modeld.kernels import _arrival
from modeld.kernels._pdl import light_kwargs, light_prologue
from modeld.kernels.errors import KernelValueError

__all__ = ["SPLIT_FINISH", "SPLIT_FINISH_ENV", "FUSED_MAX_N", "GemvWorkspaceError", "split_finish",
           "reserve_split_counters", "split_counter_buffer", "split_units", "split_workspace", "finish_split"]
# kernels: _gemv_finish_kernel, _split_finish, _batch_split_finish, _store_rows

# How split-K (cfg.split_k > 1) partials are finished: "kernel" = a second launch (`_gemv_finish_kernel`),
# "fused" = the last arriving program of each row block sums them inside the GEMV launch (one graph
# node less; bit-identical results: same split order), "auto" (default) = fused for N <= FUSED_MAX_N,
# else kernel. Env override MODELD_GEMV_SPLIT_FINISH, read on every call. H200 A/B (one run,
# KNOWLEDGE/optimizations/gemv-split-k-fused-finish.md): fused won at N <= 5120 (gdn.ba 4.3 -> 3.1 us,
# fp8 o_proj 11.8 -> 11.4, fp8 down 26.1 -> 25.6, bf16 down 44.7 -> 44.2; int4 down 25.2 / 25.5) and
# lost at N >= 14336 with split 2 (fp8 gate+up 48.5 -> 52.2, int4 attn.qkv 22.8 -> 24.7): there the
# last arriver's serial finish is a longer tail than a second, fully parallel launch.
SPLIT_FINISH = "auto"
FUSED_MAX_N = 5120
SPLIT_FINISH_ENV = "MODELD_GEMV_SPLIT_FINISH"
_COUNTER_NAME = "gemv-split"


class GemvWorkspaceError(_arrival.ArrivalWorkspaceError):
    """The fused split-K finish needs more arrival counters than were reserved before a CUDA-graph capture."""


def split_finish(n: int | None = None) -> str:
    """The split-K finish for an N-row output: MODELD_GEMV_SPLIT_FINISH if set, else SPLIT_FINISH;
    "auto" resolves to "fused" for n <= FUSED_MAX_N (n None: "auto" itself). Raises KernelValueError
    for any other value than "kernel" / "fused" / "auto"."""
    v = os.environ.get(SPLIT_FINISH_ENV, SPLIT_FINISH)
    if v not in ("kernel", "fused", "auto"):
        raise KernelValueError(f"{SPLIT_FINISH_ENV}={v!r}: expected 'kernel', 'fused' or 'auto'")
    if v == "auto" and n is not None:
        return "fused" if n <= FUSED_MAX_N else "kernel"
    return v


def reserve_split_counters(device: torch.device, n: int, stream=None) -> torch.Tensor:
    """Make the fused finish's counter buffer of (device, stream) hold >= n zeroed counters (one per row
    block of a launch) plus a spare for a later capture; return it. MUTATES `_arrival`'s tables; during a
    capture it only claims a spare, else raises GemvWorkspaceError."""
    return _arrival.reserve(_COUNTER_NAME, device, n, stream, error=GemvWorkspaceError,
                            hint=f"run the GEMV once eagerly (fused split finish) or call "
                                 f"gemv.reserve_split_counters(device, {n}) before capturing")


def split_counter_buffer(device: torch.device, stream=None) -> torch.Tensor | None:
    """The fused finish's counter buffer of (device, stream) if one exists (tests check it is all zero)."""
    return _arrival.counter_buffer(_COUNTER_NAME, device, stream)


def split_units(units: int, split_k: int, max_per: int) -> tuple[int, int]:
    """(split, units per split) for K cut into `units` (groups / chunks): at least split_k splits and at most
    max_per units in one, none left empty."""
    split = max(split_k, triton.cdiv(units, max_per))
    per = triton.cdiv(units, min(split, units))
    return triton.cdiv(units, per), per


def split_workspace(y: torch.Tensor, split: int, row_blocks: int) -> tuple[torch.Tensor, bool, torch.Tensor]:
    """(part, fused, cnt) of a launch with `split` programs per row block and `row_blocks` row blocks: the
    fp32 partials [split, 2N] (y itself when split == 1), whether the last arriver finishes them
    (`split_finish`) and its arrival counters (else `part`, unused). Raises GemvWorkspaceError as
    `reserve_split_counters`."""
    n = y.shape[1]
    part = torch.empty((split, 2 * n), dtype=torch.float32, device=y.device) if split > 1 else y
    fused = split > 1 and split_finish(n) == "fused"
    return part, fused, reserve_split_counters(y.device, row_blocks) if fused else part


def finish_split(part: torch.Tensor, y: torch.Tensor, split: int, swiglu: bool, fused: bool, finish=None) -> None:
    """Launch the second, finishing kernel when the partials of `split_workspace` are not finished in the
    GEMV launch. `finish` overrides the JIT function (launch recorders). MUTATES y."""
    if split > 1 and not fused:
        n = y.shape[1]
        (finish or _gemv_finish_kernel)[(triton.cdiv(n, 1024),)](part, y, n, SPLIT=split, SWIGLU=swiglu, BLOCK=1024,
                                                                  **light_kwargs(), num_warps=4)


@triton.jit
def _finish_rows(part_ptr, y_ptr, offs, N, SPLIT: tl.constexpr, SWIGLU: tl.constexpr):
    """y[offs] = sum_s part[s, offs] in split order (SWIGLU: silu(that) * sum_s part[s, N + offs]).
    The ONE summation both finishes use, so the fused and the two-launch paths are bit-identical."""
    mask = offs < N
    g = tl.zeros(offs.shape, dtype=tl.float32)
    u = tl.zeros(offs.shape, dtype=tl.float32)
    for sp in tl.static_range(SPLIT):
        g += tl.load(part_ptr + sp * 2 * N + offs, mask=mask, other=0.0)
        if SWIGLU:
            u += tl.load(part_ptr + sp * 2 * N + N + offs, mask=mask, other=0.0)
    out = g * tl.sigmoid(g) * u if SWIGLU else g
    tl.store(y_ptr + offs, out.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _last_arrival(cnt_ptr, SPLIT: tl.constexpr):
    """Arrive on row block program_id(0)'s counter, after this program stored its partials: the CTA barrier orders
    every thread's partial stores before thread 0's acq_rel atomic (release). True for the program that sees
    SPLIT - 1 arrivals before it (acquire: every partial is visible); that program has re-zeroed the counter for the
    next launch / graph replay. MUTATES the counter."""
    cnt = cnt_ptr + tl.program_id(0)
    tl.debug_barrier()
    last = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu") == SPLIT - 1
    if last:
        tl.store(cnt, 0)
    return last


@triton.jit
def _split_finish(part_ptr, y_ptr, cnt_ptr, rows, N, SPLIT: tl.constexpr, SWIGLU: tl.constexpr,
                  TWO_TILES: tl.constexpr, BLOCK_N: tl.constexpr):
    """Last-arriver split-K finish of row block program_id(0) (called after this program stored its
    partials, `_last_arrival`): the last program finishes `rows` (and rows + BLOCK_N when TWO_TILES) from all
    SPLIT partials, in split order. MUTATES the counter and y."""
    if _last_arrival(cnt_ptr, SPLIT):
        _finish_rows(part_ptr, y_ptr, rows, N, SPLIT, SWIGLU)
        if TWO_TILES:
            _finish_rows(part_ptr, y_ptr, rows + BLOCK_N, N, SPLIT, SWIGLU)


@triton.jit
def _batch_split_finish(part_ptr, y_ptr, cnt_ptr, rows, M, N, stride_ym, SPLIT: tl.constexpr, SWIGLU: tl.constexpr):
    """`_split_finish` of the batched GEMVs (gemv_hmma_batch, gemv_fp8_batch): partials [M, SPLIT, 2N]; the row
    tile's last program writes y[token, rows] for every token, each in split order. MUTATES the counter and y."""
    if _last_arrival(cnt_ptr, SPLIT):
        for tok in range(M):
            _finish_rows(part_ptr + tok * SPLIT * 2 * N, y_ptr + tok * stride_ym, rows, N, SPLIT, SWIGLU)


@triton.jit
def _store_rows(y_ptr, part_ptr, cnt_ptr, rows, mask, gv, uv, fin_rows, N, SPLIT: tl.constexpr, SWIGLU: tl.constexpr,
                FUSED: tl.constexpr, BLOCK_N: tl.constexpr):
    """A one-tile GEMV program's output: y[rows] (silu(gv) * uv for SwiGLU) when SPLIT == 1, else its
    partials at part[program_id(1)] (gate / plain at rows, up at N + rows) and, FUSED, the last-arriver
    finish of the row block's fin_rows. uv is ignored without SWIGLU."""
    if SPLIT == 1:
        if SWIGLU:
            tl.store(y_ptr + rows, (gv * tl.sigmoid(gv) * uv).to(y_ptr.dtype.element_ty), mask=mask)
        else:
            tl.store(y_ptr + rows, gv.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        base = part_ptr + tl.program_id(1) * 2 * N  # partials [SPLIT, 2N]
        tl.store(base + rows, gv, mask=mask)
        if SWIGLU:
            tl.store(base + N + rows, uv, mask=mask)
        if FUSED:  # the row block's last program sums the SPLIT partials (same order as the finish kernel)
            _split_finish(part_ptr, y_ptr, cnt_ptr, fin_rows, N, SPLIT, SWIGLU, False, BLOCK_N)


@triton.jit
def _gemv_finish_kernel(part_ptr, y_ptr, N, SPLIT: tl.constexpr, SWIGLU: tl.constexpr, BLOCK: tl.constexpr,
                        PDL: tl.constexpr):
    # y[n] = sum_s part[s, n] (SWIGLU: silu(that) * sum_s part[s, N + n]); part is fp32 [SPLIT, 2N]. A light
    # kernel: it lets the next kernel launch early, after waiting for the GEMV's partials when launched with PDL
    # (MODELD_PDL_LIGHT=1; kernels/_pdl.py).
    light_prologue(PDL)
    _finish_rows(part_ptr, y_ptr, tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), N, SPLIT, SWIGLU)
