"""bench/cert_qwen3_5_27b.py end to end on CPU (tiny preset, reference kernels), and its pieces:
logit comparison rules, the HF-parameter tensor sources, the dequantized-reference swap with its
restore checksum, and the artifact identity computed from HF's parameters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
STAGES = ("hf_load", "hf_control", "engine_bf16", "engine_fp8", "rung6_fp8", "engine_int4", "rung6_int4",
          "engine_fp8+w8a8", "rung6_fp8+w8a8", "engine_int4+qhead", "rung6_int4+qhead", "weights_id", "profile")


def _run(args: list[str], timeout: int) -> subprocess.CompletedProcess:
    # one intra-op thread: on a shared 2-core host torch's OpenMP pool spins for cores other jobs
    # hold (KNOWLEDGE/pitfalls/torch-omp-threads-on-an-oversubscribed-host.md: 17 s vs 140 s)
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "PYTHONUNBUFFERED": "1",
           "OMP_NUM_THREADS": "1"}
    env.pop("TRITON_INTERPRET", None)   # the dry run uses the reference kernels, not the interpreter
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def _check_doc(doc: dict, fixture_used: bool, have_ids: bool) -> None:
    assert not doc["errors"], doc["errors"]
    assert set(STAGES) - ({"weights_id"} if not have_ids else set()) <= set(doc["stages"]), sorted(doc["stages"])
    S = doc["stages"]
    for p in ("bf16", "fp8", "int4"):  # the batched engine (3 slots): every case in every slot, slot 0 compared
        b = S[f"engine_{p}"]["batch"]
        assert b["slots"] == 3 and b["vs_one_slot"]["positions"] == S[f"engine_{p}"]["vs_hf"]["positions"]
        # reference kernels on CPU: M = 3 and M = 1 differ only in float summation order (bf16 rounding can lift that
        # to ~0.1 after a few steps; a slot mix-up or a stale row gives ~17, as a first version of this stage did)
        assert b["vs_one_slot"]["max_abs_full"] < 1.0 and b["vs_one_slot"]["argmax_agree"] >= 0.9 * b["vs_one_slot"]["positions"]
        assert b["vs_hf"]["positions"] == b["vs_one_slot"]["positions"] and b["decode"]["slots"] == 3
        assert b["decode"]["tok_per_s_p50"] == pytest.approx(3 / b["decode"]["p50_s"])
    bf16 = S["engine_bf16"]["vs_hf"]
    assert bf16["positions"] > 0 and bf16["pass"] and bf16["max_abs_full"] < 1.0
    for p in ("fp8", "int4"):
        gate = S[f"rung6_{p}"]["gate"]
        assert gate["factor"] == 3.0 and gate["bf16_noise"]["max_abs_full"] == bf16["max_abs_full"]
        assert gate["limits"]["max_abs_full"] == pytest.approx(3.0 * bf16["max_abs_full"])
        assert isinstance(gate["pass"], bool)
        # the argmax rule counts "other" flips on the fixture + flip set, against the bf16 engine's own count
        am, flip = gate["argmax_rule"], S[f"rung6_{p}"]["flip_vs_dequantized_hf"]
        assert am["positions"] == bf16["positions"] + flip["positions"] == am["bf16_positions"]
        assert flip["positions"] == S["hf_control"]["flip_set"]["positions"] == 2 * 4
        assert am["other"] == S[f"rung6_{p}"]["vs_dequantized_hf"]["other_disagreements"] + flip["other_disagreements"]
        assert am["bf16_other"] == bf16["other_disagreements"] + S["engine_bf16"]["flip_vs_hf"]["other_disagreements"]
        assert am["limit"] == 3.0 * max(1, am["bf16_other"]) and am["pass"] == (am["other"] <= am["limit"])
        assert len(flip["other_flips"]) == flip["other_disagreements"]
        # the long set: its own gate against the bf16 engine's numbers on the same positions
        lg, lc, ln = gate["long_prompt"], S[f"rung6_{p}"]["long_vs_dequantized_hf"], S["engine_bf16"]["long_vs_hf"]
        assert lg == S[f"rung6_{p}"]["long_gate"] and lc["positions"] == ln["positions"] == 2 * 3
        assert ln["positions"] == S["hf_control"]["long_set"]["positions"]
        assert S["hf_control"]["long_set"]["prompt_tokens"] == 40
        assert lg["limits"]["max_abs_full"] == pytest.approx(3.0 * ln["max_abs_full"])
        assert lg["limits"]["other_flips"] == 3.0 * max(1, ln["other_disagreements"])
        assert lg["pass"] == (lc["max_abs_full"] <= lg["limits"]["max_abs_full"]
                              and lc["mean_abs_full"] <= lg["limits"]["mean_abs_full"]
                              and lc["other_disagreements"] <= lg["limits"]["other_flips"])
        vs = S[f"rung6_{p}"]["vs_dequantized_hf"]
        assert gate["pass"] == (am["pass"] and lg["pass"] and vs["max_abs_full"] <= gate["limits"]["max_abs_full"]
                                and vs["mean_abs_full"] <= gate["limits"]["mean_abs_full"])
        assert 0.0 <= S[f"engine_{p}"]["long_quality_vs_bf16"]["top1_agreement"] <= 1.0
        assert S[f"rung6_{p}"]["restore"]["matches_backup"]
        assert S[f"rung6_{p}"]["restore"]["checksum"] == S["rung6_fp8"]["backup"]["checksum"]
        assert S[f"rung6_{p}"]["swapped_checksum"] != S["rung6_fp8"]["backup"]["checksum"]
        q = S[f"engine_{p}"]["quality_vs_bf16"]
        assert 0.0 <= q["top1_agreement"] <= 1.0 and q["kl_mean"] > 0.0
        # the kernels' arithmetic is far below the quantization error (rung 6 is not a quality test)
        assert S[f"rung6_{p}"]["vs_dequantized_hf"]["max_abs_full"] < q["max_abs_full"]
    # the variant: the fp8 engine again (the reference kernels ignore the fp8 prefill route, so its logits equal
    # fp8's on CPU), gated by its own rung 6 on the fp8 dequantized weights, no batch / by-chunk extras
    v = S["engine_fp8+w8a8"]
    assert "batch" not in v and "ttft_by_chunk" not in v and v["load"]["profile"] == S["engine_fp8"]["load"]["profile"]
    assert S["rung6_fp8+w8a8"]["swapped_checksum"] == S["rung6_fp8"]["swapped_checksum"]
    w8a8, fp8 = S["rung6_fp8+w8a8"]["vs_dequantized_hf"], S["rung6_fp8"]["vs_dequantized_hf"]
    assert w8a8["max_abs_full"] == fp8["max_abs_full"]
    assert "fp8+w8a8" not in S.get("weights_id", {}).get("profiles", {})
    # the quantized-head artifact: a smaller arena, HF's lm_head dequantized too in its rung 6 (and restored)
    qh, r6 = S["engine_int4+qhead"], S["rung6_int4+qhead"]
    assert "batch" not in qh and qh["load"]["profile"] == S["engine_int4"]["load"]["profile"]
    assert qh["load"]["weights_bytes"] < S["engine_int4"]["load"]["weights_bytes"]
    assert r6["swapped_tensors"] == S["rung6_int4"]["swapped_tensors"] + 1
    assert r6["swapped_checksum"] not in (S["rung6_int4"]["swapped_checksum"], S["rung6_fp8"]["backup"]["checksum"])
    assert r6["restore"]["checksum"] == S["rung6_fp8"]["backup"]["checksum"]
    assert r6["vs_dequantized_hf"]["max_abs_full"] < qh["quality_vs_bf16"]["max_abs_full"]
    assert set(doc["gates"]) == {"hf_greedy_equals_fixture", "bf16", "fp8", "int4", "fp8+w8a8", "int4+qhead"}
    assert all(isinstance(doc["gates"][p], bool) for p in ("bf16", "fp8", "int4", "fp8+w8a8", "int4+qhead"))
    assert (doc["gates"]["hf_greedy_equals_fixture"] is not None) == fixture_used
    assert ("vs_fixture" in S["engine_bf16"]) == fixture_used
    if have_ids:
        ids = S["weights_id"]["profiles"]
        assert len({ids[p]["weights_id"] for p in ("bf16", "fp8", "int4", "int4+qhead")}) == 4
    assert S["profile"]["decode_eager_step"] and S["hf_control"]["decode"]["steps"] > 0
    for t in S["engine_bf16"]["ttft"] + S["hf_control"]["ttft"]:
        assert t["ttft_s_min"] > 0


def _check_certs(out: Path, doc: dict, have_ids: bool) -> None:
    for p in ("bf16", "fp8", "int4", "int4+qhead"):
        rec = json.loads((out / f"cert-engine-qwen3_5-tiny-synthetic-{p.replace('+', '-')}.json").read_text())
        for key in ("bench", "date_utc", "argv", "versions", "load", "fixture", "parity_triton", "decode", "ttft",
                    "peak_gpu_mem", "hf_control_same_run", "teacher_forced_vs_hf", "gate"):
            assert key in rec, key
        if have_ids:
            assert rec["weights"]["weights_id"] == doc["stages"]["weights_id"]["profiles"][p]["weights_id"]
        assert (rec["rung6"] is None) == (p == "bf16")
    # a kernel-route variant writes no record; the quantized-head artifact does, with its convert flags
    assert not list(out.glob("cert-engine-*w8a8*")) and len(doc["certs"]) == 4
    rec = json.loads((out / "cert-engine-qwen3_5-tiny-synthetic-int4-qhead.json").read_text())
    assert rec["weights"]["recipe"].endswith("modeld convert --profile int4 --lm-head int4")


DRY = ["--device", "cpu", "--config", "tiny", "--ttft", "16,32", "--hf-probe", "16", "--steps", "2",
       "--workers", "2", "--flip-cases", "2", "--flip-tokens", "4", "--batch-slots", "3",
       "--long-cases", "2", "--long-prompt-len", "40", "--long-tokens", "3"]


def _tiny_fixture(model, shape, path: Path, new_tokens: int = 4, k: int = 10) -> None:
    """A modeld-greedy-fixture for the tiny preset, made the way bench/hf_control_27b.greedy makes
    the 27B one (HF forward with its cache, argmax, top-k per step), in process."""
    sys.path.insert(0, str(BENCH))
    from hf_control_27b import prompts

    cases = []
    with torch.no_grad():
        for ids in prompts(shape.bos_id):
            out = model(input_ids=torch.tensor([ids]), use_cache=True, logits_to_keep=1)
            cache, logits = out.past_key_values, out.logits[0, -1]
            tokens, steps = [], []
            for j in range(new_tokens):
                vals, idx = torch.topk(logits.float(), k)
                steps.append({"topk_ids": idx.tolist(), "topk_logits": [float(v) for v in vals.tolist()]})
                tokens.append(int(torch.argmax(logits)))
                if j + 1 < new_tokens:
                    out = model(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True)
                    cache, logits = out.past_key_values, out.logits[0, -1]
            cases.append({"prompt_ids": ids, "tokens": tokens, "steps": steps})
    path.write_text(json.dumps({"magic": "modeld-greedy-fixture", "format_version": 1, "model_id": "tiny",
                                "checkpoint": {"config": "tiny", "layers": shape.layers, "seed": 0},
                                "new_tokens": new_tokens, "top_k": k, "cases": cases}))


def test_cert_dry_run_tiny(tmp_path, tiny_hf, monkeypatch):
    """Every stage runs, every gate is computed, the records are written (with the MODELD_* switches in
    force); the fixture path (HF greedy == fixture, engine vs fixture top-k) is taken with a tiny fixture
    made here."""
    import importlib.util

    monkeypatch.setenv("MODELD_GEMV_SPLIT_FINISH", "auto")

    have_ids = importlib.util.find_spec("modeld.convert.identity_preview") is not None
    fixture = tmp_path / "fixture.json"
    _tiny_fixture(*tiny_hf, fixture)
    expected = tmp_path / "expected.json"     # CPU-precomputed identities, one right and one wrong
    if have_ids:
        from modeld.convert.identity_preview import synth_identity

        qhead = synth_identity("tiny", 0, "int4", workers=2, lm_head="int4").weights_id
        expected.write_text(json.dumps({"tiny/bf16": {"weights_id": synth_identity("tiny", 0, "bf16", workers=2).weights_id},
                                        "tiny/int4": {"weights_id": "sha256:" + "0" * 64},
                                        "tiny/int4+qhead": {"weights_id": qhead}}))
    out = tmp_path / "out"
    r = _run([str(BENCH / "cert_qwen3_5_27b.py"), "--out", str(out), "--fixture", str(fixture),
              "--expected-ids", str(expected), "--profiles", "bf16,fp8,int4,fp8+w8a8,int4+qhead", *DRY], 300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads((out / "cert_qwen3_5_27b.json").read_text())
    _check_doc(doc, fixture_used=True, have_ids=have_ids)
    assert doc["gates"]["hf_greedy_equals_fixture"] is True      # same ops, same CPU: deterministic
    assert doc["stages"]["engine_bf16"]["vs_fixture"]["positions"] == 12
    _check_certs(out, doc, have_ids)
    assert doc["env"]["MODELD_GEMV_SPLIT_FINISH"] == "auto"
    # logits digests: what each run saw, so a moved gate can be traced to the engine or the control
    st = doc["stages"]
    for stage in ("hf_control", "engine_bf16", "engine_fp8"):
        digests = st[stage]["digests"]
        assert all(len(digests[k]) == 16 for k in ("fixture", "flip_set", "long_set")), digests
    assert st["engine_bf16"]["digests"] != st["engine_fp8"]["digests"]
    assert st["rung6_fp8"]["dequantized_hf_digests"]["fixture"] != st["hf_control"]["digests"]["fixture"]
    rec = json.loads((out / "cert-engine-qwen3_5-tiny-synthetic-int4.json").read_text())
    assert rec["env"] == doc["env"] and "MODELD_GEMV_SPLIT_FINISH=auto " in rec["command"]
    if have_ids:
        ids = doc["stages"]["weights_id"]["profiles"]
        assert ids["bf16"]["matches_expected"] is True and ids["int4"]["matches_expected"] is False
        assert ids["int4+qhead"]["matches_expected"] is True
        assert "matches_expected" not in ids["fp8"]
    else:
        assert "weights_id" in doc["skipped"]
    assert "GATES" in r.stdout and r.stdout.count("SUMMARY ") >= len(STAGES) - (not have_ids)


@pytest.mark.parametrize("profiles", ["fp8,bf16", "bf16,fp8,fp8", "bf16,int4+w8a8"])
def test_cert_rejects_bad_profiles(tmp_path, profiles):
    r = _run([str(BENCH / "cert_qwen3_5_27b.py"), "--out", str(tmp_path), "--profiles", profiles, *DRY], 120)
    assert r.returncode != 0 and "--profiles" in r.stderr + r.stdout


# ---------------------------------------------------------------- pieces
def test_compare_logits_near_tie_rule():
    from modeld.qualify.logit_compare import compare_logits, merge, quality

    ref = torch.tensor([[10.0, 9.9375, 0.0], [5.0, 4.9, 0.0]])
    eng = torch.tensor([[9.95, 10.0, 0.0], [5.0, 4.9, 6.0]])    # row 0: near tie; row 1: a real error
    r = compare_logits(eng, ref, top_k=2, tie=0.125)
    assert (r["argmax_agree"], r["near_tie_disagreements"], r["other_disagreements"]) == (0, 1, 1)
    assert not r["pass"] and r["max_abs_full"] == pytest.approx(6.0)
    d0, d1 = r["disagreements"]  # row 0: margin 0.0625 <= 0.125 + 0.0625; row 1: pick 2, margin 5 > 0.125 + 0
    assert (d0["position"], d0["ref_top"], d0["engine_pick"], d0["near_tie"]) == (0, 0, 1, True)
    assert d0["margin"] == pytest.approx(0.0625) and d0["allowed"] == pytest.approx(0.1875)
    assert d0["engine_lead"] == pytest.approx(0.05, abs=1e-6)
    assert (d1["position"], d1["engine_pick"], d1["near_tie"]) == (1, 2, False)
    assert d1["margin"] == pytest.approx(5.0) and d1["engine_lead"] == pytest.approx(1.0)
    ok = compare_logits(ref.clone(), ref)
    assert ok["disagreements"] == []
    assert ok["pass"] and ok["argmax_agree"] == 2 and ok["max_abs_full"] == 0.0
    m = merge([ok, r])
    assert m["positions"] == 4 and m["argmax_agree"] == 2 and not m["pass"] and m["max_abs_full"] == pytest.approx(6.0)
    q = quality(ref, ref)
    assert q["kl_mean"] == pytest.approx(0.0, abs=1e-7) and q["top1_agreement"] == 1.0
    assert quality(ref, eng)["kl_max"] > 0.5


def test_compare_logits_rejects_mismatched_shapes():
    from modeld.qualify.logit_compare import LogitShapeError, compare_fixture, compare_logits

    with pytest.raises(LogitShapeError):
        compare_logits(torch.zeros(2, 5), torch.zeros(3, 5))
    with pytest.raises(LogitShapeError):
        compare_fixture(torch.zeros(2, 5), [{"topk_ids": [0], "topk_logits": [0.0]}], [0])


@pytest.fixture(scope="module")
def tiny_hf():
    from transformers import Qwen3_5ForCausalLM

    from modeld.convert.qwen3_5_spec import preset
    from modeld.qualify.synth_stream import hf_text_config, stream_into

    shape = preset("tiny")
    model = Qwen3_5ForCausalLM._from_config(hf_text_config(shape), dtype=torch.bfloat16,
                                            attn_implementation="sdpa").eval()
    stream_into(model, shape, 0, workers=2)
    return model, shape


def test_hf_param_source_matches_synth_values(tiny_hf):
    """Every tensor the engine reads from HF equals synth's own (F32 ones come from synth)."""
    sys.path.insert(0, str(BENCH))
    from engine_qwen3_5 import SynthSource

    from modeld.qualify.hf_weights import HFParamSource, QuantizedSource, quantize_parts

    model, shape = tiny_hf
    synth = SynthSource(shape, 0, 2)
    src = HFParamSource(model, shape, synth)
    assert src.names() == synth.names()
    for n in src.names():
        assert src.meta(n) == synth.meta(n), n
        assert torch.equal(src.tensor(n), synth.tensor(n)), n
    q = QuantizedSource(src, "int4")
    base = "model.language_model.layers.0.mlp.down_proj"
    assert base in q.linear and base + ".weight" not in q.names()
    want = quantize_parts(synth.tensor(base + ".weight"), "int4", base)
    for comp in ("qweight", "scales", "mins"):
        got = q.tensor(f"{base}.{comp}")
        assert q.meta(f"{base}.{comp}") == (got.dtype, tuple(got.shape))
        assert torch.equal(got, want[comp])
    assert "model.language_model.layers.0.linear_attn.in_proj_a.weight" in q.names()   # kept bf16
    assert q.tensor("lm_head.weight").dtype == torch.bfloat16 and "lm_head.qweight" not in q.names()
    qh = QuantizedSource(src, "int4", lm_head=True)                                     # --lm-head int4
    want = quantize_parts(synth.tensor("lm_head.weight"), "int4", "lm_head")
    assert "lm_head.weight" not in qh.names() and qh.meta("lm_head.scales") == (torch.float16, want["scales"].shape)
    assert all(torch.equal(qh.tensor(f"lm_head.{c}"), want[c]) for c in ("qweight", "scales", "mins"))
    qf = QuantizedSource(src, "int4", lm_head="fp8")                                    # int4 with --lm-head fp8
    want = quantize_parts(synth.tensor("lm_head.weight"), "fp8", "lm_head")
    assert "lm_head.qweight" not in qf.names()
    assert qf.meta("lm_head.weight") == (torch.float8_e4m3fn, want["weight"].shape)
    assert torch.equal(qf.tensor("lm_head.weight").view(torch.uint8), want["weight"].view(torch.uint8))
    assert torch.equal(qf.tensor("lm_head.weight_scale"), want["weight_scale"])
    assert "lm_head.weight" in QuantizedSource(src, "int4", lm_head="bf16").names()


def test_dequant_swap_order_and_checksum(tiny_hf):
    from modeld.qualify.hf_weights import DequantSwap, SwapStateError, dequantize_parts, quantize_parts

    model, shape = tiny_hf
    sw = DequantSwap(model, shape)
    with pytest.raises(SwapStateError):
        sw.apply("fp8")                      # no backup yet
    original = sw.backup()
    assert sw.apply("int4") == len(sw.targets)
    assert sw.checksum() != original
    with pytest.raises(SwapStateError):
        sw.apply("fp8")                      # a swap is in place
    assert sw.restore() == original
    word = sw.backup_cpu[next(iter(sw.targets))].view(torch.int16).view(-1)
    word[0] += 1                             # a corrupted backup is caught
    with pytest.raises(SwapStateError):
        sw.restore()
    word[0] -= 1
    assert sw.restore() == original
    with pytest.raises(SwapStateError):
        sw.apply("int4", lm_head=True)       # built without the lm_head
    head = model.lm_head.weight
    sh = DequantSwap(model, shape, lm_head=True)
    before = head.detach().clone()
    sh.backup()
    assert sh.apply("int4") == len(sw.targets) and torch.equal(head, before)     # the head only when asked
    sh.restore()
    assert sh.apply("int4", lm_head=True) == len(sw.targets) + 1 and not torch.equal(head, before)
    int4_head = head.detach().clone()
    sh.restore()
    assert torch.equal(head, before)
    assert sh.apply("int4", lm_head="bf16") == len(sw.targets) and torch.equal(head, before)  # "bf16": not swapped
    sh.restore()
    assert sh.apply("int4", lm_head="fp8") == len(sw.targets) + 1                          # int4 + fp8 head
    want = dequantize_parts(quantize_parts(before, "fp8", "lm_head")).to(head.dtype)
    assert torch.equal(head, want) and not torch.equal(head, int4_head)
    sh.restore()
    assert torch.equal(head, before)


def test_hf_identity_equals_converter_identity(tiny_hf):
    pytest.importorskip("modeld.convert.identity_preview")
    from modeld.convert.identity_preview import synth_identity
    from modeld.qualify.hf_identity import hf_identity

    model, shape = tiny_hf
    for profile, lm_head in (("bf16", "bf16"), ("int4", "bf16"), ("fp8", "fp8")):
        a = hf_identity(model, shape, 0, profile, workers=2, hash_workers=1, lm_head=lm_head)
        b = synth_identity("tiny", 0, profile, workers=2, lm_head=lm_head)
        assert a.weights_id == b.weights_id and a.directory_sha256 == b.directory_sha256


def test_variants_name_their_artifact():
    sys.path.insert(0, str(BENCH))
    from cert_rung6 import base_profile, convert_flags, own_artifact, variant

    assert [base_profile(p) for p in ("bf16", "fp8+w8a8", "fp8+qhead", "int4+qhead")] == ["bf16", "fp8", "fp8", "int4"]
    assert [own_artifact(p) for p in ("int4", "fp8+w8a8", "fp8+qhead")] == [True, False, True]
    assert convert_flags("int4+qhead") == "--profile int4 --lm-head int4" and convert_flags("fp8") == "--profile fp8"
    assert variant("fp8+w8a8").fp8_prefill == "w8a8" and variant("fp8+qhead").fp8_prefill is None
