"""Input checks shared by the launch wrappers: each raises a named `KernelInputError` subclass.

Nothing here converts a tensor; a wrapper either accepts what it was given or raises.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from modeld.kernels.errors import (
    KernelDeviceError,
    KernelDtypeError,
    KernelShapeError,
    KernelStrideError,
    KernelUnavailableError,
    KernelValueError,
)


def env_choice(name: str, default: str, choices: Sequence[str]) -> str:
    """A per-call switch: $name if set and non-empty, else `default`. Raises KernelValueError unless it is one of
    `choices` (the message names the variable and lists them)."""
    value = os.environ.get(name) or default
    if value not in choices:
        raise KernelValueError(f"{name}={value!r}: expected one of {', '.join(choices)}")
    return value


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (`TRITON_INTERPRET=1`)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_tensor(
    name: str,
    t: object,
    *,
    dtypes: Sequence[torch.dtype],
    shape: Sequence[int | None] | None = None,
    contiguous: bool = True,
) -> torch.Tensor:
    """Check one tensor argument; return it unchanged.

    `shape` entries that are None accept any size. Raises KernelDtypeError, KernelShapeError or
    KernelStrideError (contiguity means row-major dense, `t.is_contiguous()`).
    """
    # Runs for every tensor argument of every launch (~2,000 times per 27B prefill): plain loops, no temporaries.
    if not isinstance(t, torch.Tensor):
        raise KernelDtypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise KernelDtypeError(f"{name} has dtype {str(t.dtype).removeprefix('torch.')}; expected {allowed}")
    if shape is not None:
        dims = t.shape
        bad = len(dims) != len(shape)
        if not bad:
            for s, d in zip(shape, dims):
                if s is not None and s != d:
                    bad = True
                    break
        if bad:
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise KernelShapeError(f"{name} has shape {list(t.shape)}; expected {want}")
    if contiguous and not t.is_contiguous():
        raise KernelStrideError(f"{name} must be contiguous (strides {t.stride()} for shape {list(t.shape)})")
    return t


def same_device(**tensors: torch.Tensor | None) -> torch.device:
    """All given (non-None) tensors share one device; return it. Raises KernelDeviceError."""
    device = None
    for v in tensors.values():
        if v is None:
            continue
        if device is None:
            device = v.device
        elif v.device != device:
            device = None
            break
    if device is None:
        where = ", ".join(f"{k}={v.device}" for k, v in tensors.items() if v is not None)
        raise KernelDeviceError(f"tensors must share one device; got {where}")
    return device


def check_same_device(**tensors: torch.Tensor | None) -> torch.device:
    """`same_device`, and that device can run Triton here; return it.

    Raises KernelDeviceError on a mix of devices, KernelUnavailableError for CPU tensors outside the
    interpreter (the Triton path needs CUDA or TRITON_INTERPRET=1).
    """
    device = same_device(**tensors)
    if device.type == "cpu" and not interpreting():
        raise KernelUnavailableError(
            "the Triton path needs CUDA tensors (or TRITON_INTERPRET=1 for CPU tensors); use the reference"
        )
    if device.type not in ("cpu", "cuda"):
        raise KernelDeviceError(f"unsupported device {device} for a Triton kernel")
    return device


def check_positive(name: str, value: float) -> float:
    """A strictly positive finite float (eps, theta, ...); raises KernelValueError otherwise."""
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and 0 < value < float("inf")):
        raise KernelValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)
