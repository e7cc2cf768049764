"""A/B of engine switches (environment variables) in ONE process: decode speed side by side, logits checked.

Timings across device calls drift by 10-20 %, so an engine-level A/B must build every variant in the same
process, on the same weights, and alternate them. Per profile and round, each variant's environment is set,
a fresh engine is built (its CUDA graph captures what the switches select), its teacher-forced logits on a
few seeded cases are compared with the first variant's (a pure scheduling switch such as MODELD_PDL must
give max |Δ| = 0) and its decode is timed (graph replay + argmax + host read at a 128-token context, as
bench/engine_qwen3_5.py). The weights are streamed once into HF's model, which only holds them
(`modeld.qualify.hf_weights.HFParamSource`). Only switches read at launch time take effect here
(MODELD_PDL, MODELD_LOADS_FIRST, MODELD_GEMV_INT4, MODELD_GEMV_SPLIT_FINISH, MODELD_ATTN_DECODE, ...); those
read when their module is imported (docs/architecture.md) need a process per variant. Writes
$OUT/engine_ab.json.

    PYTHONUNBUFFERED=1 PYTHONPATH=src:. python3 bench/engine_ab.py --out $OUT --profiles int4,bf16 \
        --variant off:MODELD_PDL=0 --variant pdl:MODELD_PDL=1
    batch 8 (8 slots; int4: the skinny tile against the batched mma.sync GEMV):
    ... bench/engine_ab.py --out $OUT --profiles int4 --slots 8 --variant skinny:MODELD_GEMV_INT4=v2 \
        --variant hmma:MODELD_GEMV_INT4=hmma
    dry run (CPU, reference kernels, tiny preset, ~10 s):
    OMP_NUM_THREADS=1 PYTHONPATH=src:. python bench/engine_ab.py --out /tmp/ab --device cpu --config tiny \
        --variant a:MODELD_PDL=0 --variant b:MODELD_PDL=1 --steps 3 --workers 2
"""

from __future__ import annotations

import argparse
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _qwen_common as C  # noqa: E402
import cert_qwen3_5_27b as cert  # noqa: E402


def variant(text: str) -> tuple[str, dict]:
    """'name:K=V[,K=V...]' -> (name, {K: V}). A comma starts a new pair only before 'KEY=', so a value may hold
    commas (MODELD_GDN_BATCH_TILE=32,4)."""
    name, _, rest = text.partition(":")
    pairs = [kv.split("=", 1) for kv in re.split(r",(?=[A-Za-z_][A-Za-z0-9_]*=)", rest) if kv]
    env = dict(p for p in pairs if len(p) == 2)
    if not name or "=" in name or not pairs or len(env) != len(pairs) or any(not k for k in env):
        raise argparse.ArgumentTypeError(f"--variant {text!r}: expected NAME:ENV=VALUE[,ENV=VALUE...]")
    return name, env


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    C.add_checkpoint_args(ap)
    ap.add_argument("--variant", type=variant, action="append", required=True,
                    help="NAME:ENV=VALUE[,ENV=VALUE...] (repeat; the first is the baseline)")
    ap.add_argument("--profiles", default="int4,bf16", help="engine profiles (default int4,bf16)")
    ap.add_argument("--rounds", type=int, default=2, help="alternations A B A B ... per profile (default 2)")
    ap.add_argument("--steps", type=int, default=128, help="decode steps timed per build (default 128)")
    ap.add_argument("--cases", type=int, default=3, help="seeded teacher-forced cases for the logit check")
    ap.add_argument("--tokens", type=int, default=16, help="forced tokens per case (default 16)")
    ap.add_argument("--slots", type=int, default=1,
                    help="engine slots: every decode step runs one token per slot (batched GEMVs at > 1; tok/s counts "
                    "all slots; the logit check runs each case in every slot and compares slot 0)")
    ap.add_argument("--kernel-table", type=int, default=0, metavar="N",
                    help="also record the N kernels with the most device time per graph replay (torch.profiler, 5 "
                    "replays) of each variant's first build (default 0: none)")
    ap.add_argument("--sampling", type=sampling_params, default=None, metavar="T,K,P",
                    help="time each step with execution.sampler.SlotSampler configured with temperature T, top_k K, "
                         "top_p P in every slot (seed = slot) instead of an argmax, e.g. 0.7,20,0.8; sampler "
                         "switches such as MODELD_SAMPLER_TOPK are read per pick, so they A/B here")
    ap.add_argument("--budget-s", type=float, default=500.0, help="wall budget (recorded)")
    return ap.parse_args(argv)


def sampling_params(text: str) -> tuple[float, int, float]:
    """--sampling "T,K,P" -> (temperature, top_k, top_p); argparse reports a ValueError as a usage error."""
    t, k, p = text.split(",")
    t, k, p = float(t), int(k), float(p)
    if t < 0 or k < 0 or not 0 < p <= 1:
        raise ValueError(text)
    return t, k, p


def slot_sampler(eng, sampling: tuple[float, int, float] | None):
    """`SlotSampler.pick` for every slot of eng with (temperature, top_k, top_p) (None: None)."""
    if sampling is None:
        return None
    from modeld.execution.sampler import SlotSampler

    t, k, p = sampling
    s = SlotSampler(eng.kernels.sampling, eng.options.slots, eng.device)
    for slot in range(eng.options.slots):
        s.configure(slot, temperature=t, top_k=k, top_p=p, seed=slot)
    return s.pick


def build_and_time(st, profile: str, env: dict, want_logits: bool) -> tuple[dict, list | None]:
    """A fresh engine under `env` (restored afterwards): decode speed, and its teacher-forced logits (with them, when
    --kernel-table is set, the profiler's table of one decode step's replayed kernels)."""
    with C.held_env(env):
        eng, build_s = C.engine_from_hf(st, profile, st.args.seed, st.args.workers, st.args.slots)
        logits = [x.to("cpu") for x in C.engine_tf_logits(eng, st.cases)] if want_logits else None
        d = C.engine_bench.decode_speed(eng, st.args.steps, 128, pick=slot_sampler(eng, st.args.sampling))
        res = {"build_s": build_s, "graph_captured": eng.graph.captured,
               **{k: d[k] for k in ("p50_s", "p90_s", "tok_per_s_p50")}}
        if want_logits and st.args.kernel_table and eng.graph.captured:
            res["kernel_table"] = C.kernel_table(eng.graph, st.dev, top=st.args.kernel_table, repeat=5)
    del eng
    C.release()
    return res, logits


def profile_stage(st, profile: str) -> dict:
    names = [n for n, _ in st.args.variant]
    runs: dict = {n: [] for n in names}
    diffs: dict = {}
    base = None
    for r in range(st.args.rounds):
        for name, env in st.args.variant:
            res, logits = build_and_time(st, profile, env, want_logits=r == 0)
            runs[name].append(res)
            if logits is not None:
                if base is None:
                    base = logits
                diffs[name] = max(float((a - b).abs().max()) for a, b in zip(logits, base))
    out = {"variants": {n: {"runs": runs[n], "tok_per_s_p50_best": max(x["tok_per_s_p50"] for x in runs[n]),
                            "p50_s_median_of_runs": sorted(x["p50_s"] for x in runs[n])[len(runs[n]) // 2],
                            "max_abs_logit_diff_vs_baseline": diffs[n]} for n in names}}
    b = out["variants"][names[0]]["tok_per_s_p50_best"]
    out["summary"] = ", ".join(f"{n} {v['tok_per_s_p50_best']:.1f} tok/s ({v['tok_per_s_p50_best'] / b:.3f}x, "
                               f"logits max|Δ| {v['max_abs_logit_diff_vs_baseline']:.3g})"
                               for n, v in out["variants"].items())
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parse(argv)
    os.makedirs(a.out, exist_ok=True)
    R = C.Run(a, argv, "engine_ab", {"variants": dict(a.variant)})
    st = C.hf_engine_state(a, R)
    st.cases = C.random_cases(a.cases, 16, a.tokens, st.shape.bos_id, 20261201)
    if R.stage("hf_load", cert.hf_load, R, st) is None:
        return 1
    for p in [p for p in a.profiles.split(",") if p]:
        R.stage(f"ab_{p}", profile_stage, st, p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
