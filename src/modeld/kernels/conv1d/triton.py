"""Causal depthwise conv1d + SiLU in Triton. Same functions, signatures and rounding as
`reference.py` (the spec). The width W is a constexpr; T and B are runtime values.

Prefill: grid (T-blocks, C-blocks). Only the first T-block reads the old state, and that same
program writes the final state after its reads, so no other program races with the update. With
SPLIT_FIRST_BLOCK the first T-block is its own launch (FIRST=True) and the rest never compile the state's
loads (FIRST=False): offline sm_90, 27B C 10240, the 64 x 128 tile drops from 205 to 138 registers (3 CTAs
per SM instead of 2) and from 64 to 32 LDG.128 per thread.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from modeld.kernels._checks import check_same_device, env_choice
from modeld.kernels._pdl import light_kwargs, light_prologue
from modeld.kernels._tl import round_f32, round_to
from modeld.kernels.conv1d.reference import check_conv_inputs

__all__ = ["causal_conv1d_prefill", "causal_conv1d_decode", "PREFILL_TILE", "SPLIT_FIRST_BLOCK"]

# The prefill's (BLOCK_T, BLOCK_C, num_warps); BLOCK_T >= W - 1 keeps every state read inside the first T-block.
# H200 (certs/kernels-recurrent-h200.json): 64 x 128 x 4 takes 226.6 us at T 8192, C 10240 (0.35 of the copy floor);
# the session-26 cold 32k spends 54 ms in it. Candidates for bench/kernels_recurrent.py's conv rows: PREFILL_TILES.
# Session 27 (H200, the engine's strided input, T 8192): 64x128w4 221.9 us, with the first block split off 156.0,
# 32x256w4-split 156.7 (T 2048: 62.1 / 48.2 / 47.7): 32 x 256 x 4 + split is the default, certified with it.
PREFILL_TILE = (32, 256, 4)
PREFILL_TILES = ((64, 128, 4), (64, 256, 8), (128, 128, 8), (32, 256, 4))
SPLIT_FIRST_BLOCK = True
# The rows kernel (`_conv_prefill_rows_kernel`, session 29; H200 session 30: cold 32k 1.001x with rows16x512w4, bit
# for bit, so not the default): (ROWS, BLOCK_C, num_warps) candidates, and the default when ROWS_TILE is set (None:
# the tile kernel above)
ROWS_TILES = ((8, 1024, 4), (16, 512, 4), (32, 512, 4), (16, 1024, 8))
ROWS_TILE: tuple[int, int, int] | None = None
# $MODELD_CONV_PREFILL (read per call) names a candidate for an engine A/B: "<BLOCK_T>x<BLOCK_C>w<warps>", "-split"
# appended for SPLIT_FIRST_BLOCK, e.g. "64x256w8-split"; "rows<ROWS>x<BLOCK_C>w<warps>" for the rows kernel
PREFILL_ENV = "MODELD_CONV_PREFILL"


def candidate_name(tile: tuple[int, int, int], split: bool | None) -> str:
    """The $MODELD_CONV_PREFILL name of a (tile, split) candidate, split None for the rows kernel (bench rows are
    labelled with it too)."""
    if split is None:
        return f"rows{tile[0]}x{tile[1]}w{tile[2]}"
    return f"{tile[0]}x{tile[1]}w{tile[2]}" + ("-split" if split else "")


PREFILL_CANDIDATES = {candidate_name(t, sp): (t, sp) for t in PREFILL_TILES for sp in (False, True)}
PREFILL_CANDIDATES.update({candidate_name(t, None): (t, None) for t in ROWS_TILES})


def prefill_choice() -> tuple[tuple[int, int, int], bool | None]:
    """(tile, split first block) for the tile kernel, or ((ROWS, BLOCK_C, warps), None) for the rows kernel:
    $MODELD_CONV_PREFILL's candidate if set, else ROWS_TILE if set, else PREFILL_TILE and SPLIT_FIRST_BLOCK.
    Raises KernelValueError for a name not in PREFILL_CANDIDATES."""
    if not os.environ.get(PREFILL_ENV):
        return (ROWS_TILE, None) if ROWS_TILE is not None else (PREFILL_TILE, SPLIT_FIRST_BLOCK)
    return PREFILL_CANDIDATES[env_choice(PREFILL_ENV, "", tuple(PREFILL_CANDIDATES))]


@triton.jit
def _silu_round(acc, act: tl.constexpr):
    a = round_f32(acc, act)  # the conv output is rounded before SiLU, as in HF
    return round_to(a / (1.0 + tl.exp(-a)), act)


@triton.jit
def _conv_prefill_kernel(
    x_ptr, w_ptr, state_ptr, y_ptr, T, C, stride_xt,
    W: tl.constexpr, W_ROWS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
    FIRST: tl.constexpr = True, T_BLOCK0: tl.constexpr = 0,
):
    # FIRST: this launch holds T-block 0 (reads the old state, writes the new one); T_BLOCK0: the launch's first
    # T-block (1 for the rest of a split launch)
    pid_t = tl.program_id(0) + T_BLOCK0
    cs = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ts = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    cmask = cs < C
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
    for j in tl.static_range(W):
        tau = ts - (W - 1) + j  # input time; < 0 reads the state row W-1+tau
        in_x = (tau >= 0) & (ts < T)
        in_s = (tau < 0) & (ts < T)
        xv = tl.load(x_ptr + tau[:, None].to(tl.int64) * stride_xt + cs[None, :],
                     mask=in_x[:, None] & cmask[None, :], other=0.0)
        w = tl.load(w_ptr + cs * W + j, mask=cmask, other=0.0).to(tl.float32)
        if FIRST:
            sv = tl.load(state_ptr + (W - 1 + tau)[:, None] * C + cs[None, :],
                         mask=in_s[:, None] & cmask[None, :], other=0.0)
            acc += w[None, :] * (xv.to(tl.float32) + sv.to(tl.float32))
        else:
            acc += w[None, :] * xv.to(tl.float32)
    act = y_ptr.dtype.element_ty
    ymask = (ts < T)[:, None] & cmask[None, :]
    tl.store(y_ptr + ts[:, None].to(tl.int64) * C + cs[None, :], _silu_round(acc, act), mask=ymask)
    if FIRST and pid_t == 0:
        _write_final_state(x_ptr, state_ptr, T, C, stride_xt, cs, cmask, W, W_ROWS)


@triton.jit
def _write_final_state(x_ptr, state_ptr, T, C, stride_xt, cs, cmask, W: tl.constexpr, W_ROWS: tl.constexpr):
    """The program holding T-block 0, after its reads of the old state: state row i <- the input at time
    T-(W-1)+i of (state ++ x), for its channels cs."""
    rows = tl.arange(0, W_ROWS)  # W_ROWS = next power of 2 >= W-1
    src_t = T - (W - 1) + rows
    rmask = rows < W - 1
    from_x = tl.load(x_ptr + src_t[:, None].to(tl.int64) * stride_xt + cs[None, :],
                     mask=(rmask & (src_t >= 0))[:, None] & cmask[None, :], other=0.0)
    from_s = tl.load(state_ptr + (W - 1 + src_t)[:, None] * C + cs[None, :],
                     mask=(rmask & (src_t < 0))[:, None] & cmask[None, :], other=0.0)
    new = tl.where((src_t >= 0)[:, None], from_x, from_s)
    tl.debug_barrier()  # every read of the old state by this program precedes the writes
    tl.store(state_ptr + rows[:, None] * C + cs[None, :], new, mask=rmask[:, None] & cmask[None, :])


@triton.jit
def _conv_prefill_rows_kernel(
    x_ptr, w_ptr, state_ptr, y_ptr, T, C, stride_xt,
    W: tl.constexpr, W_ROWS: tl.constexpr, ROWS: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """`_conv_prefill_kernel`'s outputs for ROWS rows from program_id(0) * ROWS, reading each of the ROWS + W - 1
    input rows once as a [BLOCK_C] vector (converted to fp32 once) instead of W shifted [BLOCK_T, BLOCK_C] tiles:
    the tile kernel loads and converts every input W times and was issue-bound (offline sm_90, 27B C 10240: 31
    instructions per element there, 28 here at 16 x 512 x 4 with the GPU's convert). Same sums in the same order
    (acc += w_j · x_{t-W+1+j}, j ascending), so the same bits. ROWS >= W - 1 keeps the state's reads in program 0,
    which writes the final state after them."""
    pid_t = tl.program_id(0)
    cs = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cs < C
    t0 = pid_t * ROWS
    ws = ()
    for j in tl.static_range(W):
        ws = ws + (tl.load(w_ptr + cs * W + j, mask=cmask, other=0.0).to(tl.float32),)
    xs = ()  # inputs t0 - (W-1) .. t0 + ROWS - 1: the first W - 1 from the old state where before time 0
    for i in tl.static_range(ROWS + W - 1):
        tau = t0 - (W - 1) + i
        xv = tl.load(x_ptr + tau.to(tl.int64) * stride_xt + cs, mask=cmask & (tau >= 0) & (tau < T), other=0.0)
        if i < W - 1:
            sv = tl.load(state_ptr + (W - 1 + tau) * C + cs, mask=cmask & (tau < 0), other=0.0)
            xs = xs + (xv.to(tl.float32) + sv.to(tl.float32),)
        else:
            xs = xs + (xv.to(tl.float32),)
    act = y_ptr.dtype.element_ty
    for i in tl.static_range(ROWS):
        acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
        for j in tl.static_range(W):
            acc += ws[j] * xs[i + j]
        t = t0 + i
        tl.store(y_ptr + t.to(tl.int64) * C + cs, _silu_round(acc, act), mask=cmask & (t < T))
    if pid_t == 0:
        _write_final_state(x_ptr, state_ptr, T, C, stride_xt, cs, cmask, W, W_ROWS)


@triton.jit
def _conv_decode_kernel(
    x_ptr, w_ptr, state_ptr, y_ptr, C, stride_xb,
    W: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr,
):
    light_prologue(PDL)  # (wait, then) let the next kernel launch (kernels/_pdl.py)
    b = tl.program_id(0).to(tl.int64)
    cs = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cs < C
    x = tl.load(x_ptr + b * stride_xb + cs, mask=cmask, other=0.0)
    acc = tl.load(w_ptr + cs * W + (W - 1), mask=cmask, other=0.0).to(tl.float32) * x.to(tl.float32)
    sbase = state_ptr + b * (W - 1) * C
    rows = ()  # the W - 1 state rows as loaded: the shift stores them back, so nothing is read after a store
    for j in tl.static_range(W - 1):
        s = tl.load(sbase + j * C + cs, mask=cmask, other=0.0)
        acc += tl.load(w_ptr + cs * W + j, mask=cmask, other=0.0).to(tl.float32) * s.to(tl.float32)
        rows = rows + (s,)
    # shift: row j <- row j + 1, newest row <- x. Storing the rows loaded above (rather than re-reading row j + 1
    # after row j's store, which the compiler must assume may alias) saves the kernel's second memory round trip
    # (offline sm_90 SASS: an LDG after the first STG, and the next STG waiting on it).
    for j in tl.static_range(W - 2):
        tl.store(sbase + j * C + cs, rows[j + 1], mask=cmask)
    if W > 1:
        tl.store(sbase + (W - 2) * C + cs, x, mask=cmask)
    act = y_ptr.dtype.element_ty
    tl.store(y_ptr + b * C + cs, _silu_round(acc, act), mask=cmask)


def causal_conv1d_prefill(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """Conv + SiLU over one sequence. x [T, C], weight [C, W], state [W−1, C].

    Returns y [T, C] (new, contiguous). Mutates `state`: it is read as the inputs before x and
    overwritten with the last W−1 inputs of (state ++ x). Raises KernelInputError subclasses.
    """
    check_conv_inputs(x, weight, state, decode=False)
    check_same_device(x=x, weight=weight, state=state)
    T, C = x.shape
    W = weight.shape[1]
    y = torch.empty((T, C), dtype=x.dtype, device=x.device)
    if C == 0:
        return y
    (block_t, block_c, warps), split = prefill_choice()
    w_rows = triton.next_power_of_2(max(W - 1, 1))
    if split is None:  # the rows kernel; ROWS >= W - 1 keeps every state read in program 0
        rows = max(block_t, W - 1)
        _conv_prefill_rows_kernel[(max(1, triton.cdiv(T, rows)), triton.cdiv(C, block_c))](
            x, weight, state, y, T, C, x.stride(0), W=W, W_ROWS=w_rows, ROWS=rows, BLOCK_C=block_c, num_warps=warps)
        return y
    block_t = max(block_t, triton.next_power_of_2(W))  # every state read inside the first T-block
    t_blocks, c_blocks = max(1, triton.cdiv(T, block_t)), triton.cdiv(C, block_c)
    common = dict(W=W, W_ROWS=w_rows, BLOCK_T=block_t, BLOCK_C=block_c, num_warps=warps)
    split = split and t_blocks > 1
    _conv_prefill_kernel[(1 if split else t_blocks, c_blocks)](x, weight, state, y, T, C, x.stride(0), **common)
    if split:  # T-blocks 1.. never touch the state: no ordering with the launch above
        _conv_prefill_kernel[(t_blocks - 1, c_blocks)](x, weight, state, y, T, C, x.stride(0), FIRST=False,
                                                       T_BLOCK0=1, **common)
    return y


def causal_conv1d_decode(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """One token per sequence. x [B, C], weight [C, W], state [B, W−1, C].

    Returns y [B, C] (new). Mutates `state` in place: shifted by one, x appended as the newest row.
    Raises KernelInputError subclasses.
    """
    check_conv_inputs(x, weight, state, decode=True)
    check_same_device(x=x, weight=weight, state=state)
    B, C = x.shape
    W = weight.shape[1]
    y = torch.empty((B, C), dtype=x.dtype, device=x.device)
    if B == 0 or C == 0:
        return y
    block_c = 256
    _conv_decode_kernel[(B, triton.cdiv(C, block_c))](x, weight, state, y, C, x.stride(0), W=W, BLOCK_C=block_c,
                                                       **light_kwargs())
    return y
