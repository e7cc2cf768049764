"""From a model name to a constructed cell: T3's resolver, then an explicit backend mapping.

Selection itself is T3's pure `resolve` (never downloads, reports every rejection); this module
only turns its decision into a `CellSpec` and builds the cell through `modeld.cells.CELL_FACTORIES`
(plus any factories a caller passes, e.g. the test-only null cell). No plugin discovery.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modeld.serving.errors import Fallback, InvalidRequest

CellFactory = Callable[["CellSpec", "CellOptions"], Any]


@dataclass(frozen=True)
class CellOptions:
    """Serving-side knobs that are not part of the model's identity."""

    n_ctx: int = 2048
    context_policy: str = "clamp"
    n_threads: int | None = None


@dataclass(frozen=True)
class CellSpec:
    """The selected cell and artifact, as the factories need them."""

    backend: str  # manifest backend kind: "llama.cpp" | "engine" | "null"
    cell_id: str
    manifest_version: str
    model_id: str
    weights_id: str
    artifact_path: str
    fell_through: bool
    request: str
    family: str | None = None  # model family (manifest's, else the artifact's), e.g. "qwen3_5"
    rejections: tuple[dict[str, str], ...] = field(default=())


def select_cell(
    model: str,
    *,
    home: Path | None = None,
    extra_backends: frozenset[str] = frozenset(),
    require_cell: str | None = None,
) -> CellSpec:
    """Resolve `model` on this host. Raises T3's ModelNotFound / ArtifactMissing / NoCellCanServe,
    InvalidRequest for a malformed name, and Fallback when `require_cell` names a cell that was
    not selected."""
    if not isinstance(model, str) or not model or model.strip() != model or len(model) > 1024:
        raise InvalidRequest("model must be a non-empty name without surrounding spaces", param="model")
    from modeld.distribution import resolve_on_this_host
    from modeld.distribution.this_host import detect_backends

    resolution = resolve_on_this_host(model, home=home, backends=detect_backends() | extra_backends)
    resolution.require()
    cell, artifact = resolution.cell, resolution.artifact
    if require_cell is not None and cell.id != require_cell:
        reasons = "; ".join(str(r) for r in resolution.rejections_for(require_cell)) or "not installed"
        raise Fallback(f"cell {require_cell!r} cannot serve {model!r} ({reasons}); "
                       f"selection fell through to {cell.id!r}", param="model")
    backend = getattr(cell.backend, "value", cell.backend)
    return CellSpec(
        backend=str(backend),
        cell_id=cell.id,
        manifest_version=cell.version,
        model_id=artifact.model_id or f"unidentified:{Path(artifact.path).name}",
        weights_id=artifact.weights_id or "unknown",
        artifact_path=artifact.path,
        fell_through=resolution.fell_through,
        request=model,
        family=cell.family or artifact.family,
        rejections=tuple(r.to_dict() for r in resolution.rejections),
    )


def build_cell(spec: CellSpec, options: CellOptions, extra_factories: Mapping[str, CellFactory] | None = None):
    """Construct the cell for `spec` from the explicit backend mapping. Raises Unsupported when
    no factory is known for the backend kind."""
    from modeld.cells import CELL_FACTORIES
    from modeld.serving.errors import Unsupported

    factories = dict(CELL_FACTORIES)
    factories.update(extra_factories or {})
    factory = factories.get(spec.backend)
    if factory is None:
        raise Unsupported(f"no cell implementation for backend {spec.backend!r} in this build", param="model")
    return factory(spec, options)
