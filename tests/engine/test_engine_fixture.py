"""The engine (bf16, reference kernels) against the project's golden HF float32 greedy fixture
(tests/fixtures/greedy_qwen3_5_hf_synthetic.json: configs a/b/c of modeld.qualify.hf_synthetic,
prompts of 1, 7 and 70 tokens, 16 greedy tokens, top-5 logits per step). Teacher-forced on the
fixture's tokens; a disagreement must be a near-tie (the engine's pick is in HF's top-5 within
2 bf16 ulps + that step's top-5 logit error of HF's top logit)."""

from __future__ import annotations

import os

import pytest
import torch

from modeld.execution.sources import SafetensorsDirSource
from modeld.models.qwen3_5.config import Qwen35Config
from modeld.models.qwen3_5.engine import EngineOptions, Qwen35Engine

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "greedy_qwen3_5_hf_synthetic.json")


@pytest.fixture(scope="module")
def fixture():
    from modeld.qualify.fixtures import load_fixture

    if not os.path.exists(FIXTURE):
        pytest.skip("golden fixture not present")
    return load_fixture(FIXTURE)


@pytest.mark.parametrize("config", ["a", "b", "c"])
def test_engine_matches_hf_fp32_fixture(fixture, tmp_path, config):
    from modeld.qualify.hf_synthetic import make_checkpoint

    cases = [c for c in fixture["cases"] if c["checkpoint"]["config"] == config]
    seed = cases[0]["checkpoint"]["seed"]
    # bf16 storage holds exactly the fixture's (bf16-representable) weights
    d = make_checkpoint(str(tmp_path / config), config, seed, storage="bfloat16")
    cfg = Qwen35Config.from_file(os.path.join(d, "config.json"))
    eng = Qwen35Engine(cfg, SafetensorsDirSource(d), "cpu", options=EngineOptions(capacity=128))
    worst, agree, total = 0.0, 0, 0
    for case in cases:
        eng.reset_slot(0)
        logits = eng.prefill(0, case["prompt_ids"])
        for j, (tok, step) in enumerate(zip(case["tokens"], case["steps"])):
            ids, ref = torch.tensor(step["topk_ids"]), torch.tensor(step["topk_logits"])
            err = float((logits[ids] - ref).abs().max())
            worst = max(worst, err)
            pick = int(logits.argmax())
            total += 1
            if pick == tok:
                agree += 1
            else:
                assert pick in step["topk_ids"], (case["prompt_ids"][:3], j, pick)
                gap = ref[0] - ref[step["topk_ids"].index(pick)]
                assert gap <= 0.125 + err, (j, float(gap), err)
            if j + 1 < len(case["tokens"]):
                logits = eng.decode([tok])[0]
    print(f"config {config}: {agree}/{total} greedy steps agree, max top-5 logit err {worst:.3f}")
    assert worst < 0.5 and agree >= total - 3
