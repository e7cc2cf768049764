"""Gated RMSNorm in Triton: one program handles ROWS rows of Dv (one value head each).

Same function and rounding as `reference.py` (the spec).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from modeld.kernels._checks import check_same_device
from modeld.kernels._loads_first import loads_first
from modeld.kernels._pdl import light_kwargs, light_prologue
from modeld.kernels._tl import round_f32, round_to
from modeld.kernels.errors import KernelShapeError, KernelValueError
from modeld.kernels.gated_rmsnorm.reference import check_gated_inputs, gate_rows_dense

__all__ = ["gated_rms_norm"]

MAX_DV = 4096
# the kernel numbers rows in int32 (its last program's arange ends ROWS - 1 past n_rows, ROWS <= 128)
MAX_ROWS = 2**31 - 128
# Rows per program and warps; None: min(16, 2048 / BLOCK_D) rows at 4 warps (16 rows of the 27B's Dv 128). Session 28's
# cold-32k table: 118 µs per 8192-token call at 27B heads, 0.53 of the 3-pass byte floor (the residual RMSNorm reaches
# 0.8): 2,048-element programs may be too short to keep enough loads in flight. $MODELD_GATED_NORM_TILE =
# "rows,warps" (read per call) overrides it for an A/B (bench/kernels_recurrent.py "gated_rms_norm(...)" rows).
TILE: tuple[int, int] | None = None
TILE_ENV = "MODELD_GATED_NORM_TILE"


def tile(block_d: int) -> tuple[int, int]:
    """(rows per program, num_warps): $MODELD_GATED_NORM_TILE ("rows,warps" or "rows:warps") if set, else TILE, else
    the default for BLOCK_D. Raises KernelValueError unless rows is a power of two in 1..128 and warps one of 1, 2,
    4, 8."""
    text = os.environ.get(TILE_ENV)
    if text:
        try:
            rows, warps = (int(v) for v in text.replace(":", ",").split(","))  # ':' too: ttft_long --cold-ab
        except ValueError:
            rows = warps = 0
        if not (1 <= rows <= 128 and rows & (rows - 1) == 0 and warps in (1, 2, 4, 8)):
            raise KernelValueError(f"{TILE_ENV}={text!r}: expected rows,warps with rows a power of two in 1..128 and "
                                   f"warps 1, 2, 4 or 8")
        return rows, warps
    return TILE if TILE is not None else (max(1, min(16, 2048 // block_d)), 4)


@triton.jit
def _gated_rmsnorm_kernel(
    x_ptr, z_ptr, w_ptr, out_ptr, n_rows, Dv, H, stride_zt, eps,
    BLOCK_D: tl.constexpr, ROWS: tl.constexpr, PDL: tl.constexpr, LOADS_FIRST: tl.constexpr,
):
    light_prologue(PDL)  # (wait, then) let the next kernel launch (kernels/_pdl.py)
    # row numbers in int32 (the host checks n_rows <= MAX_ROWS): an int64 division by H is a ~40-instruction routine
    # per row, which made this kernel issue-bound; the offsets themselves are int64
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < Dv)
    offs = rows.to(tl.int64)[:, None] * Dv + cols[None, :]
    # z: row r is head r % H of token r // H, tokens stride_zt apart (H * Dv when z is contiguous)
    z_offs = ((rows // H).to(tl.int64) * stride_zt + (rows % H) * Dv)[:, None] + cols[None, :]
    # LOADS_FIRST (kernels/_loads_first.py): z and w in flight before the reduction waits for x
    x = tl.load(x_ptr + offs, mask=mask, other=0.0, volatile=LOADS_FIRST).to(tl.float32)
    z = tl.load(z_ptr + z_offs, mask=mask, other=0.0, volatile=LOADS_FIRST).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < Dv, other=0.0, volatile=LOADS_FIRST).to(tl.float32)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / Dv + eps)
    act = out_ptr.dtype.element_ty
    n = round_f32(x * inv[:, None], act)
    y = round_f32(w[None, :] * n, act)  # HF rounds w · n to the activation dtype
    gate = z / (1.0 + tl.exp(-z))  # silu in fp32
    tl.store(out_ptr + offs, round_to(y * gate, act), mask=mask)


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """out = (w · rmsnorm(x).to(dtype)) · silu(z), rows of length Dv; see the module docstring.

    x, z [..., Dv] (e.g. [T, Hv, Dv]; z may be token-strided: `reference.check_gated_inputs`); weight [Dv].
    Returns a new contiguous tensor like x. Mutates nothing. Raises KernelInputError subclasses.
    """
    check_gated_inputs(x, z, weight, eps)
    check_same_device(x=x, z=z, weight=weight)
    Dv = x.shape[-1]
    if Dv > MAX_DV:
        raise KernelShapeError(f"Dv={Dv} exceeds the single-tile limit {MAX_DV} of this kernel")
    n_rows = x.numel() // Dv
    if n_rows > MAX_ROWS:
        raise KernelShapeError(f"{n_rows} rows of Dv={Dv} exceed this kernel's {MAX_ROWS} (int32 row numbers)")
    out = torch.empty_like(x)
    if n_rows > 0:
        block = triton.next_power_of_2(Dv)
        rows, warps = tile(block)
        heads, stride_zt = (z.shape[1], z.stride(0)) if gate_rows_dense(z) else (1, Dv)
        _gated_rmsnorm_kernel[(triton.cdiv(n_rows, rows),)](
            x, z, weight, out, n_rows, Dv, heads, stride_zt, float(eps), BLOCK_D=block, ROWS=rows, **light_kwargs(),
            LOADS_FIRST=loads_first(n_rows), num_warps=warps,
        )
    return out
