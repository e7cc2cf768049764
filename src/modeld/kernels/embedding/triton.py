"""Embedding gather in Triton: grid (T, D-blocks); an out-of-range id writes a NaN row (no host sync).

Same function and signature as `reference.py` (the spec).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from modeld.kernels._checks import check_same_device
from modeld.kernels.embedding.reference import check_embedding_inputs

__all__ = ["embedding"]


@triton.jit
def _embedding_kernel(ids_ptr, table_ptr, out_ptr, V, D, BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    cmask = cols < D
    idx = tl.load(ids_ptr + t).to(tl.int64)
    valid = (idx >= 0) & (idx < V)
    row = tl.load(table_ptr + tl.where(valid, idx, 0) * D + cols, mask=cmask & valid, other=float("nan"))
    tl.store(out_ptr + t * D + cols, row, mask=cmask)


def embedding(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rows of `table` for `ids`: returns a new [T, D] tensor in the table's dtype; mutates nothing.

    Raises KernelValueError for an id outside [0, V) (see the module docstring for the Triton path).
    """
    check_embedding_inputs(ids, table)
    check_same_device(ids=ids, table=table)
    T = ids.shape[0]
    V, D = table.shape
    out = torch.empty((T, D), dtype=table.dtype, device=table.device)
    if T and D:
        block = min(1024, triton.next_power_of_2(D))
        _embedding_kernel[(T, triton.cdiv(D, block))](ids, table, out, V, D, BLOCK_D=block, num_warps=4)
    return out
