"""SmolLM2-135M (real weights) on the llama engine (CPU, reference kernels) against the NumPy
oracle and Hugging Face transformers on the same dequantized weights.

Profiles: bf16 (the HF float32 checkpoint cast to bf16, as HF's bf16 load does) and int4 (the
lossless Q4_1 import: its weights equal HF's float32 dequantization bit for bit, so its
reference is the float32 oracle / HF; only the bf16 activations differ). Bounds are ~2-5x the
values measured on 2026-11-29 (KNOWLEDGE/findings/smollm2-parity-and-quality.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from llama_parity import engine_layers, layer_errors, oracle_capture
from llama_support import compare_greedy, engine_greedy, hf_greedy

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the `oracle` package

EVAL = Path(__file__).resolve().parents[1] / "data" / "eval_text.txt"
# (profile, oracle bf16 emulation, isolated per-layer bound, end-to-end logits bound)
CASES = [("bf16", True, 0.02, 0.06), ("int4", False, 0.08, 0.06)]


@pytest.fixture(scope="module")
def prompt(tokenizer) -> list[int]:
    return tokenizer.encode(EVAL.read_text(encoding="utf-8")[:400])[:40]


@pytest.fixture(scope="module")
def oracle_caps(hf_dir, prompt):
    import oracle.llama

    caps = {}

    def get(emulate: bool):
        if emulate not in caps:
            caps[emulate] = oracle_capture(oracle.llama.load(str(hf_dir), emulate_bf16=emulate), prompt)
        return caps[emulate]

    return get


def test_int4_import_is_lossless(engine, hf_dir):
    """The int4 slots, dequantized by the spec's formula, equal HF's float32 dequantization of the
    GGUF bit for bit (q/k rows un-permuted, Q4_1 nibbles re-packed, d/m kept)."""
    from modeld.execution.sources import SafetensorsDirSource
    from modeld.kernels.linear.quant import dequantize_int4

    eng, src = engine("int4"), SafetensorsDirSource(hf_dir)
    assert eng.load_report.formats == {"bf16": 0, "fp8": 0, "int4": 120}
    for i in (0, 9, 29):
        for slot, parts in ((f"L{i}.attn.qkv", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
                            (f"L{i}.attn.o", ("self_attn.o_proj",)),
                            (f"L{i}.mlp.gate_up", ("mlp.gate_proj", "mlp.up_proj")),
                            (f"L{i}.mlp.down", ("mlp.down_proj",))):
            got = dequantize_int4(*eng.weights.linear(slot).tensors)
            want = torch.cat([src.tensor(f"model.layers.{i}.{p}.weight") for p in parts])
            assert torch.equal(got, want), slot


def test_weights_are_byte_identical_to_the_artifact(engine):
    assert engine("int4").weights.verify_parity() == 7 * 3 * 30 + 62  # 7 quantized linears x 3 tensors per layer, norms, embed


@pytest.mark.parametrize("profile, emulate, iso_bound, _", CASES, ids=[c[0] for c in CASES])
def test_per_layer_isolated_parity(engine, oracle_caps, prompt, profile, emulate, iso_bound, _):
    """Each engine layer, fed the oracle's input to it, matches the oracle's output."""
    cap = oracle_caps(emulate)
    outs, _logits = engine_layers(engine(profile), prompt, cap)
    errs = layer_errors(outs, cap)
    assert len(errs) == 30
    worst = max(errs, key=lambda e: e.rel)
    assert worst.rel <= iso_bound, worst          # measured 0.0049 (bf16), 0.039 (int4, layer 9)
    assert all(np.isfinite(e.rel) for e in errs)


@pytest.mark.parametrize("profile, emulate, _, e2e_bound", CASES, ids=[c[0] for c in CASES])
def test_end_to_end_logits(engine, oracle_caps, prompt, profile, emulate, _, e2e_bound):
    cap = oracle_caps(emulate)
    _outs, logits = engine_layers(engine(profile), prompt, None)
    ref = cap["logits"]
    rel = float(np.abs(logits.numpy() - ref).max() / np.abs(ref).max())
    agree = float((logits.numpy().argmax(-1) == ref.argmax(-1)).mean())
    assert rel <= e2e_bound, rel                  # measured 0.017 / 0.018
    assert agree >= 0.9, agree                    # measured 0.95 / 0.95 (40 positions)


# A divergence is allowed only where the reference's own top-2 margin is at most this: 2 bf16 ulps at
# |logit| in [16, 32), the size of the engine's measured logit error (bf16 weights or activations).
TIE = 0.25


@pytest.mark.parametrize("profile", ["bf16", "int4"])
def test_greedy_matches_hf_float32(engine, profile):
    """Free-running greedy (prefill + decode through the KV cache) against the HF float32 control
    recorded in tests/fixtures/greedy_smollm2.json (same dequantized weights)."""
    from modeld.qualify.fixtures import load_fixture

    fx = load_fixture(str(Path(__file__).resolve().parents[1] / "fixtures" / "greedy_smollm2.json"))
    for case in fx["cases"]:
        n = len(case["tokens"])
        mine, _ = engine_greedy(engine(profile), case["prompt_ids"], n)
        ref_logits = [torch.tensor(sorted(s["topk_logits"], reverse=True)) for s in case["steps"]]
        r = compare_greedy(mine, case["tokens"], ref_logits)
        assert r.first_divergence is None or r.margin_at_divergence <= TIE, (case["prompt_text"], r)


def test_greedy_matches_hf_bf16(engine, hf_model, tokenizer):
    """bf16 engine vs HF bf16 on the same weights, live, with HF's KV cache."""
    hf = hf_model(torch.bfloat16)
    for text in ("The capital of France is", "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"):
        ids = tokenizer.encode(text, parse_special=True)
        ref, ref_logits = hf_greedy(hf, ids, 10)
        mine, _ = engine_greedy(engine("bf16"), ids, 10)
        r = compare_greedy(mine, ref, ref_logits)
        assert r.first_divergence is None or r.margin_at_divergence <= TIE, (text, r)
