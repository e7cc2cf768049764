"""Embedding reference (the spec). Shape letters: kernels/README.md.

    out[t, :] = table[ids[t], :]        ids [T] int32/int64 in [0, V), table [V, D]

Out-of-range ids: the reference checks on the host and raises KernelValueError. The Triton path
does not synchronise with the host to check, so it writes a NaN row for such an id instead (loud
downstream, never a silent wrong row).
"""

from __future__ import annotations

import torch

from modeld.kernels._checks import check_tensor, same_device
from modeld.kernels.errors import KernelShapeError, KernelValueError

__all__ = ["embedding"]

TABLE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_embedding_inputs(ids: torch.Tensor, table: torch.Tensor) -> None:
    """ids [T] int32/int64 contiguous; table [V, D] contiguous float. Raises KernelInputError subclasses."""
    check_tensor("ids", ids, dtypes=(torch.int32, torch.int64))
    if ids.dim() != 1:
        raise KernelShapeError(f"ids must be [T], got {list(ids.shape)}")
    check_tensor("table", table, dtypes=TABLE_DTYPES)
    if table.dim() != 2:
        raise KernelShapeError(f"table must be [V, D], got {list(table.shape)}")


def embedding(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rows of `table` for `ids`: returns a new [T, D] tensor in the table's dtype; mutates nothing.

    Raises KernelValueError for an id outside [0, V) (see the module docstring for the Triton path).
    """
    check_embedding_inputs(ids, table)
    same_device(ids=ids, table=table)
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= table.shape[0]):
        raise KernelValueError(f"token ids must lie in [0, {table.shape[0]}), got min {int(ids.min())} max {int(ids.max())}")
    return table[ids.long()]
