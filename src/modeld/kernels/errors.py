"""Named errors raised by kernel launch wrappers (T0).

Every wrapper validates its inputs before launching and raises one of these; none of them ever
coerces an input (no silent `.contiguous()`, `.to()`, `.float()`).
"""

from __future__ import annotations

from modeld.errors import ModeldError


class KernelError(ModeldError):
    """Root of every error raised by `modeld.kernels`."""


class KernelInputError(KernelError):
    """An argument given to a kernel wrapper is unusable (root of the input checks below)."""


class KernelDtypeError(KernelInputError):
    """A tensor has a dtype the kernel does not accept."""


class KernelDeviceError(KernelInputError):
    """A tensor is on a device the kernel cannot run on, or tensors disagree on the device."""


class KernelShapeError(KernelInputError):
    """A tensor has the wrong rank or a dimension that disagrees with the op's shape letters."""


class KernelStrideError(KernelInputError):
    """A tensor's memory layout (strides) is not the one the kernel addresses."""


class KernelValueError(KernelInputError):
    """A scalar argument (eps, theta, temperature, ...) is out of its allowed range."""


class KernelUnavailableError(KernelError):
    """The Triton path cannot run here (no CUDA device and TRITON_INTERPRET is not set)."""
