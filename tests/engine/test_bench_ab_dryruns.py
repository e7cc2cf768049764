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


def test_engine_ab_dry_run_with_slots(tmp_path):
    """--slots 2: every decode step carries one token per slot, tok/s counts both, the logit check still runs."""
    out = tmp_path / "ab"
    r = _run([str(BENCH / "engine_ab.py"), "--out", str(out), "--variant", "skinny:MODELD_GEMV_INT4=v2",
              "--variant", "hmma:MODELD_GEMV_INT4=hmma", "--profiles", "int4", "--slots", "2", "--rounds", "1",
              "--steps", "2", "--tokens", "3", *TINY], 240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads((out / "engine_ab.json").read_text())
    assert not doc["errors"], doc["errors"]
    v = doc["stages"]["ab_int4"]["variants"]
    assert v["hmma"]["max_abs_logit_diff_vs_baseline"] == 0.0  # reference kernels on CPU: no switch applies
    run = v["hmma"]["runs"][0]
    assert abs(run["tok_per_s_p50"] * run["p50_s"] - 2) < 1e-6


def test_engine_ab_dry_run_with_sampling(tmp_path):
    """--sampling: every timed step picks through SlotSampler (here its top-k path against the sort)."""
    out = tmp_path / "ab"
    r = _run([str(BENCH / "engine_ab.py"), "--out", str(out), "--variant", "sort:MODELD_SAMPLER_TOPK=0",
              "--variant", "topk:MODELD_SAMPLER_TOPK=1", "--profiles", "bf16", "--slots", "2", "--rounds", "1",
              "--steps", "2", "--tokens", "3", "--sampling", "0.7,20,0.8", *TINY], 240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads((out / "engine_ab.json").read_text())
    assert not doc["errors"], doc["errors"]
    assert set(doc["stages"]["ab_bf16"]["variants"]) == {"sort", "topk"}
    bad = _run([str(BENCH / "engine_ab.py"), "--out", str(tmp_path), "--variant", "a:MODELD_PDL=0",
                "--sampling", "0.7,20", *TINY], 60)
    assert bad.returncode != 0 and "--sampling" in bad.stderr


def test_engine_ab_rejects_bad_variant(tmp_path):
    r = _run([str(BENCH / "engine_ab.py"), "--out", str(tmp_path), "--variant", "nameonly=1", *TINY], 60)
    assert r.returncode != 0 and "--variant" in r.stderr


def test_engine_ab_variant_values_may_hold_commas():
    """A comma starts a new pair only before KEY=: the GDN tile value "32,4" stays whole; a stray piece is refused."""
    import importlib.util
    import sys
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("engine_ab", BENCH / "engine_ab.py")
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    assert ab.variant("t:MODELD_GDN_BATCH_TILE=32,4,MODELD_PDL=0") == (
        "t", {"MODELD_GDN_BATCH_TILE": "32,4", "MODELD_PDL": "0"})
    assert ab.variant("a:MODELD_PDL=0,MODELD_GEMV_INT4=hmma") == ("a", {"MODELD_PDL": "0", "MODELD_GEMV_INT4": "hmma"})
    for bad in ("a:,4", "a:", ":K=V", "a:=1"):
        try:
            ab.variant(bad)
        except Exception as e:
            assert "--variant" in str(e)
        else:
            raise AssertionError(bad)


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


def test_engine_whatif_dry_run(tmp_path):
    """Every what-if variant builds and times; the stand-ins leave the real kernel modules restored afterwards
    (the base of round 2 runs after every variant of round 1, and its logits table still has the real ops)."""
    out = tmp_path / "wi"
    r = _run([str(BENCH / "engine_whatif.py"), "--out", str(out), "--steps", "2", *TINY], 240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads((out / "engine_whatif.json").read_text())
    assert not doc["errors"], doc["errors"]
    s = doc["stages"]["whatif_int4"]
    names = ["base", "norms", "gated_norm", "rope", "conv", "ba", "gdn", "attn", "small"]
    assert list(s["runs"]) == names and all(len(v) == 2 for v in s["runs"].values())
    assert set(s["saving_us"]) == set(names) - {"base"}
    assert set(s["host_us"]) == {"sync_round_trip", "decode_inputs", "argmax_item"}
    for runs in s["runs"].values():
        for x in runs:
            assert x["replay_only_s"] > 0 and x["decode_argmax_item_s"] > 0
    assert s["base_kernel_table"] and all(x["graph_error"] is None for v in s["runs"].values() for x in v)


def test_engine_whatif_stand_ins_are_restored_and_keep_the_lm_head():
    """`_dropped` swaps the kernel functions only inside its block (also when the block raises), and the ba
    stand-in still runs the real linear for the lm_head's fp32 output."""
    import importlib.util

    import pytest
    import torch

    from modeld.execution.bindings import reference_kernels

    spec = importlib.util.spec_from_file_location("engine_whatif", BENCH / "engine_whatif.py")
    wi = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wi)
    ks = reference_kernels()
    real = {n: getattr(m, n) for m, n in ((ks.rmsnorm, "add_rms_norm"), (ks.linear, "linear"), (ks.gdn, "gdn_decode"))}
    with pytest.raises(RuntimeError):
        with wi._dropped(ks, {"norms", "ba", "gdn"}):
            assert ks.rmsnorm.add_rms_norm is not real["add_rms_norm"] and ks.gdn.gdn_decode is not real["gdn_decode"]
            x, w = torch.randn(2, 8).bfloat16(), torch.randn(5, 8).bfloat16()
            assert ks.linear.linear(x, w).shape == (2, 5)  # ba: an uninitialised [2, 5], no kernel
            assert torch.equal(ks.linear.linear(x, w, out_dtype=torch.float32), real["linear"](x, w, torch.float32))
            raise RuntimeError("leave the block")
    assert {n: getattr(m, n) for m, n in ((ks.rmsnorm, "add_rms_norm"), (ks.linear, "linear"),
                                          (ks.gdn, "gdn_decode"))} == real


def test_engine_whatif_rejects_unknown_variant(tmp_path):
    r = _run([str(BENCH / "engine_whatif.py"), "--out", str(tmp_path), "--variants", "norms,bogus", *TINY], 60)
    assert r.returncode != 0 and "bogus" in r.stderr
