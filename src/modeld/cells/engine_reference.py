"""The reference engine cell: any .mspec of a family the engine implements, on the CPU, on the
PyTorch reference kernels (manifest `cells/manifests/engine_reference.json`).

Why it exists: a specialized cell lists exact (model_id, weights_id) pairs and needs its GPU, and
llama.cpp cannot read an .mspec, so without this cell an .mspec no specialized cell lists (a new
conversion, a synthetic checkpoint, any artifact on a CPU host) could not be run at all. The
engine's CPU correctness on the reference kernels is what CI proves (parity with the NumPy
oracles and HF), so this cell is correct but *uncertified* and slow: it always binds
`reference_kernels()` on the CPU, whatever GPUs the host has, because a Triton binding on an
unlisted (model, GPU) pair is exactly what certification exists to rule out.

It can never displace a certified cell: it is `serves_any` (a general cell), and the resolver
only falls through to general cells when no specialized cell passes every check.
The specialized factories (`engine_qwen3_5.build`, `engine_llama.build`) keep Triton on CUDA.
"""

from __future__ import annotations

from modeld.cells.errors import EngineFamilyUnsupported

#: The manifest id that `modeld.cells._engine` routes here (bound in code, not discovered).
CELL_ID = "engine_reference"
#: Model families the engine implements, i.e. what this cell can run.
FAMILIES = ("llama", "qwen3_5")


def build(spec, options):
    """Factory for the reference cell (backend "engine", cell id `CELL_ID`): the family's engine
    cell on device "cpu" with a fresh `reference_kernels()` binding. Reads the artifact (loads
    its weights into CPU memory). Raises EngineFamilyUnsupported for a family the engine does
    not implement, then whatever the family's cell raises for a bad artifact."""
    if spec.family not in FAMILIES:
        raise EngineFamilyUnsupported(
            f"{spec.artifact_path}: the {CELL_ID} cell runs model families {', '.join(FAMILIES)}; "
            f"this artifact's family is {spec.family!r}", param="model")
    import torch

    from modeld.execution.bindings import reference_kernels

    cpu = torch.device("cpu")
    if spec.family == "qwen3_5":
        from modeld.cells.engine_qwen3_5 import build as build_qwen3_5

        return build_qwen3_5(spec, options, device=cpu, kernels=reference_kernels())
    from modeld.cells.engine_llama import build as build_llama

    return build_llama(spec, options, device=cpu, kernels=reference_kernels())
