"""The impure edge of resolution: gather this host's facts, registry, manifests and backends,
then call the pure `resolve`.

Reads files (registry, manifests, the requested artifact: hashed once, then cached) and probes
hardware; never downloads, never writes except the weights-id cache.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from modeld.distribution.artifacts import Artifact, inspect_artifact
from modeld.distribution.identity import ModelIdentity, ProgressCallback
from modeld.distribution.registry import all_refs, find_ref
from modeld.distribution.resolver import Resolution, resolve
from modeld.host import HostFacts, probe_host

if TYPE_CHECKING:
    from modeld.distribution.manifests import CellManifest

# Which importable packages make a backend kind usable. "null" is a test fixture: never real.
_BACKEND_MODULES = {"llama.cpp": ("llama_cpp",), "engine": ("torch", "triton")}


def detect_backends() -> frozenset[str]:
    """Backend kinds whose packages are installed (found, not imported: stays fast)."""
    found = set()
    for kind, modules in _BACKEND_MODULES.items():
        try:
            if all(importlib.util.find_spec(m) is not None for m in modules):
                found.add(kind)
        except (ImportError, ValueError):
            continue
    return frozenset(found)


def artifact_for(
    request: str | ModelIdentity,
    home: Path | None = None,
    progress: ProgressCallback | None = None,
) -> list[Artifact]:
    """The installed artifact(s) that can answer `request`, inspected (may hash, cached).

    A name yields at most one artifact (no other file is read); a ModelIdentity needs every
    known artifact's identity, so all are inspected. Raises RegistryError/UnsafePath for a
    broken registry.
    """
    if isinstance(request, ModelIdentity):
        refs = all_refs(home)
    else:
        ref = find_ref(request, home)
        refs = [] if ref is None else [ref]
    return [inspect_artifact(ref.path, names=ref.names, origin=ref.origin, model_id=ref.model_id,
                             home=home, progress=progress) for ref in refs]


def resolve_on_this_host(
    request: str | ModelIdentity,
    *,
    home: Path | None = None,
    host: HostFacts | None = None,
    manifests: Sequence[CellManifest] | None = None,
    backends: frozenset[str] | None = None,
    progress: ProgressCallback | None = None,
) -> Resolution:
    """Resolve `request` with real facts; any of host/manifests/backends may be overridden
    (e.g. a simulated host from `--host-json`). Does not raise for an unservable request
    (call `.require()`); raises InvalidManifest, RegistryError, UnsafePath for broken inputs."""
    from modeld.distribution.manifests import load_manifests

    if manifests is None:
        manifests = load_manifests(user_dir=None if home is None else home / "cells")
    if host is None:
        host = probe_host()
    if backends is None:
        backends = detect_backends()
    artifacts = artifact_for(request, home, progress)
    return resolve(request, host, artifacts, manifests, backends)


def all_artifacts(home: Path | None = None,
                  progress: ProgressCallback | None = None) -> list[Artifact]:
    """Every named artifact (built-ins, then the registry), inspected (hashes once, cached)."""
    return [inspect_artifact(ref.path, names=ref.names, origin=ref.origin, model_id=ref.model_id,
                             home=home, progress=progress) for ref in all_refs(home)]
