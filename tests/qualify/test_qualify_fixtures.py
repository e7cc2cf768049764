"""Golden greedy fixtures: the oracle reproduces HF's tokens exactly (float32) and its top-k logits.

Regenerate: python -m modeld.qualify.fixtures --regenerate
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from modeld.qualify.fixtures import (MAGIC, QWEN_FILE, SMOL_FILE, VERSION, FixtureFormatError,
                                     load_fixture)

FIX = Path(__file__).resolve().parents[1] / "fixtures"
REL_TOL = 1e-4          # float32 top-k logits, relative to the step's max |logit|


def _replay(model, case) -> None:
    """Greedy-decode case's prompt with the oracle; check tokens and every step's top-k logits."""
    state = model.new_state()
    logits = model.forward(case["prompt_ids"], state)[-1]
    for j, (tok, step) in enumerate(zip(case["tokens"], case["steps"])):
        ref = np.array(step["topk_logits"])
        ours = logits[np.array(step["topk_ids"])]
        assert np.max(np.abs(ours - ref)) <= REL_TOL * np.max(np.abs(ref)), f"step {j}"
        assert int(np.argmax(logits)) == tok, f"step {j}: oracle {int(np.argmax(logits))}, HF {tok}"
        logits = model.forward([tok], state)[-1]


def _replay_teacher_forced(model, case) -> None:
    """One forward over prompt + HF's tokens: each position's argmax must be HF's next token.

    Equivalent to greedy replay while the tokens agree (which the asserts establish), at the cost
    of one prefill; the incremental decode path is covered on the small configs."""
    seq = case["prompt_ids"] + case["tokens"][:-1]
    logits = model.forward(seq)[len(case["prompt_ids"]) - 1:]
    for j, (tok, step) in enumerate(zip(case["tokens"], case["steps"])):
        ref = np.array(step["topk_logits"])
        assert np.max(np.abs(logits[j][np.array(step["topk_ids"])] - ref)) <= REL_TOL * np.max(np.abs(ref))
        assert int(np.argmax(logits[j])) == tok, f"step {j}"


def test_qwen3_5_synthetic_fixture(hf_qwen_ckpt):
    import oracle.qwen3_5 as oq
    fx = load_fixture(str(FIX / QWEN_FILE))
    assert fx["family"] == "qwen3_5" and len(fx["cases"]) >= 9
    models = {}
    for case in fx["cases"]:
        key = (case["checkpoint"]["config"], case["checkpoint"]["seed"])
        if key not in models:
            models[key] = oq.load(hf_qwen_ckpt(*key))
        _replay(models[key], case)


def test_smollm2_fixture(smollm2_dir):
    import oracle.llama as ol
    fx = load_fixture(str(FIX / SMOL_FILE))
    model = ol.load(smollm2_dir)
    for case in fx["cases"]:
        _replay_teacher_forced(model, case)


def test_27b_gpu_fixture_header_and_weight_identity():
    """The H200 fixture was made from the same synth weights this machine draws (fingerprint)."""
    fx = load_fixture(str(FIX / "hf_control_qwen3_5_27b_seed0.json"))
    assert fx["model_id"] == "synthetic/qwen3_5-27b-L64-seed0"
    assert fx["control"]["dtype"] == "bfloat16" and fx["control"]["versions"]["transformers"] == "5.17.0"
    assert [len(c["tokens"]) for c in fx["cases"]] == [32, 32, 32]
    assert [len(c["prompt_ids"]) for c in fx["cases"]] == [5, 16, 128]
    assert fx["generate_agrees_with_manual_loop"] is True
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    try:
        from hf_control_27b import prompts, weight_fingerprint
    finally:
        sys.path.pop(0)
    from modeld.convert.qwen3_5_spec import preset
    assert [c["prompt_ids"] for c in fx["cases"]] == prompts(preset("27b").bos_id)
    assert weight_fingerprint(preset("27b"), 0) == fx["checkpoint"]["weight_fingerprint_sha256"]


@pytest.mark.parametrize("edit,match", [
    (lambda f: f.update(magic="nope"), "magic"),
    (lambda f: f.update(format_version=VERSION + 1), "format_version"),
    (lambda f: f.pop("regenerate"), "regenerate"),
    (lambda f: f["cases"][0].pop("steps"), "steps"),
    (lambda f: f["cases"][0]["tokens"].append(1), "steps for"),
])
def test_reader_rejects_malformed_fixtures(tmp_path, edit, match):
    fx = {"magic": MAGIC, "format_version": VERSION, "regenerate": "x", "top_k": 1,
          "cases": [{"prompt_ids": [1], "tokens": [2], "steps": [{"topk_ids": [2], "topk_logits": [0.5]}]}]}
    p = tmp_path / "f.json"
    p.write_text(json.dumps(fx))
    load_fixture(str(p))
    edit(fx)
    p.write_text(json.dumps(fx))
    with pytest.raises(FixtureFormatError, match=match):
        load_fixture(str(p))
    p.write_text("{not json")
    with pytest.raises(FixtureFormatError):
        load_fixture(str(p))
