"""Helpers for the T3 distribution tests: tiny GGUF files, simulated hosts, manifest builders.

A uniquely named module (not conftest) so that `from t3_support import ...` can never pick up
another folder's conftest.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from modeld.host import GpuFacts, HostFacts

GIB = 1 << 30
H200_TOTAL = 150_000_000_000  # ~139.7 GiB, what NVML reports for an H200
H200_FREE = 148_000_000_000


def write_gguf(path: Path, arch: str = "llama", name: str = "tiny", seed: int = 0) -> Path:
    """A real, tiny GGUF file (one 4x8 f32 tensor) written with the gguf package."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    rng = np.random.default_rng(seed)
    writer.add_tensor("token_embd.weight", rng.standard_normal((4, 8)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def host(gpus: int = 0, arch: str = "sm_90", total: int = H200_TOTAL, free: int | None = H200_FREE,
         driver: str | None = "560.35.03", runtime: str | None = "12.6",
         interconnect: str | None = None, nvlink: int = 18) -> HostFacts:
    """A simulated host: `gpus` identical GPUs (an H200 by default); 0 = a CPU-only machine."""
    if gpus == 0:
        driver = runtime = None
    cards = tuple(GpuFacts(index=i, name="NVIDIA H200", arch=arch, total_memory_bytes=total,
                           free_memory_bytes=free, nvlink_active_links=nvlink)
                  for i in range(gpus))
    if interconnect is None:
        interconnect = "none" if gpus <= 1 else ("nvlink" if nvlink else "pcie")
    return HostFacts(os="Linux", os_release="6.8", machine="x86_64", python="3.11.7",
                     cpu_model="Test CPU", cpu_cores=16, ram_total_bytes=128 * GIB,
                     ram_available_bytes=100 * GIB, gpus=cards, driver_version=driver,
                     cuda_driver_version="12.6" if gpus else None, cuda_runtime_version=runtime,
                     interconnect=interconnect, sources=("json",))


def manifest_dict(cell_id: str, *, serves=None, serves_any: bool = False, backend: str = "engine",
                  formats=("mspec",), rank: int = 10, family: str | None = None,
                  requirements: dict | None = None) -> dict:
    """A valid manifest document (override fields to build invalid ones)."""
    return {
        "id": cell_id,
        "version": "1",
        "backend": backend,
        "serves": [] if serves is None else [dict(s) for s in serves],
        "serves_any": serves_any,
        "artifact_formats": list(formats),
        "family": family,
        "requirements": {} if requirements is None else dict(requirements),
        "rank": rank,
        "weight_profile": "int4",
        "kv_profile": "bf16",
        "context_tiers": [4096, 32768],
        "unsupported_modes": [],
    }


def manifest(cell_id: str, **kwargs):
    from modeld.distribution.manifests import parse_manifest

    return parse_manifest(json.dumps(manifest_dict(cell_id, **kwargs)), f"<{cell_id}>")


H200_REQUIREMENTS = {
    "gpu_archs": ["sm_90"],
    "min_driver": "550.54",
    "cuda_runtime_major": 12,
    "min_total_memory_bytes": 140_000_000_000,
    "min_free_memory_bytes": 60_000_000_000,
    "gpu_count": 1,
}
