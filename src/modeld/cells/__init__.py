"""Cells: the explicit mapping from a manifest's backend kind to the code that builds the cell.

Manifests (data) live in `cells/manifests/`. Adding a backend means adding one entry here, in
code: there is no plugin discovery and no string-driven dispatch beyond this table. Imports are
lazy so that `import modeld.cells` stays light.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from modeld.serving.selection import CellOptions, CellSpec


#: Kept equal to `modeld.cells.engine_reference.CELL_ID` (tests/cells checks), so that this module
#: stays light (no torch import to learn one string).
_REFERENCE_CELL_ID = "engine_reference"


def _llama_cpp(spec: CellSpec, options: CellOptions):
    from modeld.cells.llama_cpp import LlamaCppCell

    return LlamaCppCell(
        spec.artifact_path,
        model_id=spec.model_id,
        weights_id=spec.weights_id,
        cell_id=spec.cell_id,
        n_ctx=options.n_ctx,
        n_threads=options.n_threads,
        context_policy=options.context_policy,
        manifest_version=spec.manifest_version,
    )


def _engine(spec: CellSpec, options: CellOptions):
    """Our own engine. The reference cell (manifest id `engine_reference.CELL_ID`, any .mspec,
    reference kernels on the CPU) is bound here by its id; every other engine manifest gets the
    family's specialized cell (Triton on CUDA). Raises EngineFamilyUnsupported for a family the
    engine does not implement."""
    if spec.cell_id == _REFERENCE_CELL_ID:
        from modeld.cells.engine_reference import build as build_reference

        return build_reference(spec, options)
    if spec.family == "qwen3_5":
        from modeld.cells.engine_qwen3_5 import build

        return build(spec, options)
    if spec.family == "llama":
        from modeld.cells.engine_llama import build as build_llama

        return build_llama(spec, options)
    from modeld.cells.errors import EngineFamilyUnsupported

    raise EngineFamilyUnsupported(f"no engine cell for model family {spec.family!r} in this build", param="model")


#: backend kind (manifest `backend`) -> factory(spec, options) -> Cell
CELL_FACTORIES = MappingProxyType({"llama.cpp": _llama_cpp, "engine": _engine})
