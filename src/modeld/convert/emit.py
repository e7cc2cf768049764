"""Write a planned conversion: the .mspec artifact plus OUT.inventory.json and OUT.inventory.txt.

The plan (objects with lazy producers and their inventory rows) comes from the HF converter or
the GGUF importer; this module streams it through `write_mspec` under a progress bar and then
writes the inventory, whose error columns the producers filled in while the payload streamed.
Mutates: creates the three output files. Raises whatever the writer or the producers raise.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from modeld.convert.errors import ModelIdError, OutputExistsError
from modeld.convert.progress import byte_progress
from modeld.convert.recipe import InventoryRow
from modeld.mspec import format as F
from modeld.mspec.directory import Directory
from modeld.mspec.writer import PlannedObject, write_mspec


@dataclass
class ConversionPlan:
    model_id: str
    family: str
    recipe: dict
    metadata: dict
    objects: list[PlannedObject] = field(default_factory=list)
    rows: list[InventoryRow] = field(default_factory=list)


@dataclass(frozen=True)
class EmitResult:
    path: Path
    directory: Directory
    inventory_json: Path
    inventory_txt: Path
    seconds: float


def check_model_id(model_id: str | None) -> str:
    if not model_id or model_id != model_id.strip() or len(model_id.encode()) > 1024 or any(
            ord(c) < 32 or ord(c) == 127 for c in model_id):
        raise ModelIdError(f"invalid or missing model_id {model_id!r}; pass --model-id")
    return model_id


def inventory_paths(out: Path) -> tuple[Path, Path]:
    stem = out.with_suffix("") if out.suffix == ".mspec" else out
    return Path(f"{stem}.inventory.json"), Path(f"{stem}.inventory.txt")


def emit(plan: ConversionPlan, out: str | Path, *, overwrite: bool = False) -> EmitResult:
    out = Path(out)
    inv_json, inv_txt = inventory_paths(out)
    if not overwrite and out.exists():
        raise OutputExistsError(f"{out} exists (pass --force to replace it)")
    total = sum(F.align_up(o.length) for o in plan.objects)
    start = time.perf_counter()
    with byte_progress("convert", total) as bar:
        directory = write_mspec(out, model_id=plan.model_id, family=plan.family, recipe=plan.recipe,
                                metadata=plan.metadata, objects=plan.objects, progress=bar)
    seconds = time.perf_counter() - start
    rows = sorted(plan.rows, key=lambda r: r.name)
    doc = {"model_id": directory.model_id, "weights_id": directory.weights_id,
           "tokenizer_id": directory.tokenizer_id, "family": directory.family, "recipe": dict(directory.recipe),
           "recipe_hash": directory.recipe_hash, "objects": len(directory.objects),
           "payload_bytes": directory.payload_length, "file_bytes": out.stat().st_size,
           "inventory": [r.as_json() for r in rows]}
    inv_json.write_text(json.dumps(doc, indent=1) + "\n")
    inv_txt.write_text(render_table(doc, rows))
    return EmitResult(out, directory, inv_json, inv_txt, seconds)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3e}"


def render_table(doc: dict, rows: list[InventoryRow]) -> str:
    head = [f"model_id     {doc['model_id']}", f"weights_id   {doc['weights_id']}",
            f"tokenizer_id {doc['tokenizer_id']}", f"family       {doc['family']}",
            f"profile      {doc['recipe'].get('profile')}   recipe_hash {doc['recipe_hash']}",
            f"objects      {doc['objects']}   payload {doc['payload_bytes'] / 1e6:.3f} MB", ""]
    cols = ("name", "dtype", "shape", "layout", "MB", "max_abs_err", "rel_fro_err", "source")
    table = [cols] + [(r.name, r.dtype, "x".join(map(str, r.shape)) or "()", r.layout, f"{r.nbytes / 1e6:.3f}",
                       _fmt(r.max_abs_err), _fmt(r.rel_fro_err), r.source) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    return "\n".join(head + lines) + "\n"
