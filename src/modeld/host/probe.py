"""Probe this machine into HostFacts: OS, CPU, RAM (from /proc and the stdlib) and GPUs.

GPU sources, in order of trust: NVML (driver, free memory, NVLink, no side effects), then torch
(the CUDA runtime version always; devices only if NVML could not list them). Works with no GPU
and no NVIDIA libraries at all. Reads only; creates no CUDA context unless NVML failed and torch
sees a GPU.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

from modeld.host.facts import HostFacts
from modeld.host.gpu_sources import GpuReport, probe_nvml, probe_torch

ALL_SOURCES = ("nvml", "torch")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _cpu_cores() -> int:
    """Cores this process may run on (affinity), which is what a worker pool can use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _ram() -> tuple[int, int | None]:
    """(total, available) bytes from /proc/meminfo, else sysconf (available unknown)."""
    try:
        values = {}
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                values[key] = int(parts[0]) * 1024  # /proc/meminfo is in KiB
        if "MemTotal" in values:
            return values["MemTotal"], values.get("MemAvailable")
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), None
    except (ValueError, OSError, AttributeError):
        return 0, None


def _interconnect(report: GpuReport) -> str:
    if len(report.gpus) <= 1:
        return "none"
    if not report.nvlink_known:
        return "unknown"
    if all(gpu.nvlink_active_links > 0 for gpu in report.gpus):
        return "nvlink"
    return "pcie"


def probe_host(sources: tuple[str, ...] = ALL_SOURCES) -> HostFacts:
    """Gather HostFacts for this machine. Never raises for missing GPUs, drivers or libraries.

    `sources` limits the GPU sources ("nvml", "torch"); `()` skips GPUs entirely (fast, used by
    tests). Tolerated failures are listed in `HostFacts.notes`.
    """
    unknown = set(sources) - set(ALL_SOURCES)
    if unknown:
        raise ValueError(f"unknown host probe source(s): {', '.join(sorted(unknown))}")
    notes: list[str] = []
    answered = ["proc"]
    gpus = GpuReport()
    if "nvml" in sources:
        gpus = probe_nvml()
        notes += gpus.notes
        if gpus.answered:
            answered.append("nvml")
    if "torch" in sources:
        torch_report = probe_torch(need_devices=not gpus.gpus)
        notes += torch_report.notes
        if torch_report.answered:
            answered.append("torch")
        gpus.cuda_runtime_version = torch_report.cuda_runtime_version
        if not gpus.gpus and torch_report.gpus:
            gpus.gpus = torch_report.gpus
            gpus.nvlink_known = False
    ram_total, ram_available = _ram()
    return HostFacts(
        os=platform.system() or "unknown",
        os_release=platform.release() or "unknown",
        machine=platform.machine() or "unknown",
        python=platform.python_version(),
        cpu_model=_cpu_model(),
        cpu_cores=_cpu_cores(),
        ram_total_bytes=ram_total,
        ram_available_bytes=ram_available,
        gpus=tuple(gpus.gpus),
        driver_version=gpus.driver_version,
        cuda_driver_version=gpus.cuda_driver_version,
        cuda_runtime_version=gpus.cuda_runtime_version,
        interconnect=_interconnect(gpus),
        sources=tuple(answered),
        notes=tuple(notes),
    )
