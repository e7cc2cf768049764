"""How often does the near-tie rule see an "other" argmax flip by chance? Rung 6 on many more positions.

Rung 6 of `bench/cert_qwen3_5_27b.py` fails a profile on ONE argmax disagreement beyond `tie + top-k
error` over 96 teacher-forced positions. On the synthetic 27B checkpoint the logits are nearly flat, so
whether one such flip lands in those 96 positions may be chance. This bench measures the rate on many
more positions, in one process, for every source of logits that the gates judge:

  bf16        the bf16 engine vs HF (original weights): the bf16 gate's own noise
  int4:<v>    the int4 engine with decode GEMV policy <v> (MODELD_GEMV_INT4: v2, hmma, ...) vs HF on
              bf16(dequant(quant(W))) — rung 6 itself

Cases: --cases seeded random prompts of --prompt-len tokens, each followed by --tokens seeded random
forced tokens (teacher forcing needs no greedy run: every position compares two sets of logits for the
same context; HF's cached greedy costs ~130 ms per token at 27B). Per source it reports positions, exact
argmax, near-tie and other disagreements (compare_logits, unchanged), max / mean |Δ|, and every
"other" flip with its margin, allowed margin and engine lead. Writes $OUT/rung6_flip_rate.json.

    PYTHONUNBUFFERED=1 PYTHONPATH=src:. python3 bench/rung6_flip_rate.py --out $OUT --variants v2,hmma
    dry run (CPU, reference kernels, tiny preset, ~1 min):
    OMP_NUM_THREADS=1 PYTHONPATH=src:. python bench/rung6_flip_rate.py --out /tmp/fr --device cpu --config tiny \
        --cases 2 --tokens 6 --variants v2 --workers 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _qwen_common as C  # noqa: E402
import cert_qwen3_5_27b as cert  # noqa: E402


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    C.add_checkpoint_args(ap)
    ap.add_argument("--cases", type=int, default=16, help="prompts (default 16)")
    ap.add_argument("--prompt-len", type=int, default=24, help="tokens per prompt (default 24)")
    ap.add_argument("--tokens", type=int, default=48, help="forced tokens per prompt = positions (default 48)")
    ap.add_argument("--case-seed", type=int, default=20261130, help="seed of the prompt / forced token ids")
    ap.add_argument("--variants", default="v2,hmma", help="int4 decode GEMV policies (MODELD_GEMV_INT4 values)")
    C.add_compare_args(ap)
    ap.add_argument("--steps", type=int, default=64, help="decode steps timed per engine (default 64)")
    ap.add_argument("--budget-s", type=float, default=400.0, help="wall budget (recorded; stages always run)")
    return ap.parse_args(argv)


def judge(name: str, eng_logits, ref_logits, a) -> dict:
    m = C.other_flips(eng_logits, ref_logits, a.top_k, a.tie)
    m["other_rate"] = m["other_disagreements"] / max(m["positions"], 1)
    m["summary"] = (f"{name}: {m['positions']} positions, exact {m['argmax_agree']}, near-tie "
                    f"{m['near_tie_disagreements']}, other {m['other_disagreements']}, max|Δ| "
                    f"{m['max_abs_full']:.3f}, mean {m['mean_abs_full']:.4f}")
    return m


def engine_logits(st, profile: str, variant: str | None) -> tuple[list, dict]:
    """Teacher-forced logits (on the host) of a fresh engine; `variant` sets the int4 GEMV policy before
    the build, so its CUDA graph captures that kernel."""
    from modeld.kernels.linear import gemv_mma

    saved = os.environ.get(gemv_mma.INT4_GEMV_ENV)
    if variant:
        os.environ[gemv_mma.INT4_GEMV_ENV] = variant
    try:
        eng, _ = C.engine_from_hf(st, profile, st.args.seed, st.args.workers)
        t0 = time.perf_counter()
        logits = [x.to("cpu") for x in C.engine_tf_logits(eng, st.cases)]
        info = {"teacher_forced_s": time.perf_counter() - t0, "graph_captured": eng.graph.captured,
                "int4_gemv": gemv_mma.int4_gemv()}
        d = C.engine_bench.decode_speed(eng, st.args.steps, 128)   # same run: the variants' speed side by side
        info["decode"] = {k: d[k] for k in ("p50_s", "p90_s", "tok_per_s_p50") if k in d}
    finally:
        os.environ.pop(gemv_mma.INT4_GEMV_ENV, None)
        if saved is not None:
            os.environ[gemv_mma.INT4_GEMV_ENV] = saved
    del eng
    C.release()
    return logits, info


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parse(argv)
    os.makedirs(a.out, exist_ok=True)
    import torch

    from modeld.convert.qwen3_5_spec import hf_config, preset
    from modeld.models.qwen3_5.config import Qwen35Config
    from modeld.qualify.hf_weights import DequantSwap

    R = C.Run(a, argv, "rung6_flip_rate", {"rule": "modeld.qualify.logit_compare.compare_logits (unchanged)"})
    st = types.SimpleNamespace(args=a, dev=torch.device(a.device), shape=preset(a.config, a.layers))
    if st.dev.type != "cuda":
        C.cpu_shims()
    st.cfg = Qwen35Config.from_hf(hf_config(st.shape))
    st.capacity = max(a.prompt_len + a.tokens + 64, 512)
    st.cases = C.random_cases(a.cases, a.prompt_len, a.tokens, st.shape.bos_id, a.case_seed)
    R.doc.update({"versions": C.versions(st.dev), "config": a.config, "layers": st.shape.layers, "seed": a.seed,
                  "cases": a.cases, "prompt_len": a.prompt_len, "tokens": a.tokens})
    if R.stage("hf_load", cert.hf_load, R, st) is None:
        return 1

    def reference(tag):
        t0 = time.perf_counter()
        st.ref = C.hf_tf_logits(st.model, st.cases, st.dev)
        return {"seconds": time.perf_counter() - t0, "summary": f"HF teacher-forced logits ({tag})"}

    def judged(name, profile, variant):
        logits, info = engine_logits(st, profile, variant)
        return {**info, **judge(name, logits, st.ref, a)}

    R.stage("hf_reference", reference, "original weights")
    R.stage("bf16", judged, "bf16", "bf16", None)
    variants = [v for v in a.variants.split(",") if v]
    logits = {}

    def build(v):
        logits[v], info = engine_logits(st, "int4", v)
        return {"info": info, "summary": f"int4 engine, GEMV policy {info['int4_gemv']}, decode "
                                         f"{info['decode'].get('tok_per_s_p50', 0):.1f} tok/s"}

    for v in variants:   # every int4 engine first, then HF is swapped once
        R.stage(f"int4_build_{v}", build, v)
    swap = DequantSwap(st.model, st.shape)
    swap.backup()
    swap.apply("int4")
    R.stage("hf_reference_int4", reference, "dequantized int4 weights")
    for v, lg in logits.items():
        R.stage(f"int4:{v}", lambda v=v, lg=lg: {"info": R.doc["stages"][f"int4_build_{v}"]["info"],
                                                  **judge(f"int4:{v}", lg, st.ref, a)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
