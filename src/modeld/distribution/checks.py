"""Compatibility checks: one cell against one artifact, host and backend set -> list[Rejection].

Every check returns every reason it finds (never a bool, never only the first), with a human
detail such as "needs sm_90, host has none". Pure: reads its arguments only.
The cell argument is duck-typed on `CellManifest`'s attributes, so this module imports no
pydantic.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from modeld.host.facts import HostFacts, version_tuple

if TYPE_CHECKING:
    from modeld.distribution.artifacts import Artifact
    from modeld.distribution.manifests import CellManifest


class Reason(str, enum.Enum):
    """Why a cell was not selected. Values are the names printed to users and in JSON."""

    ARTIFACT_MISSING = "ArtifactMissing"  # no artifact for the request on this host
    ARTIFACT_UNREADABLE = "ArtifactUnreadable"  # present but does not parse
    ARTIFACT_FORMAT_UNSUPPORTED = "ArtifactFormatUnsupported"  # e.g. .mspec on llama.cpp
    MODEL_IDENTITY_MISSING = "ModelIdentityMissing"  # no exact (model_id, weights_id) known
    MODEL_NOT_SERVED = "ModelNotServed"  # identity known but not in the cell's `serves`
    FAMILY_MISMATCH = "FamilyMismatch"
    BACKEND_UNAVAILABLE = "BackendUnavailable"
    GPU_ARCH_UNSUPPORTED = "GpuArchUnsupported"
    DRIVER_TOO_OLD = "DriverTooOld"
    RUNTIME_MISMATCH = "RuntimeMismatch"
    INSUFFICIENT_TOTAL_MEMORY = "InsufficientTotalMemory"
    INSUFFICIENT_FREE_MEMORY = "InsufficientFreeMemory"
    TOO_FEW_GPUS = "TooFewGpus"
    INTERCONNECT_MISMATCH = "InterconnectMismatch"
    OUTRANKED = "Outranked"  # compatible, but another compatible cell wins on (rank, id)
    SPECIALIZED_CELL_SELECTED = "SpecializedCellSelected"  # general cell not needed


@dataclass(frozen=True, slots=True)
class Rejection:
    cell_id: str
    reason: Reason
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"cell_id": self.cell_id, "reason": self.reason.value, "detail": self.detail}

    def __str__(self) -> str:
        return f"{self.cell_id}: {self.reason.value}: {self.detail}"


def gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def check_artifact(cell: CellManifest, artifact: Artifact | None, request: str) -> list[Rejection]:
    """Artifact presence, readability, format and family."""
    if artifact is None:
        return [Rejection(cell.id, Reason.ARTIFACT_MISSING,
                          f"no artifact named {request!r} is installed on this host "
                          "(resolution never downloads)")]
    if not artifact.present:
        return [Rejection(cell.id, Reason.ARTIFACT_MISSING,
                          f"{artifact.name!r} is registered but {artifact.path} is not on this host")]
    if not artifact.readable:
        return [Rejection(cell.id, Reason.ARTIFACT_UNREADABLE, artifact.problem or "unreadable")]
    out = []
    if artifact.format not in cell.artifact_formats:
        out.append(Rejection(cell.id, Reason.ARTIFACT_FORMAT_UNSUPPORTED,
                             f"loads {'/'.join(cell.artifact_formats)}, artifact is "
                             f"{artifact.format}"))
    if cell.family is not None and artifact.family is not None and artifact.family != cell.family:
        out.append(Rejection(cell.id, Reason.FAMILY_MISMATCH,
                             f"serves family {cell.family}, artifact is {artifact.family}"))
    return out


def check_serves(cell: CellManifest, artifact: Artifact | None) -> list[Rejection]:
    """Exact (model_id, weights_id) membership in `serves`; general cells (serves_any) pass."""
    if cell.serves_any or artifact is None or not artifact.present or not artifact.readable:
        return []
    identity = artifact.identity
    if identity is None:
        why = artifact.problem or "the artifact has no weights identity"
        return [Rejection(cell.id, Reason.MODEL_IDENTITY_MISSING,
                          f"a specialized cell needs the exact (model_id, weights_id); {why}")]
    if not cell.serves_identity(identity):
        served = ", ".join(s.model_id for s in cell.serves)
        return [Rejection(cell.id, Reason.MODEL_NOT_SERVED,
                          f"serves {served}; artifact is {identity.model_id} "
                          f"({identity.weights_id[:19]}...)")]
    return []


def check_backend(cell: CellManifest, backends_available: Collection[str]) -> list[Rejection]:
    kind = _value(cell.backend)
    if kind not in backends_available:
        have = ", ".join(sorted(backends_available)) or "none"
        return [Rejection(cell.id, Reason.BACKEND_UNAVAILABLE,
                          f"needs backend {kind}, this host has {have}")]
    return []


def check_host(cell: CellManifest, host: HostFacts) -> list[Rejection]:
    """GPU count, arch, driver, CUDA runtime, per-GPU total/free memory, interconnect."""
    req = cell.requirements
    need = req.gpu_count
    if need == 0:
        return []  # manifest validation guarantees no GPU requirement is set without a GPU count
    out: list[Rejection] = []

    def reject(reason: Reason, detail: str) -> None:
        out.append(Rejection(cell.id, reason, detail))

    if host.gpu_count < need:
        reject(Reason.TOO_FEW_GPUS, f"needs {need} GPU(s), host has {host.gpu_count}")
    pool = list(host.gpus)
    if req.gpu_archs:
        pool = [gpu for gpu in host.gpus if gpu.arch in req.gpu_archs]
        if len(pool) < need:
            have = ", ".join(gpu.arch for gpu in host.gpus) or "none"
            reject(Reason.GPU_ARCH_UNSUPPORTED,
                   f"needs {need}x {' or '.join(req.gpu_archs)}, host has {have}")
        pool = pool or list(host.gpus)  # still report memory against the GPUs that exist
    if req.min_driver is not None:
        have_driver = host.driver_version
        if have_driver is None or version_tuple(have_driver) < version_tuple(req.min_driver):
            reject(Reason.DRIVER_TOO_OLD,
                   f"needs driver >= {req.min_driver}, host has {have_driver or 'none'}")
    if req.cuda_runtime_major is not None:
        runtime = host.cuda_runtime_version
        if runtime is None or version_tuple(runtime)[0] != req.cuda_runtime_major:
            reject(Reason.RUNTIME_MISMATCH,
                   f"needs CUDA runtime {req.cuda_runtime_major}.x, host has {runtime or 'none'}")
    if req.min_total_memory_bytes:
        fits = [g for g in pool if g.total_memory_bytes >= req.min_total_memory_bytes]
        if len(fits) < need:
            best = max((g.total_memory_bytes for g in pool), default=None)
            reject(Reason.INSUFFICIENT_TOTAL_MEMORY,
                   f"needs {gib(req.min_total_memory_bytes)} on each of {need} GPU(s), "
                   f"host's largest has {gib(best) if best is not None else 'none (no GPU)'}")
    if req.min_free_memory_bytes:
        fits = [g for g in pool if (g.free_memory_bytes or 0) >= req.min_free_memory_bytes]
        if len(fits) < need:
            known = [g.free_memory_bytes for g in pool if g.free_memory_bytes is not None]
            have = (gib(max(known)) if known
                    else "unknown (no NVML)" if pool else "none (no GPU)")
            reject(Reason.INSUFFICIENT_FREE_MEMORY,
                   f"needs {gib(req.min_free_memory_bytes)} free on each of {need} GPU(s), "
                   f"host's most free has {have}")
    wanted = _value(req.interconnect)
    if wanted != "any" and host.interconnect != wanted:
        reject(Reason.INTERCONNECT_MISMATCH,
               f"needs {wanted} between its {need} GPUs, host has {host.interconnect}")
    return out


def cell_rejections(
    cell: CellManifest,
    artifact: Artifact | None,
    host: HostFacts,
    backends_available: Collection[str],
    request: str,
) -> list[Rejection]:
    """All reasons `cell` cannot serve `artifact` on `host` (empty = compatible)."""
    return (check_artifact(cell, artifact, request) + check_serves(cell, artifact)
            + check_backend(cell, backends_available) + check_host(cell, host))


def _value(member: Any) -> str:
    return member.value if isinstance(member, enum.Enum) else str(member)
