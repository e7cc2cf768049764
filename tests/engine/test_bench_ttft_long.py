"""bench/ttft_long.py end to end on CPU (tiny preset, reference kernels): the cold and warm-prefix TTFT stages run
for every profile, the warm hit's logits equal a cold prefill of prefix + suffix bit for bit (the reuse-is-exact
check the GPU run records), --kernel-table's profiles are recorded, HF's cache continuation agrees with the bf16
engine, and bad lengths are refused."""

from __future__ import annotations

import json

import torch
from test_cert_dryrun import BENCH, _run

TINY = ["--device", "cpu", "--config", "tiny", "--workers", "2"]


def test_ttft_long_dry_run(tmp_path):
    out = tmp_path / "tl"
    r = _run([str(BENCH / "ttft_long.py"), "--out", str(out), "--long", "96", "--prefix", "64", "--suffix", "5",
              "--chunk", "32", "--runs", "2", "--kernel-table", "4", *TINY], 300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads((out / "ttft_long.json").read_text())
    assert not doc["errors"], doc["errors"]
    hf = doc["stages"]["hf_long"]
    assert hf["cold"]["tokens"] == 96 and len(hf["warm"]["runs_s"]) == 2 and hf["warm"]["best_s"] > 0
    for p in ("bf16", "fp8", "int4"):
        e = doc["stages"][f"engine_{p}"]
        assert e["warm_equals_cold"] and e["warm_vs_cold_logits_max_abs"] == 0.0, e
        w = e["warm"]
        assert (w["prefix"], w["suffix"], len(w["runs_s"])) == (64, 5, 2)
        assert w["best_s"] == min(w["runs_s"]) >= w["suffix_prefill_best_s"] > 0 and w["restore_best_s"] > 0
        assert e["cold"]["best_s"] == min(e["cold"]["runs_s"]) > 0
        for t in (e["warm_kernel_table"], e["cold_kernel_table"]):  # CPU: self CPU time of the top ops
            assert 0 < len(t["top"]) <= 4 and t["summed_ms_per_run"] >= sum(r["ms_per_run"] for r in t["top"]) > 0
            assert t["launches_per_run"] >= len(t["top"])
        assert e["warm_kernel_table"]["suffix_prefill_wall_s"] == w["suffix_prefill_best_s"]
    # HF's cache, deep-copied and continued by the suffix, gives the bf16 engine's next token
    assert doc["stages"]["engine_bf16"]["warm_vs_hf"]["argmax_equal"]
    assert doc["stages"]["engine_bf16"]["warm_vs_hf"]["max_abs"] < 1.0


def test_ttft_long_with_the_suffix_bucket(tmp_path):
    """--suffix-bucket: the warm hit's suffix and the cold run's last piece both take the padded step, and reuse
    stays exact; --save-cold-logits writes the cold run's last-token logits."""
    out = tmp_path / "tl"
    r = _run([str(BENCH / "ttft_long.py"), "--out", str(out), "--long", "40", "--prefix", "32", "--suffix", "5",
              "--chunk", "32", "--runs", "1", "--profiles", "bf16", "--no-hf", "--suffix-bucket", "8",
              "--save-cold-logits", str(tmp_path / "cold"), *TINY], 240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    e = json.loads((out / "ttft_long.json").read_text())["stages"]["engine_bf16"]
    assert e["warm_equals_cold"] and e["warm_vs_cold_logits_max_abs"] == 0.0, e
    # --save-cold-logits: the cold prefill's last-token logits, one fp32 row of the vocabulary
    logits = torch.load(tmp_path / "cold.bf16.pt")
    assert logits.dtype == torch.float32 and logits.dim() == 1 and logits.numel() > 100
    assert bool(torch.isfinite(logits).all())


def test_ttft_long_cold_ab_alternates_variants_with_the_default(tmp_path):
    """--cold-ab: each variant's cold runs beside the default's in one process; a switch the reference kernels ignore
    gives the default's logits exactly, a smaller prefill chunk runs and is recorded."""
    out = tmp_path / "tl"
    r = _run([str(BENCH / "ttft_long.py"), "--out", str(out), "--long", "40", "--prefix", "32", "--suffix", "5",
              "--chunk", "32", "--runs", "2", "--profiles", "bf16", "--no-hf", "--cold-ab",
              "MODELD_GDN_PREP=product+MODELD_ATTN_CAUSAL_LOOP=split,chunk=16", *TINY], 240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ab = json.loads((out / "ttft_long.json").read_text())["stages"]["engine_bf16"]["cold_ab"]
    assert len(ab["default"]["runs_s"]) == 2
    env, chunk = ab["variants"]["MODELD_GDN_PREP=product+MODELD_ATTN_CAUSAL_LOOP=split"], ab["variants"]["chunk=16"]
    assert env["logits_max_abs"] == 0.0 and len(env["runs_s"]) == 2 and env["ratio_best"] > 0
    assert chunk["logits_max_abs"] < 0.5 and chunk["best_s"] == min(chunk["runs_s"]) > 0


def test_ttft_long_refuses_a_bad_cold_ab(tmp_path):
    r = _run([str(BENCH / "ttft_long.py"), "--out", str(tmp_path), "--cold-ab", "PATH=/tmp", *TINY], 60)
    assert r.returncode == 2 and "only MODELD_* switches" in r.stderr


def test_ttft_long_refuses_a_prefix_off_the_chunk_grid(tmp_path):
    r = _run([str(BENCH / "ttft_long.py"), "--out", str(tmp_path), "--prefix", "100", "--chunk", "32", *TINY], 60)
    assert r.returncode == 2 and "--chunk must divide --prefix" in r.stderr
