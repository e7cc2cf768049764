"""Where a decode step's time goes: host overhead, and what each non-GEMV op would save if fused away.

A speed-of-light bench for choosing the next fusion, not a correctness bench. Per profile, in ONE process
(timings across device calls drift; only ratios within a run are compared):

* `base`: the engine as shipped. Its decode step is timed four ways at a 128-token context, each the median
  over `--steps`: graph replays back to back with one sync at the end (device time per step), one replay +
  sync per step, `engine.decode([tok])` + sync, and decode + argmax + `.item()` (the loop of
  bench/engine_qwen3_5.py). The differences are the host costs: the sync round trip, decode()'s input
  copies and bookkeeping, the argmax and the read. Plus a torch.profiler table of the replayed kernels.
* what-if variants: the engine is rebuilt (its CUDA graph re-captured) with one kind of op replaced by a
  stand-in that launches NOTHING and returns a tensor of the right shape (an input view, or torch.empty).
  The logits are then garbage; only the time counts. base minus variant is an upper bound on what fusing
  that op into its neighbours could save (the fused kernel still does the op's work, but no longer pays its
  launch, its dependency on the previous kernel and its own round trip):

  | variant | ops dropped per step (27B) |
  |---|---|
  | norms | the 127 `add_rms_norm` between sublayers |
  | gated_norm | the 48 GDN gated RMSNorms |
  | rope | the 32 q/k-norm RoPE launches |
  | conv | the 48 conv1d decode updates |
  | ba | the 48 GDN `ba` projections (bf16 GEMV; int4 / fp8 only: in bf16 `linear` is every GEMV) |
  | gdn | the 48 GDN recurrent steps |
  | attn | the 16 decode attentions |
  | small | all of the above: what is left is embedding, the GEMVs (+ split-K finish) and the logits |

Writes $OUT/engine_whatif.json.

    PYTHONUNBUFFERED=1 PYTHONPATH=src:. python3 bench/engine_whatif.py --out $OUT --profiles int4,fp8
    dry run (CPU, reference kernels, tiny preset, ~15 s):
    OMP_NUM_THREADS=1 PYTHONPATH=src:. python bench/engine_whatif.py --out /tmp/wi --device cpu --config tiny \
        --steps 3 --workers 2 --variants norms,small
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import types

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _qwen_common as C  # noqa: E402
import cert_qwen3_5_27b as cert  # noqa: E402

VARIANTS = ("norms", "gated_norm", "rope", "conv", "ba", "gdn", "attn", "small")


def _stand_ins(ks, names: set[str]) -> dict:
    """{(module, attribute): replacement} for the dropped ops: each returns a right-shaped tensor and
    launches no kernel (views of inputs, or torch.empty from the caching allocator)."""
    import torch

    out = {}
    if "norms" in names:
        out[(ks.rmsnorm, "add_rms_norm")] = lambda x, res, w, eps, zc=True: types.SimpleNamespace(out=x, residual=res)
    if "gated_norm" in names:
        out[(ks.gated_rmsnorm, "gated_rms_norm")] = lambda o, z, w, eps: o
    if "rope" in names:
        out[(ks.rope, "qk_norm_rope")] = lambda x, w, pos, inv_freq, eps: _empty(x)
    if "conv" in names:
        out[(ks.conv1d, "causal_conv1d_decode")] = lambda x, w, state: _empty(x)
    if "ba" in names:  # bf16 `linear` with a bf16 output is only the ba projection in int4 / fp8 engines; the
        real = ks.linear.linear  # lm_head (fp32 output, via kernels/logits) keeps the real kernel

        def ba_stand_in(x, weight, out_dtype=torch.bfloat16):
            if out_dtype != torch.bfloat16:
                return real(x, weight, out_dtype)
            return torch.empty(x.shape[0], weight.shape[0], dtype=out_dtype, device=x.device)
        out[(ks.linear, "linear")] = ba_stand_in
    if "gdn" in names:
        out[(ks.gdn, "gdn_decode")] = lambda q, k, v, a, b, A_log, dt_bias, state: _empty(v)
    if "attn" in names:
        out[(ks.attention, "attention_decode")] = lambda q, k, v, kc, vc, lens, scale, gate=None: _empty(q)
    return out


def _empty(x):
    """A contiguous uninitialised tensor shaped like x (no kernel launch)."""
    import torch
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@contextlib.contextmanager
def _dropped(ks, names: set[str]):
    """Patch the stand-ins into the kernel modules for the duration (the engine captures its graph inside)."""
    patches = _stand_ins(ks, names)
    saved = {key: getattr(*key) for key in patches}
    try:
        for (mod, attr), fn in patches.items():
            setattr(mod, attr, fn)
        yield
    finally:
        for (mod, attr), fn in saved.items():
            setattr(mod, attr, fn)


def _median(fn, steps: int) -> float:
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def step_times(eng, steps: int) -> dict:
    """The four timings of one engine's decode step (seconds, medians; replay_only is a mean)."""
    import torch

    eng.reset_slot(0)
    eng.prefill(0, C.ttft_ids(128, eng.config.vocab))
    for _ in range(5):
        int(torch.argmax(eng.decode([11])[0]))
    C.sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        eng.graph()
    C.sync()
    out = {"replay_only_s": (time.perf_counter() - t0) / steps}
    out["replay_sync_s"] = _median(lambda: (eng.graph(), C.sync()), steps)
    out["decode_sync_s"] = _median(lambda: (eng.decode([11]), C.sync()), steps)
    out["decode_argmax_item_s"] = _median(lambda: int(torch.argmax(eng.decode([11])[0])), steps)
    eng.reset_slot(0)
    return out


def profile_stage(st, profile: str) -> dict:
    a = st.args
    names = ["base"] + [v for v in a.variants.split(",") if v]
    runs: dict = {n: [] for n in names}
    table = None
    for r in range(a.rounds):
        for name in names:
            ks = _kernels(st)
            drop = set(VARIANTS[:-1]) if name == "small" else ({name} - {"base"})
            if profile == "bf16":
                drop.discard("ba")
            with _dropped(ks, drop):
                eng, build_s = C.engine_from_hf(st, profile, a.seed, a.workers)
            res = {"build_s": build_s, "graph_captured": eng.graph.captured, "graph_error": eng.graph_error,
                   **step_times(eng, a.steps)}
            if name == "base" and r == 0:
                eng.prefill(0, C.ttft_ids(128, eng.config.vocab))
                eng.decode([11])
                table = C.kernel_table(eng.graph, st.dev, top=20, repeat=5)
            runs[name].append(res)
            del eng
            C.release()
    best = {n: min(x["replay_only_s"] for x in runs[n]) for n in names}
    out = {"runs": runs, "replay_only_best_s": best, "base_kernel_table": table,
           "saving_us": {n: (best["base"] - best[n]) * 1e6 for n in names if n != "base"}}
    b = runs["base"][0]
    out["host_us"] = {"sync_round_trip": (b["replay_sync_s"] - b["replay_only_s"]) * 1e6,
                      "decode_inputs": (b["decode_sync_s"] - b["replay_sync_s"]) * 1e6,
                      "argmax_item": (b["decode_argmax_item_s"] - b["decode_sync_s"]) * 1e6}
    out["summary"] = (f"replay {best['base'] * 1e3:.3f} ms; host " +
                      ", ".join(f"{k} {v:.0f} us" for k, v in out["host_us"].items()) + "; savings " +
                      ", ".join(f"{n} {v:.0f} us" for n, v in out["saving_us"].items()))
    return out


def _kernels(st):
    from modeld.execution.bindings import default_kernels
    return default_kernels(st.dev)


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    C.add_checkpoint_args(ap)
    ap.add_argument("--profiles", default="int4", help="engine profiles (default int4)")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"what-if variants beside base (default all: {','.join(VARIANTS)})")
    ap.add_argument("--rounds", type=int, default=2, help="alternations per profile (default 2)")
    ap.add_argument("--steps", type=int, default=64, help="decode steps per timing (default 64)")
    ap.add_argument("--budget-s", type=float, default=500.0, help="wall budget (recorded)")
    a = ap.parse_args(argv)
    bad = [v for v in a.variants.split(",") if v and v not in VARIANTS]
    if bad:
        ap.error(f"--variants: unknown {', '.join(bad)} (choose from {', '.join(VARIANTS)})")
    return a


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parse(argv)
    os.makedirs(a.out, exist_ok=True)
    R = C.Run(a, argv, "engine_whatif", {"variants": a.variants})
    st = C.hf_engine_state(a, R)
    if R.stage("hf_load", cert.hf_load, R, st) is None:
        return 1
    for p in [p for p in a.profiles.split(",") if p]:
        R.stage(f"whatif_{p}", profile_stage, st, p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
