"""GPU facts from NVML (pynvml, from nvidia-ml-py) and from torch.cuda, both imported lazily.

Every failure is tolerated: a source that cannot answer returns what it has plus a note saying
why, so that a host without a GPU, a driver or the libraries still gets valid HostFacts.
This is the only module in modeld that talks to NVML or asks torch about devices; it names
no architecture itself (the arch string is derived from the compute capability).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from modeld.host.facts import GpuFacts


@dataclass
class GpuReport:
    """What one source learned. Mutable while a source fills it; turned into HostFacts later."""

    gpus: list[GpuFacts] = field(default_factory=list)
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    cuda_runtime_version: str | None = None
    nvlink_known: bool = False
    answered: bool = False
    notes: list[str] = field(default_factory=list)


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _cuda_version_text(encoded: int) -> str:
    """NVML encodes CUDA 12.4 as 12040."""
    return f"{encoded // 1000}.{(encoded % 1000) // 10}"


def probe_nvml() -> GpuReport:
    """Ask NVML for driver, CUDA driver version and each GPU. Never raises.

    NVML has no side effect on the GPUs (no CUDA context is created), so free memory is safe to
    read here. Calls nvmlInit/nvmlShutdown in pairs.
    """
    report = GpuReport()
    try:
        import pynvml
    except Exception as exc:  # ImportError, or a broken install
        report.notes.append(f"nvml: pynvml not importable ({type(exc).__name__}: {exc})")
        return report
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound / DriverNotLoaded on GPU-less hosts
        report.notes.append(f"nvml: init failed ({type(exc).__name__}: {exc})")
        return report
    try:
        report.answered = True
        try:
            report.driver_version = _text(pynvml.nvmlSystemGetDriverVersion())
        except Exception as exc:
            report.notes.append(f"nvml: driver version unknown ({exc})")
        try:
            report.cuda_driver_version = _cuda_version_text(pynvml.nvmlSystemGetCudaDriverVersion())
        except Exception as exc:
            report.notes.append(f"nvml: CUDA driver version unknown ({exc})")
        count = int(pynvml.nvmlDeviceGetCount())
        report.nvlink_known = True
        for index in range(count):
            gpu, nvlink_ok = _nvml_gpu(pynvml, index, report.notes)
            report.nvlink_known = report.nvlink_known and nvlink_ok
            if gpu is not None:
                report.gpus.append(gpu)
    except Exception as exc:
        report.notes.append(f"nvml: device query failed ({type(exc).__name__}: {exc})")
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return report


def _nvml_gpu(pynvml, index: int, notes: list[str]) -> tuple[GpuFacts | None, bool]:
    """One device; returns (facts or None, whether its NVLink state could be read)."""
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = _text(pynvml.nvmlDeviceGetName(handle))
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    except Exception as exc:
        notes.append(f"nvml: GPU {index} unreadable ({type(exc).__name__}: {exc})")
        return None, False
    links, nvlink_ok = 0, True
    try:
        max_links = int(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18))
        for link in range(max_links):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(handle, link) == 1:  # NVML_FEATURE_ENABLED
                    links += 1
            except Exception as exc:
                # Links past the device's count answer NotSupported / InvalidArgument: expected.
                if link == 0 and "Not Supported" not in str(exc):
                    nvlink_ok = False
                break
    except Exception:
        nvlink_ok = False
    gpu = GpuFacts(
        index=index,
        name=name,
        arch=f"sm_{int(major)}{int(minor)}",
        total_memory_bytes=int(memory.total),
        free_memory_bytes=int(memory.free),
        nvlink_active_links=links,
    )
    return gpu, nvlink_ok


def probe_torch(need_devices: bool) -> GpuReport:
    """Ask torch for its CUDA runtime version and, if `need_devices`, the visible GPUs.

    Device properties initialise CUDA in this process, so they are read only when NVML failed
    (`need_devices`); free memory is then left unknown (reading it would create a context).
    Never raises.
    """
    report = GpuReport()
    try:
        import torch
    except Exception as exc:
        report.notes.append(f"torch: not importable ({type(exc).__name__}: {exc})")
        return report
    report.answered = True
    report.cuda_runtime_version = getattr(torch.version, "cuda", None)
    if report.cuda_runtime_version is None:
        report.notes.append("torch: built without CUDA (torch.version.cuda is None)")
    if not need_devices:
        return report
    try:
        if not torch.cuda.is_available():
            report.notes.append("torch: torch.cuda.is_available() is False")
            return report
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            report.gpus.append(
                GpuFacts(
                    index=index,
                    name=str(props.name),
                    arch=f"sm_{props.major}{props.minor}",
                    total_memory_bytes=int(props.total_memory),
                    free_memory_bytes=None,
                )
            )
    except Exception as exc:
        report.notes.append(f"torch: device query failed ({type(exc).__name__}: {exc})")
    return report
