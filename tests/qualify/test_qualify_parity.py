"""The parity harness: oracle vs HF per layer on small qwen3_5 checkpoints (both layouts)."""

from __future__ import annotations

import numpy as np
import pytest

from modeld.qualify import parity
from modeld.qualify.parity import TOLERANCES, ParityInputError, compare, run_parity


@pytest.mark.parametrize("config", ["a", "b", "c"])
@pytest.mark.parametrize("mode,scope", [("float32", "end-to-end"), ("bf16", "isolated"),
                                        ("bf16", "end-to-end")])
def test_hf_layout_configs_within_tolerance(hf_qwen_ckpt, config, mode, scope):
    report = run_parity(hf_qwen_ckpt(config), mode, scope=scope)
    assert report.ok, parity.render(report)
    assert report.rows and all(np.isfinite(r.rel) for r in report.rows)
    if scope == "end-to-end":
        assert report.rows[-1].name == "logits"
        assert report.argmax_agreement >= (1.0 if mode == "float32" else 0.9)
    else:                                   # isolated: every layer sub-block of every layer
        n_layers = len({r.name.split(".")[1] for r in report.rows})
        assert len(report.rows) == 6 * n_layers


@pytest.mark.parametrize("preset", ["tiny", "odd"])
def test_released_layout_synth_checkpoints(synth_ckpt, preset):
    d = synth_ckpt(preset)
    for mode in ("float32", "bf16"):
        report = run_parity(d, mode)
        assert report.ok, parity.render(report)


def _acts():
    rng = np.random.default_rng(0)
    return {"layers.0.out": rng.standard_normal((4, 8)).astype(np.float32),
            "layers.1.out": rng.standard_normal((4, 8)).astype(np.float32),
            "logits": rng.standard_normal((4, 16)).astype(np.float32)}


def test_compare_names_the_first_divergence_and_never_passes_nan():
    hf = _acts()
    ours = {k: v.copy() for k, v in hf.items()}
    assert compare(ours, hf, "qwen3_5", "float32").ok
    ours["layers.1.out"][2, 3] += 1e-2
    ours["logits"][0, 0] += 1.0
    rep = compare(ours, hf, "qwen3_5", "float32")
    assert rep.first_divergence == "layers.1.out" and not rep.ok
    ours = {k: v.copy() for k, v in hf.items()}
    ours["layers.0.out"][0, 0] = np.nan
    assert compare(ours, hf, "qwen3_5", "float32").first_divergence == "layers.0.out"
    # bf16 end-to-end gates the logits only
    ours = {k: v.copy() for k, v in hf.items()}
    ours["layers.0.out"] += 1.0
    assert compare(ours, hf, "qwen3_5", "bf16", "end-to-end").ok
    ours["logits"] += 1.0
    assert compare(ours, hf, "qwen3_5", "bf16", "end-to-end").first_divergence == "logits"


def test_tolerance_table_is_documented():
    import pathlib
    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "parity.md").read_text()
    for (mode, scope), tol in TOLERANCES.items():
        assert f"| {mode} | {scope} | {tol:.0e} |" in doc, (mode, scope)


def test_bad_inputs(hf_qwen_ckpt, tmp_path):
    with pytest.raises(ParityInputError):
        run_parity(hf_qwen_ckpt("a"), "float16")
    with pytest.raises(ParityInputError):
        run_parity(hf_qwen_ckpt("a"), "float32", scope="sideways")
    with pytest.raises(ParityInputError):
        parity.detect_family(str(tmp_path))


def test_cli_prints_table_and_exit_code(hf_qwen_ckpt, capsys):
    assert parity.main(["--checkpoint", hf_qwen_ckpt("a"), "--tokens", "12", "--all"]) == 0
    out = capsys.readouterr().out
    assert "layers.3.mixer" in out and "PASS" in out
