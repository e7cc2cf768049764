"""Certify the qwen3_5 27B cell on one GPU in ONE process: HF control, bf16 / fp8 / int4 engines,
rung 6 against the dequantized reference, quality vs bf16 — all on one copy of the weights.

The synthetic checkpoint (`modeld synth --family qwen3_5 --config 27b --seed 0`) is generated
once, streamed into HF's `Qwen3_5ForCausalLM` (bf16, sdpa, torch GDN fallback) on the GPU; every
engine is then built from HF's parameters (modeld.qualify.hf_weights), so nothing is generated
twice. Stages (each prints one SUMMARY line with elapsed time and saves the JSON):

  hf_load     build HF on the device and stream the synth weights into it
  hf_control  per prompt: HF greedy with its cache (decode p50/p90, determinism vs the committed
              fixture), one teacher-forced forward without cache over prompt + forced tokens (the
              reference logits of every comparison; also over the flip set and the long set);
              TTFT 128 (+ a probe length for the 8k estimate)
  engine_bf16 engine from HF's params (Triton, CUDA graph): teacher-forced logits vs HF's at every
              position (exact argmax, near-tie rule, max |Δ| over HF top-k, full-vocab max/mean)
              and vs the fixture; its "other" flips on the flip set (the rung-6 argmax scale); decode p50/p90 at context 128, replay-only, fraction of roofline;
              TTFT best of 3. Sets the natural noise scale of the rung-6 gate.
  engine_fp8, engine_int4
              quantized with the converter's own functions from HF's params on the GPU; same speed
              numbers; quality vs HF bf16 (top-1 agreement, mean KL(HF bf16 ‖ engine))
  engine_fp8+qhead, engine_int4+qhead, engine_int4+fp8head
              only when --profiles names them: the artifact of `modeld convert --profile P --lm-head P` (the
              lm_head quantized in the profile's format too; int4+fp8head: `--profile int4 --lm-head fp8`); like
              engine_fp8 / engine_int4 without the batch and by-chunk extras; its own rung 6 (HF's lm_head
              dequantized too), weights_id (expected key "<config>/<name>") and record
  engine_fp8+w8a8
              only when --profiles names it: the fp8 engine with its prefill GEMMs (M >= W8A8_MIN_M)
              on fp8 tensor cores (activations quantised per token, linear/w8a8.py; the switch
              MODELD_FP8_PREFILL=w8a8 sets, held for this stage only); its own rung 6 below. No record
              is written for it: it is the evidence for flipping the fp8 cell's prefill, not a cell
  rung6_fp8, rung6_int4
              HF with every quantized linear replaced by bf16(dequant(quant(W))) (originals backed
              up to host RAM, restored afterwards, proven by checksum) vs the engine's logits:
              max / mean |Δ|, argmax agreement, the gate below
  hf_ttft_long  HF TTFT at the long length, unless already measured in hf_control (cheap) or
              predicted too slow for --hf-long-cap-s / the budget
  weights_id  what `modeld convert --profile P` would record (modeld.qualify.hf_identity over the
              converter's identity preview), per profile while the budget lasts
  profile     optional: torch.profiler top kernels of bf16 decode (graph replays, one eager step)
              and one long prefill

The long set (--long-cases seeded random prompts of --long-prompt-len tokens, then --long-tokens forced
tokens): the fixture and the flip set are short (their prefill runs below the GEMM routes a long prompt
takes: the whole-weight dequant at M >= 512, w8a8), so these cases put every prefill route under rung 6.
Their prompt is one prefill call; the forced tokens are decode steps that read the KV cache and GDN state
the long prefill left (positions: the last prompt position + every forced one).

Gates (decided before any GPU number was seen; see bench/cert_rung6.py): bf16 greedy parity vs HF passes
when every argmax disagreement on the fixture positions is a near-tie; fp8/int4 kernel parity passes
when max and mean |Δlogit| vs the dequantized reference are each within RUNG6_FACTOR x the bf16
engine's own |Δlogit| vs HF in this run, and its "other" argmax disagreements on the fixture + flip
set (--flip-cases seeded random prompts, teacher-forced) are at most RUNG6_FACTOR x max(1, the bf16
engine's own count vs HF on the same positions) — ARGMAX_RULE (session 6; before, one such flip in
the 96 fixture positions failed the gate, which measured ~0.3 % of positions for every profile made
a lottery). Since session 22 the same three limits also apply, separately, on the long set against
the bf16 engine's own numbers there (LONG_RULE). Quality vs bf16 is reported, not gated (random synthetic weights have no outlier
structure to preserve).

Writes $OUT/cert_qwen3_5_27b.json after every stage and, at the end, one certification record per
profile ($OUT/cert-engine-qwen3_5-<config>-synthetic-<profile, "+" as "-">.json). Exit 0 unless HF cannot load.

    PYTHONUNBUFFERED=1 PYTHONPATH=src:. python3 bench/cert_qwen3_5_27b.py --out $OUT
    dry run (CPU, reference kernels, ~20 s; OMP_NUM_THREADS=1 matters on a shared host):
    OMP_NUM_THREADS=1 PYTHONPATH=src:. python bench/cert_qwen3_5_27b.py --out /tmp/cert --device cpu --config tiny \
        --ttft 16,32 --hf-probe 16 --steps 2 --new-tokens 4 --workers 2 --long-cases 1 --long-prompt-len 64
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _qwen_common as C  # noqa: E402
from cert_rung6 import (RUNG6_FACTOR, VARIANTS, base_profile, convert_flags, own_artifact,  # noqa: E402, F401
                        rung6_stage, variant)  # rung 6, variants

PROFILES = ("bf16", "fp8", "int4")
@contextlib.contextmanager
def prefill_route(name: str):
    """Hold the variant's fp8 prefill route (linear.triton reads FP8_PREFILL at every launch) for one stage."""
    mode = variant(name).fp8_prefill
    if mode is None:
        yield
        return
    from modeld.kernels.linear import triton as lt

    saved, lt.FP8_PREFILL = lt.FP8_PREFILL, mode
    try:
        yield
    finally:
        lt.FP8_PREFILL = saved


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    C.add_checkpoint_args(ap, "synth preset (default 27b; tiny/small for a CPU dry run)")
    ap.add_argument("--fixture", default=C.FIXTURE, help="committed HF greedy fixture (used when its config matches)")
    ap.add_argument("--new-tokens", type=int, default=32, help="forced tokens per prompt without a fixture (default 32)")
    C.add_compare_args(ap)
    ap.add_argument("--flip-cases", type=int, default=32,
                    help="seeded random prompts of the flip set (rung-6 argmax rule; default 32, 0: fixture only)")
    ap.add_argument("--flip-tokens", type=int, default=48, help="forced tokens per flip-set prompt (default 48)")
    ap.add_argument("--flip-prompt-len", type=int, default=24, help="tokens per flip-set prompt (default 24)")
    ap.add_argument("--flip-seed", type=int, default=20261130, help="seed of the flip set's ids")
    ap.add_argument("--long-cases", type=int, default=4,
                    help="seeded random prompts of the long set (rung 6 at the long-prompt GEMM routes; 0: none)")
    ap.add_argument("--long-prompt-len", type=int, default=2048, help="tokens per long-set prompt (default 2048)")
    ap.add_argument("--long-tokens", type=int, default=32, help="forced tokens per long-set prompt (default 32)")
    ap.add_argument("--long-seed", type=int, default=20261201, help="seed of the long set's ids")
    ap.add_argument("--steps", type=int, default=96, help="engine decode steps timed (default 96)")
    ap.add_argument("--ttft", default="128,8192", help="TTFT prompt lengths (default 128,8192)")
    ap.add_argument("--hf-probe", type=int, default=1024, help="HF prefill length measured to predict its long TTFT")
    ap.add_argument("--hf-long-now-s", type=float, default=20.0,
                    help="measure HF's long TTFT inside hf_control when predicted below this (else at the end)")
    ap.add_argument("--hf-long-cap-s", type=float, default=90.0, help="skip HF's long TTFT if predicted above this")
    ap.add_argument("--batch-slots", type=int, default=8,
                    help="per profile, also build the engine with this many slots and record its teacher-forced logits "
                    "(every case in every slot, slot 0 compared) against the one-slot engine and HF, and its decode "
                    "speed: the batched decode kernels (M = slots); 1 or 0 skips it (default 8; recorded, not gated)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="wall budget; optional stages are skipped past it")
    ap.add_argument("--profiles", default="bf16,fp8,int4",
                    help="engine profiles (bf16 first: it sets the gate scale); also fp8+w8a8 (the fp8 engine with "
                         "w8a8 prefill GEMMs), fp8+qhead / int4+qhead (the artifact of `modeld convert --profile P "
                         "--lm-head P`: lm_head quantized too; own weights_id, rung 6 and record), int4+fp8head "
                         "(--profile int4 --lm-head fp8)")
    ap.add_argument("--no-profiler", action="store_true", help="skip the torch.profiler stage")
    ap.add_argument("--ttft-chunks", default="2048,4096",
                    help="prefill_chunk values timed at the longest TTFT length per engine, beside the default "
                         "(EngineOptions', 8192; checkpoint_every stays 2048) ('' skips)")
    ap.add_argument("--expected-ids", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                           "artifact_qwen3_5_27b.expected.json"),
                    help="identities precomputed on the CPU ({config/profile: {weights_id}}) to check against")
    return ap.parse_args(argv)


def hf_load(R, st):
    import torch
    from transformers import Qwen3_5ForCausalLM

    from modeld.qualify.synth_stream import hf_text_config, stream_into

    t0 = time.perf_counter()
    with torch.device(st.dev):
        st.model = Qwen3_5ForCausalLM._from_config(hf_text_config(st.shape), dtype=torch.bfloat16,
                                                   attn_implementation="sdpa").eval()
    init_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    n = stream_into(st.model, st.shape, R.args.seed, workers=R.args.workers)
    C.sync()
    load_s = time.perf_counter() - t0
    fp = C.hf_bench.weight_fingerprint(st.shape, R.args.seed)
    mem = torch.cuda.memory_allocated() if st.dev.type == "cuda" else 0
    return {"init_s": init_s, "stream_s": load_s, "elements": n, "weights_memory_bytes": mem,
            "weight_fingerprint_sha256": fp,
            "summary": f"built {init_s:.1f} s, streamed {n / 1e9:.2f} G elements in {load_s:.1f} s, "
                       f"{mem / 2**30:.1f} GiB, fingerprint {fp[:12]}"}


def hf_control(R, st):
    import numpy as np
    import torch

    from modeld.qualify.logit_compare import compare_fixture, fixture_topk_diff, merge

    a, fx = R.args, st.fixture
    prompts = [c["prompt_ids"] for c in fx["cases"]] if fx else C.hf_bench.prompts(st.shape.bos_id)
    new = fx["new_tokens"] if fx else a.new_tokens
    with torch.no_grad():
        C.hf_bench.greedy(st.model, prompts[0], 2, a.top_k, st.dev)                 # warm-up
        runs = [C.hf_bench.greedy(st.model, p, new, a.top_k, st.dev) for p in prompts]
    res: dict = {"prompts_tokens": [len(p) for p in prompts], "new_tokens": new}
    if fx:
        same = [r["tokens"] == c["tokens"] for r, c in zip(runs, fx["cases"])]
        errs = [fixture_topk_diff(r["steps"], c["steps"]) for r, c in zip(runs, fx["cases"])]
        res["greedy_vs_fixture"] = {"tokens_equal": same, "max_topk_logit_diff": errs}
        st.forced = [(c["prompt_ids"], c["tokens"]) for c in fx["cases"]]
        st.forced_steps = [c["steps"] for c in fx["cases"]]
    else:
        st.forced = [(r["prompt_ids"], r["tokens"]) for r in runs]
        st.forced_steps = None
    t0 = time.perf_counter()
    st.ref = C.hf_tf_logits(st.model, st.forced, st.dev)
    res["teacher_forced_forward_s"] = time.perf_counter() - t0
    if st.flip:   # the flip set's reference, on the host until compared
        t0 = time.perf_counter()
        st.ref_flip = [x.to("cpu") for x in C.hf_tf_logits(st.model, st.flip, st.dev)]
        res["flip_set"] = {"cases": len(st.flip), "positions": sum(len(t) for _, t in st.flip),
                           "teacher_forced_forward_s": time.perf_counter() - t0}
    if st.long:   # the long set's reference, on the host until compared
        t0 = time.perf_counter()
        st.ref_long = [x.to("cpu") for x in C.hf_tf_logits(st.model, st.long, st.dev)]
        res["long_set"] = {"cases": len(st.long), "prompt_tokens": len(st.long[0][0]),
                           "positions": sum(len(t) for _, t in st.long),
                           "teacher_forced_forward_s": time.perf_counter() - t0}
    res["digests"] = {"fixture": C.logits_digest(st.ref), "flip_set": C.logits_digest(st.ref_flip if st.flip else None),
                      "long_set": C.logits_digest(st.ref_long if st.long else None)}
    # HF's own no-cache forward vs its cached greedy run: the control's chunked-vs-recurrent noise
    res["tf_forward_vs_cached_greedy"] = merge([compare_fixture(lg, r["steps"], r["tokens"], a.tie)
                                                for lg, r in zip(st.ref, runs)]) if not fx or all(same) else None
    steps = np.array([s for r in runs for s in r["decode_step_s"]])
    res["decode"] = {"steps": int(steps.size), "p50_s": float(np.median(steps)),
                     "p90_s": float(np.percentile(steps, 90)), "tok_per_s_p50": float(1 / np.median(steps)),
                     "prefill_s_per_prompt": [r["prefill_s"] for r in runs]}
    lengths = st.ttft_lengths
    res["ttft"] = [C.hf_ttft(st.model, lengths[0], st.shape.vocab, st.dev, runs=2)]
    probe = C.hf_ttft(st.model, a.hf_probe, st.shape.vocab, st.dev)
    res["ttft_probe"] = probe
    st.hf_long_pred = probe["ttft_s_min"] * max(lengths) / a.hf_probe
    res["ttft_long_predicted_s"] = st.hf_long_pred
    if max(lengths) > lengths[0] and st.hf_long_pred <= a.hf_long_now_s:   # cheap: measure it now
        res["ttft"].append(C.hf_ttft(st.model, max(lengths), st.shape.vocab, st.dev))
    if len(res["ttft"]) > 1:
        res["summary_long"] = f"TTFT {max(lengths)} {res['ttft'][-1]['ttft_s_min']:.2f} s"
    gv = res.get("greedy_vs_fixture", {}).get("tokens_equal")
    res["summary"] = (f"decode p50 {res['decode']['p50_s'] * 1e3:.1f} ms ({res['decode']['tok_per_s_p50']:.2f} tok/s), "
                      f"TTFT {lengths[0]} {res['ttft'][0]['ttft_s_min'] * 1e3:.0f} ms, {a.hf_probe} "
                      f"{probe['ttft_s_min']:.2f} s, {res.get('summary_long', '')} greedy==fixture {gv}")
    return res


def engine_stage(R, st, profile: str):
    with prefill_route(profile):
        return _engine_stage(R, st, profile)


def _engine_stage(R, st, profile: str):
    from modeld.qualify.logit_compare import compare_fixture, compare_logits, merge, quality

    a = R.args
    is_variant = profile in VARIANTS
    eng, load_s = C.engine_from_hf(st, base_profile(profile), a.seed, a.workers, lm_head=variant(profile).lm_head)
    res: dict = {"profile": profile, "load": {
        "seconds": load_s, "profile": eng.weights.profile_summary(), "weights_bytes": eng.weights.nbytes,
        "state_bytes": eng.state.nbytes, "graph_captured": eng.graph.captured, "graph_error": eng.graph_error,
        "casts": len(eng.load_report.casts)}}
    t0 = time.perf_counter()
    logits = C.engine_tf_logits(eng, st.forced)
    res["teacher_forced_s"] = time.perf_counter() - t0
    res["vs_hf"] = merge([compare_logits(e, r, a.top_k, a.tie) for e, r in zip(logits, st.ref)])
    flip = None
    if st.flip:
        t0 = time.perf_counter()
        flip = [x.to("cpu") for x in C.engine_tf_logits(eng, st.flip)]
        res["flip_set_teacher_forced_s"] = time.perf_counter() - t0
    long = None
    if st.long:
        t0 = time.perf_counter()
        long = [x.to("cpu") for x in C.engine_tf_logits(eng, st.long)]
        res["long_set_teacher_forced_s"] = time.perf_counter() - t0
    res["digests"] = {"fixture": C.logits_digest(logits), "flip_set": C.logits_digest(flip),
                      "long_set": C.logits_digest(long)}
    if st.forced_steps:
        res["vs_fixture"] = merge([compare_fixture(e, s, t, a.tie)
                                   for e, s, (_, t) in zip(logits, st.forced_steps, st.forced)])
    d = C.engine_bench.decode_speed(eng, a.steps, 128)
    floor = C.roofline(eng, 128)
    hf = R.doc["stages"].get("hf_control", {}).get("decode")
    d.update({"roofline_floor_s": floor, "fraction_of_roofline": floor / d["p50_s"],
              "hf_p50_s_same_run": hf["p50_s"] if hf else None,
              "speedup_vs_hf": hf["p50_s"] / d["p50_s"] if hf else None})
    res["decode"] = d
    res["ttft"] = C.engine_bench.ttft(eng, st.ttft_lengths)
    if a.ttft_chunks and not is_variant and R.elapsed() < a.budget_s * 0.6:
        res["ttft_by_chunk"] = C.engine_bench.ttft_by_chunk(eng, max(st.ttft_lengths), a.ttft_chunks)
    if profile == "bf16":
        st.noise = res["vs_hf"]
        # the bf16 engine's own "other" argmax flips vs HF on the fixture + flip set: the rung-6 argmax scale
        st.noise_other = {"positions": res["vs_hf"]["positions"], "other": res["vs_hf"]["other_disagreements"]}
        if flip is not None:
            res["flip_vs_hf"] = C.other_flips(flip, st.ref_flip, a.top_k, a.tie, st.dev)
            st.noise_other = {k: st.noise_other[k] + res["flip_vs_hf"][f] for k, f in
                              (("positions", "positions"), ("other", "other_disagreements"))}
        if long is not None:   # the long set's own noise scale (LONG_RULE)
            res["long_vs_hf"] = st.noise_long = C.other_flips(long, st.ref_long, a.top_k, a.tie, st.dev)
        res["gate"] = {"name": "greedy parity vs HF (near-tie rule)", "pass": res["vs_hf"]["pass"]
                       and res.get("vs_fixture", {"pass": True})["pass"]}
    else:
        res["quality_vs_bf16"] = merge([quality(r, e) for e, r in zip(logits, st.ref)])
        st.quant_logits[profile] = [x.to("cpu") for x in logits]
        st.quant_flip[profile] = flip
        if long is not None:
            res["long_quality_vs_bf16"] = merge([quality(r.to(st.dev), e.to(st.dev))
                                                 for e, r in zip(long, st.ref_long)])
            res["long_quality_vs_bf16"].pop("cases")
            st.quant_long[profile] = long
    del eng, flip, long
    C.release()
    if a.batch_slots > 1 and not is_variant and R.elapsed() < a.budget_s * 0.7:
        res["batch"] = batch_stage(R, st, profile, logits)
    del logits
    C.release()
    vs = res["vs_hf"]
    tt = " ".join(f"{t['prompt_tokens']}:{t['ttft_s_min'] * 1e3:.0f}ms" for t in res["ttft"])
    if res.get("ttft_by_chunk"):
        tt += " (by chunk " + " ".join(f"{t['prefill_chunk']}:{t['ttft_s_min'] * 1e3:.0f}ms"
                                       for t in res["ttft_by_chunk"]) + ")"
    res["summary"] = (f"load {load_s:.1f} s, vs HF argmax {vs['argmax_agree']}/{vs['positions']} "
                      f"(+{vs['near_tie_disagreements']} ties, {vs['other_disagreements']} other), "
                      f"max|Δ| top-k {vs['max_abs_topk']:.3f} full {vs['max_abs_full']:.3f}, decode "
                      f"{d['tok_per_s_p50']:.1f} tok/s ({d['fraction_of_roofline']:.3f} of roofline), TTFT {tt}"
                      + (f"; {res['batch']['summary']}" if "batch" in res else "") + _long_summary(res))
    return res


def _long_summary(res: dict) -> str:
    if "long_vs_hf" in res:
        v = res["long_vs_hf"]
        return (f"; long set vs HF max|Δ| {v['max_abs_full']:.3f} mean {v['mean_abs_full']:.4f}, other "
                f"{v['other_disagreements']}/{v['positions']}")
    if "long_quality_vs_bf16" in res:
        q = res["long_quality_vs_bf16"]
        return f"; long set vs HF bf16 top-1 {q['top1_agreement']:.3f}, KL mean {q['kl_mean']:.4f}"
    return ""


def batch_stage(R, st, profile: str, one_slot_logits) -> dict:
    """The engine with --batch-slots slots: each teacher-forced case runs in every slot, so every decode step is a
    batched call (M = slots) of the decode kernels; slot 0's logits against the one-slot engine's and HF's, and the
    decode speed (tok/s counts every slot). Recorded for the batched kernels; the gates stay the one-slot ones."""
    from modeld.qualify.logit_compare import compare_logits, merge

    a = R.args
    eng, load_s = C.engine_from_hf(st, base_profile(profile), a.seed, a.workers, a.batch_slots,
                                   lm_head=variant(profile).lm_head)
    logits = C.engine_tf_logits(eng, st.forced)
    out = {"slots": a.batch_slots, "load_s": load_s, "graph_captured": eng.graph.captured,
           "vs_one_slot": merge([compare_logits(e, r, a.top_k, a.tie) for e, r in zip(logits, one_slot_logits)]),
           "vs_hf": merge([compare_logits(e, r, a.top_k, a.tie) for e, r in zip(logits, st.ref)]),
           "decode": C.engine_bench.decode_speed(eng, a.steps, 128)}
    del eng, logits
    C.release()
    v1, vh = out["vs_one_slot"], out["vs_hf"]
    out["summary"] = (f"{a.batch_slots} slots: {out['decode']['tok_per_s_p50']:.1f} tok/s; vs one slot max|Δ| "
                      f"{v1['max_abs_full']:.3f}, argmax {v1['argmax_agree']}/{v1['positions']}; vs HF max|Δ| "
                      f"{vh['max_abs_full']:.3f}, argmax {vh['argmax_agree']}/{vh['positions']} "
                      f"(+{vh['near_tie_disagreements']} ties, {vh['other_disagreements']} other)")
    return out


def weights_id_stage(R, st):
    """Identity per profile from HF's (original) weights; each profile only while budget is left."""
    from modeld.qualify.hf_identity import hf_identity

    res: dict = {"profiles": {}, "source": "modeld.qualify.hf_identity over modeld.convert.identity_preview"}
    if st.swap is not None and st.swap.applied is not None:
        raise RuntimeError(f"HF holds the dequantized {st.swap.applied} weights; identities need the originals")
    path = R.args.expected_ids
    expected = json.load(open(path)) if path and os.path.exists(path) else {}
    res["expected_ids"] = os.path.relpath(path) if expected else None
    for p in [p for p in st.profiles if own_artifact(p)]:   # a kernel-route variant has its profile's weights
        # estimate: the artifact's bytes hashed (and moved to the host) at ~3 GB/s
        est = R.doc["stages"].get(f"engine_{p}", {}).get("load", {}).get("weights_bytes", 0) / 3e9
        if R.left() < est + 30:
            res["profiles"][p] = {"skipped": f"budget: {R.left():.0f} s left"}
            continue
        t0 = time.perf_counter()
        ident = hf_identity(st.model, st.shape, R.args.seed, base_profile(p),
                            device=st.dev.type if st.dev.type == "cuda" else None, workers=R.args.workers,
                            hash_workers=max(1, min(8, (os.cpu_count() or 2) // 2)), lm_head=variant(p).lm_head)
        res["profiles"][p] = {**ident.as_json(), "seconds": time.perf_counter() - t0, "estimated_s": est}
        want = expected.get(f"{R.args.config}/{p}", {}).get("weights_id")
        if want is not None:  # precomputed on the CPU by the converter itself (identity preview)
            res["profiles"][p].update({"expected_weights_id": want, "matches_expected": want == ident.weights_id})
        R.doc["stages"]["weights_id"] = res
        R.save()
    res["summary"] = " ".join(f"{p}:{v.get('weights_id', 'skipped')[:19]}"
                              + ("" if "matches_expected" not in v else f" (== CPU expectation: {v['matches_expected']})")
                              for p, v in res["profiles"].items())
    return res


def hf_ttft_long_stage(R, st):
    n = max(st.ttft_lengths)
    r = C.hf_ttft(st.model, n, st.shape.vocab, st.dev)
    return {"ttft": r, "predicted_s": st.hf_long_pred,
            "weights": "original" if st.swap is None or st.swap.applied is None else f"dequantized {st.swap.applied} (timing only)",
            "summary": f"HF TTFT {n}: {r['ttft_s_min']:.2f} s (predicted {st.hf_long_pred:.2f} s)"}


def profile_stage(R, st):
    """torch.profiler: top kernels of bf16 decode (graph replays + one eager step) and one long prefill."""
    eng, _ = C.engine_from_hf(st, "bf16", R.args.seed, R.args.workers)
    res = C.kernel_profile(eng, st.dev, max(st.ttft_lengths))
    C.release()
    top = res["decode_eager_step"][0] if res["decode_eager_step"] else {"name": "-", "share": 0}
    res["summary"] = f"top decode kernel {top['name'][:60]} ({top['share']:.0%})"
    return res


def finish(R, st) -> None:
    """Gates and one certification record per profile from the document as it stands (re-run
    after every profile and at the end, so the files exist even if the run is cut short)."""
    from modeld.qualify.cert_record import cert_record

    S = R.doc["stages"]
    gates = {"hf_greedy_equals_fixture": (all(S["hf_control"]["greedy_vs_fixture"]["tokens_equal"])
                                          if "greedy_vs_fixture" in S.get("hf_control", {}) else None)}
    for p in st.profiles:
        g = S.get("engine_bf16", {}).get("gate") if p == "bf16" else S.get(f"rung6_{p}", {}).get("gate")
        gates[p] = None if g is None else g["pass"]
    R.doc["gates"], R.doc["certs"] = gates, []
    for p in [p for p in st.profiles if own_artifact(p)]:   # a kernel-route variant is evidence, not a cell
        rec = cert_record(R.doc, p, seed=R.args.seed, convert=convert_flags(p))
        if rec is not None:
            # "+" spelled "-": the device tool does not bring back a file whose name has a "+"
            # (KNOWLEDGE/pitfalls/device-tool-drops-file-names-with-plus.md)
            name = f"cert-engine-qwen3_5-{R.args.config}-synthetic-{p.replace('+', '-')}.json"
            with open(os.path.join(R.args.out, name), "w") as f:
                json.dump(rec, f, indent=1)
            R.doc["certs"].append(name)
    R.save()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    os.makedirs(args.out, exist_ok=True)
    import types

    import torch

    from modeld.convert.qwen3_5_spec import hf_config, preset
    from modeld.convert.synth import model_id_for
    from modeld.models.qwen3_5.config import Qwen35Config
    from modeld.qualify.hf_weights import DequantSwap

    R = C.Run(args, argv, "cert_qwen3_5_27b", {"rung6_factor": RUNG6_FACTOR})
    st = types.SimpleNamespace(dev=torch.device(args.device), shape=preset(args.config, args.layers),
                               swap=None, noise=None, noise_other=None, noise_long=None, quant_logits={},
                               quant_flip={}, quant_long={}, ref_long=None, hf_long_pred=None)
    if st.dev.type != "cuda":
        C.cpu_shims()
    st.cfg = Qwen35Config.from_hf(hf_config(st.shape))
    st.model_id = model_id_for(st.shape, args.seed)
    st.ttft_lengths = sorted({int(x) for x in args.ttft.split(",") if x})
    st.capacity = max(max(st.ttft_lengths) + 256, 512)
    st.profiles = [p for p in args.profiles.split(",") if p]
    known = PROFILES + tuple(VARIANTS)
    if (any(p not in known for p in st.profiles) or len(set(st.profiles)) != len(st.profiles)
            or (len(st.profiles) > 1 and st.profiles[0] != "bf16")):
        raise SystemExit(f"--profiles: distinct names of {known} starting with bf16, got {args.profiles}")
    st.quant_profiles = [p for p in st.profiles if p != "bf16"]
    st.flip = C.random_cases(args.flip_cases, args.flip_prompt_len, args.flip_tokens, st.shape.bos_id, args.flip_seed)
    st.long = C.random_cases(args.long_cases, args.long_prompt_len, args.long_tokens, st.shape.bos_id, args.long_seed)
    st.capacity = max(st.capacity, args.long_prompt_len + args.long_tokens + 64)
    R.doc.update({"versions": C.versions(st.dev), "model_id": st.model_id, "config": args.config,
                  "layers": st.shape.layers, "seed": args.seed})
    st.fixture = None
    if os.path.exists(args.fixture):
        fx = json.load(open(args.fixture))
        ck = fx["checkpoint"]
        applies = (ck["config"], ck["layers"], ck["seed"]) == (args.config, st.shape.layers, args.seed)
        R.doc["fixture"] = {"path": os.path.relpath(args.fixture), "model_id": fx.get("model_id"),
                            "applies": applies, "control": fx.get("control")}
        st.fixture = fx if applies else None
    R.save()
    print(f"cert {st.model_id} on {R.doc['versions']['gpu']}; profiles {st.profiles}; budget {args.budget_s:.0f} s; "
          f"fixture {'used' if st.fixture else 'not applicable'}", flush=True)

    if R.stage("hf_load", hf_load, R, st) is None or R.stage("hf_control", hf_control, R, st) is None:
        return 1
    for p in st.profiles:
        if st.swap is not None and st.swap.applied is not None:   # a failed rung-6 stage left HF swapped
            if R.stage(f"restore_before_{p}", lambda: {"checksum": st.swap.restore()}) is None:
                R.skip(f"engine_{p}", "HF's original weights could not be restored")
                continue
        if R.stage(f"engine_{p}", engine_stage, R, st, p) is None:
            continue
        if p == "bf16":
            finish(R, st)
            continue
        if st.noise is None:
            R.skip(f"rung6_{p}", "no bf16 noise scale (engine_bf16 did not run)")
            continue
        if st.swap is None:   # the lm_head is backed up too when a quantized-head variant will swap it
            st.swap = DequantSwap(st.model, st.shape, lm_head=any(variant(q).lm_head != "bf16" for q in st.profiles))
        R.stage(f"rung6_{p}", rung6_stage, R, st, p)
        finish(R, st)          # records so far: a run killed at the call's time limit keeps them

    S = R.doc["stages"]
    pred = st.hf_long_pred or 0.0
    if len(S.get("hf_control", {}).get("ttft", [])) > 1:
        R.skip("hf_ttft_long", "measured inside hf_control (predicted cheap)")
    elif pred > args.hf_long_cap_s:
        R.skip("hf_ttft_long", f"predicted {pred:.0f} s > --hf-long-cap-s {args.hf_long_cap_s:.0f}")
    elif R.left() < 1.3 * pred + 20:
        R.skip("hf_ttft_long", f"budget: {R.left():.0f} s left, predicted {pred:.0f} s")
    else:
        R.stage("hf_ttft_long", hf_ttft_long_stage, R, st)
    try:
        import modeld.convert.identity_preview  # noqa: F401  (availability check)
    except ImportError as exc:
        R.skip("weights_id", f"the converter has no identity preview ({exc})")
    else:
        if st.swap is not None and st.swap.applied is not None:
            R.skip("weights_id", f"HF still holds the dequantized {st.swap.applied} weights (restore skipped)")
        else:
            R.stage("weights_id", weights_id_stage, R, st)
    need = S.get("engine_bf16", {}).get("load", {}).get("seconds", 30) + 45
    if args.no_profiler:
        R.skip("profile", "--no-profiler")
    elif R.left() < need:
        R.skip("profile", f"budget: {R.left():.0f} s left, needs ~{need:.0f} s")
    else:
        R.stage("profile", profile_stage, R, st)

    finish(R, st)
    print(f"GATES {json.dumps(R.doc['gates'])}; certs {R.doc['certs']}; total {R.elapsed():.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
