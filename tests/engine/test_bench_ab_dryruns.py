"""bench/engine_ab.py and bench/rung6_flip_rate.py end to end on CPU (tiny preset, reference kernels): every
stage runs, the numbers they report are consistent, and bad --variant text is refused."""

from __future__ import annotations

import json

from test_cert_dryrun import BENCH, _run

TINY = ["--device", "cpu", "--config", "tiny", "--workers", "2"]


def test_engine_ab_dry_run(tmp_path):
    out = tmp_path / "ab"
    r = _run([str(BENCH / "engine_ab.py"), "--out", str(out), "--variant", "off:MODELD_PDL=0",
              "--variant", "on:MODELD_PDL=1,MODELD_GEMV_SPLIT_FINISH=kernel", "--steps", "2", "--tokens", "3", *TINY], 240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads((out / "engine_ab.json").read_text())
    assert not doc["errors"], doc["errors"]
    assert doc["variants"] == {"off": {"MODELD_PDL": "0"}, "on": {"MODELD_PDL": "1", "MODELD_GEMV_SPLIT_FINISH": "kernel"}}
    for p in ("int4", "bf16"):
        v = doc["stages"][f"ab_{p}"]["variants"]
        assert set(v) == {"off", "on"} and all(len(x["runs"]) == 2 for x in v.values())
        assert v["off"]["max_abs_logit_diff_vs_baseline"] == 0.0
        # on the CPU reference kernels neither switch changes a number
        assert v["on"]["max_abs_logit_diff_vs_baseline"] == 0.0
        assert v["on"]["tok_per_s_p50_best"] == max(x["tok_per_s_p50"] for x in v["on"]["runs"]) > 0


def test_engine_ab_rejects_bad_variant(tmp_path):
    r = _run([str(BENCH / "engine_ab.py"), "--out", str(tmp_path), "--variant", "nameonly=1", *TINY], 60)
    assert r.returncode != 0 and "--variant" in r.stderr


def test_rung6_flip_rate_dry_run(tmp_path):
    out = tmp_path / "fr"
    r = _run([str(BENCH / "rung6_flip_rate.py"), "--out", str(out), "--cases", "2", "--tokens", "5",
              "--variants", "v2,hmma", "--steps", "2", *TINY], 240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads((out / "rung6_flip_rate.json").read_text())
    assert not doc["errors"], doc["errors"]
    S = doc["stages"]
    for name in ("bf16", "int4:v2", "int4:hmma"):
        m = S[name]
        assert m["positions"] == 2 * 5
        assert m["argmax_agree"] + m["near_tie_disagreements"] + m["other_disagreements"] == m["positions"]
        assert len(m["other_flips"]) == m["other_disagreements"]
    assert S["int4_build_hmma"]["info"]["int4_gemv"] == "hmma" and S["int4_build_v2"]["info"]["int4_gemv"] == "v2"
