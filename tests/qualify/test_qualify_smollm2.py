"""SmolLM2-135M-Instruct (real weights): oracle vs HF parity and the quality metrics, on short text."""

from __future__ import annotations

import numpy as np

from modeld.qualify.parity import render, run_parity
from modeld.qualify.quality import EVAL_TEXT, evaluate

PROMPT = "The quick brown fox jumps over the lazy dog. Why is the sky blue?"


def _ids(d):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(d)(PROMPT)["input_ids"]


def test_float32_end_to_end_parity(smollm2_dir):
    rep = run_parity(smollm2_dir, "float32", _ids(smollm2_dir))
    assert rep.ok and rep.argmax_agreement == 1.0, render(rep)
    assert len(rep.rows) == 1 + 7 * 30 + 2           # embed, 30 layers x 7, norm, logits


def test_bf16_isolated_parity(smollm2_dir):
    rep = run_parity(smollm2_dir, "bf16", _ids(smollm2_dir)[:10])
    assert rep.ok, render(rep)


def test_quality_metrics_agree_on_a_window(smollm2_dir):
    text = open(EVAL_TEXT, encoding="utf-8").read()
    r = evaluate(smollm2_dir, text, window=96, max_tokens=96)
    assert r.predictions == 95 and r.windows == 1
    assert abs(r.ppl_oracle - r.ppl_hf) <= 1e-4 * r.ppl_hf
    assert r.argmax_agreement == 1.0 and r.top1_oracle == r.top1_hf
    assert 1.0 < r.ppl_oracle < 100.0 and np.isfinite(r.max_logit_abs_diff)
