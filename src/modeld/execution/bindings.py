"""Kernel binding sets: which implementation of every op an engine calls, bound once at load.

No string dispatch and no discovery: `reference_kernels()` and `triton_kernels()` import their
modules explicitly, and an engine holds the resulting `KernelSet` for its lifetime. The model
code calls `ks.<op>.<function>(...)`; both modules of an op export identical signatures
(tests/kernels/test_signatures.py), so the model code never branches on the binding.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

import torch


@dataclass(frozen=True)
class KernelSet:
    """One module per op; `name` says which binding this is (for reports, never for dispatch)."""

    name: str
    rmsnorm: ModuleType
    gated_rmsnorm: ModuleType
    rope: ModuleType
    conv1d: ModuleType
    gdn: ModuleType
    embedding: ModuleType
    sampling: ModuleType
    linear: ModuleType
    attention: ModuleType
    logits: ModuleType


def reference_kernels() -> KernelSet:
    """The PyTorch references (run on any torch device; the spec of every op)."""
    from modeld.kernels.attention import reference as attention
    from modeld.kernels.conv1d import reference as conv1d
    from modeld.kernels.embedding import reference as embedding
    from modeld.kernels.gated_rmsnorm import reference as gated_rmsnorm
    from modeld.kernels.gdn import reference as gdn
    from modeld.kernels.linear import reference as linear
    from modeld.kernels.logits import reference as logits
    from modeld.kernels.rmsnorm import reference as rmsnorm
    from modeld.kernels.rope import reference as rope
    from modeld.kernels.sampling import reference as sampling

    return KernelSet("reference", rmsnorm, gated_rmsnorm, rope, conv1d, gdn, embedding, sampling,
                     linear, attention, logits)


def triton_kernels() -> KernelSet:
    """The Triton kernels (CUDA devices; the CPU interpreter only for small kernel tests)."""
    from modeld.kernels.attention import triton as attention
    from modeld.kernels.conv1d import triton as conv1d
    from modeld.kernels.embedding import triton as embedding
    from modeld.kernels.gated_rmsnorm import triton as gated_rmsnorm
    from modeld.kernels.gdn import triton as gdn
    from modeld.kernels.linear import triton as linear
    from modeld.kernels.logits import triton as logits
    from modeld.kernels.rmsnorm import triton as rmsnorm
    from modeld.kernels.rope import triton as rope
    from modeld.kernels.sampling import triton as sampling

    return KernelSet("triton", rmsnorm, gated_rmsnorm, rope, conv1d, gdn, embedding, sampling,
                     linear, attention, logits)


def default_kernels(device: torch.device) -> KernelSet:
    """Triton on a CUDA device, the references everywhere else (decided once, at load)."""
    return triton_kernels() if device.type == "cuda" else reference_kernels()
