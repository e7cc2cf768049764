"""Runtime versions of the kernel tier, for capability reports.

Lives in T0 because only this tier may name the vendor stack (Triton, the GPU); the cells above
ask for a plain dict of strings.
"""

from __future__ import annotations

import torch


def runtime_versions(device: torch.device) -> dict[str, str]:
    """{"torch", "device"} always; {"triton", "gpu"} too when `device` is a CUDA device."""
    out = {"torch": torch.__version__, "device": str(device)}
    if device.type == "cuda":
        import triton

        out["triton"] = triton.__version__
        out["gpu"] = torch.cuda.get_device_name(device)
    return out
