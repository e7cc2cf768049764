"""A shipped engine cell serves only certified artifacts: every (model_id, weights_id) in a built-in engine manifest
is the CPU-computed identity of a recipe (bench/artifact_qwen3_5_27b.expected.json) and has a certification record in
certs/ whose gate passed for exactly that weights_id, named in the manifest's description."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from modeld.distribution.manifests import builtin_manifest_dir, load_manifests

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = json.loads((ROOT / "bench" / "artifact_qwen3_5_27b.expected.json").read_text())
IDENTITIES = {(v["model_id"], v["weights_id"]) for k, v in EXPECTED.items() if not k.startswith("_")}
ENGINE_27B = [m for m in load_manifests(builtin_dir=builtin_manifest_dir(), include_user=False)
              if m.id.startswith("engine_qwen3_5_27b")]


def _passing_records() -> dict[str, set[tuple[str, str]]]:
    """certs/engine-*.json file name -> the identities its passing gate certifies."""
    out: dict[str, set[tuple[str, str]]] = {}
    for path in (ROOT / "certs").glob("engine-qwen3_5-27b-synthetic-*-h200.json"):
        rec = json.loads(path.read_text())
        gate = rec.get("gate")
        if isinstance(gate, dict) and gate.get("pass") is True and rec.get("weights", {}).get("weights_id"):
            out[path.name] = {(rec["model_id"], rec["weights"]["weights_id"])}
    return out


def test_there_are_27b_engine_cells() -> None:
    assert {m.id for m in ENGINE_27B} >= {f"engine_qwen3_5_27b_{p}" for p in ("bf16", "fp8", "int4")}


@pytest.mark.parametrize("manifest", ENGINE_27B, ids=lambda m: m.id)
def test_each_served_artifact_is_a_known_recipe_with_a_passing_record(manifest) -> None:
    records = _passing_records()
    named = set(re.findall(r"certs/(engine-[\w.-]+\.json)", manifest.description))
    assert named, f"{manifest.id}: the description names no certification record"
    certified = set().union(*(records.get(n, set()) for n in named))
    for served in manifest.serves:
        ident = (served.model_id, served.weights_id)
        assert ident in IDENTITIES, f"{manifest.id}: {ident} is no recipe's CPU identity"
        assert ident in certified, f"{manifest.id}: {ident} has no passing record among {sorted(named)}"


def test_the_cells_table_counts_a_models_artifacts() -> None:
    """`modeld cells` lists a model once per cell, with how many of its artifacts the cell serves."""
    from modeld.distribution.render import _served_models

    fp8 = next(m for m in ENGINE_27B if m.id == "engine_qwen3_5_27b_fp8")
    bf16 = next(m for m in ENGINE_27B if m.id == "engine_qwen3_5_27b_bf16")
    assert _served_models(fp8) == "synthetic/qwen3_5-27b-L64-seed0 (2 artifacts)"
    assert _served_models(bf16) == "synthetic/qwen3_5-27b-L64-seed0"
