"""Long-context TTFT of the qwen3_5 engine beside HF transformers, in ONE process on one copy of the weights.

Two rows of ../shared/design/TARGETS.md that no other bench measures:
* cold TTFT at --long tokens (TARGETS: <= 3 s bf16 at 32k): prefill + first argmax from an empty slot, best of --runs;
* the warm prefix hit of an agent turn (TARGETS: <= 50 ms for a 32k prefix and a 100-token suffix): the slot already
  holds --prefix tokens plus the previous turn's --suffix tokens; a run drops that turn (`truncate` back to the
  prefix, which restores the GDN checkpoint saved at the prefix's end), prefills the new --suffix tokens and takes
  the argmax. Timed as a whole (restore + suffix prefill + argmax) and split, best of --runs.

Exactness check (RELIABILITY.md: reuse is exact): the warm logits must equal, bit for bit, those of a cold prefill
of prefix + suffix. --prefix must be a multiple of --chunk so that both walk the same chunk boundaries.

HF, same weights and GPU, for the baseline column: one cold prefill at --long, then its cache of the prefix
(deep-copied per run, untimed) continued by the suffix, best of --runs (--no-hf skips it).

Stages: hf_load (the synth weights streamed into HF's model, which every engine is built from), hf_long, then one
engine_<profile> stage per --profiles entry. Writes $OUT/ttft_long.json after every stage.

    PYTHONUNBUFFERED=1 PYTHONPATH=src:. python3 bench/ttft_long.py --out $OUT            # H200, ~3-4 min
    dry run (CPU, reference kernels, tiny preset, ~30 s):
    OMP_NUM_THREADS=1 PYTHONPATH=src:. python bench/ttft_long.py --out /tmp/tl --device cpu --config tiny \\
        --long 96 --prefix 64 --suffix 5 --chunk 32 --runs 2 --workers 2
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _qwen_common as C  # noqa: E402
from _env import env_set  # noqa: E402
import cert_qwen3_5_27b as cert  # noqa: E402


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    C.add_checkpoint_args(ap)
    ap.add_argument("--profiles", default="bf16,fp8,int4", help="engine profiles (default bf16,fp8,int4)")
    ap.add_argument("--long", type=int, default=32768, help="cold TTFT prompt length (default 32768)")
    ap.add_argument("--prefix", type=int, default=32768, help="warm hit: tokens already in the slot (default 32768)")
    ap.add_argument("--suffix", type=int, default=100, help="warm hit: new tokens of the turn (default 100)")
    ap.add_argument("--chunk", type=int, default=None,
                    help="the engine's prefill_chunk (default: EngineOptions', 8192); must divide --prefix. "
                         "checkpoint_every stays the engine's (2048): pieces checkpoint inside themselves")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per number, the best is reported (default 3)")
    ap.add_argument("--no-hf", action="store_true", help="skip HF's timings (its model still holds the weights)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="wall budget (recorded; engine stages past it skip)")
    ap.add_argument("--suffix-bucket", type=int, default=None, metavar="N",
                    help="EngineOptions.suffix_bucket: the last piece of a prefill (<= N tokens) as one captured "
                         "padded step (0: off; default: what the serving cell takes, 128 on CUDA)")
    ap.add_argument("--kernel-table", type=int, default=0, metavar="N",
                    help="also profile one warm prefix hit per engine (torch.profiler): the N kernels with the most "
                         "device time, their summed device time against the hit's wall time (0: off, the default)")
    ap.add_argument("--save-cold-logits", default="", metavar="PREFIX",
                    help="save the cold prefill's last-token logits to PREFIX.<profile>.pt (fp32): compares builds "
                         "that differ at import time (e.g. $MODELD_ROUND_BITS) across processes, bit for bit")
    ap.add_argument("--cold-ab", default="", metavar="SPEC",
                    help="extra cold-TTFT variants, each run --runs times alternated with the default in the same "
                         "process (ratios, and logits against the default's): comma-separated, each NAME=VALUE pairs "
                         "joined by '+', NAME an environment switch read per call (MODELD_GDN_PREP=product, "
                         "MODELD_ATTN_CAUSAL_LOOP=split) or 'chunk' (the prefill chunk), e.g. "
                         "'MODELD_GDN_PREP=product,chunk=8192'")
    a = ap.parse_args(argv)
    if a.chunk is None:
        from modeld.models.qwen3_5.engine import EngineOptions

        a.chunk = EngineOptions().prefill_chunk
    if min(a.long, a.prefix, a.suffix, a.chunk, a.runs) < 1 or a.prefix % a.chunk:
        ap.error("--long, --prefix, --suffix, --chunk and --runs must be >= 1, and --chunk must divide --prefix")
    try:
        a.cold_ab = parse_ab(a.cold_ab)
    except ValueError as e:
        ap.error(f"--cold-ab: {e}")
    return a


def parse_ab(spec: str) -> list[tuple[str, dict[str, str], int | None]]:
    """'A=1+B=2,chunk=8192' -> [(label, {env}, chunk or None)]. Raises ValueError on a malformed item."""
    variants = []
    for item in [i for i in spec.split(",") if i]:
        env, chunk = {}, None
        for pair in item.split("+"):
            name, eq, value = pair.partition("=")
            if not eq or not name or not value:
                raise ValueError(f"{pair!r} is not NAME=VALUE")
            if name == "chunk":
                if not value.isdigit() or int(value) < 1:
                    raise ValueError(f"chunk={value!r} is not a positive integer")
                chunk = int(value)
            elif not name.startswith("MODELD_"):
                raise ValueError(f"{name!r}: only MODELD_* switches (or chunk) can be varied")
            else:
                env[name] = value
        variants.append((item, env, chunk))
    return variants


@contextlib.contextmanager
def variant(eng, env: dict[str, str], chunk: int | None):
    """The engine with the variant's switches set and prefill chunk, both put back after (checkpoint_every stays:
    a piece longer than it checkpoints inside itself)."""
    saved_options = eng.options
    if chunk:
        eng.options = dataclasses.replace(eng.options, prefill_chunk=chunk)
    try:
        with contextlib.ExitStack() as stack:
            for name, value in env.items():
                stack.enter_context(env_set(name, value))
            yield
    finally:
        eng.options = saved_options


def best(samples: list[float]) -> dict:
    return {"best_s": min(samples), "runs_s": samples}


def timed(fn) -> tuple[float, object]:
    C.sync()
    t0 = time.perf_counter()
    out = fn()
    C.sync()
    return time.perf_counter() - t0, out


def hf_long(R, st) -> dict:
    """HF: cold prefill at --long; then prefix once with its cache, and per run a deep copy of that cache continued by
    the suffix (copy untimed)."""
    import torch

    a, m, vocab = R.args, st.model, st.cfg.vocab
    ids = lambda toks: torch.tensor([toks], device=st.dev)  # noqa: E731
    with torch.no_grad():
        cold, _ = timed(lambda: int(torch.argmax(m(input_ids=ids(C.ttft_ids(a.long, vocab)), use_cache=True,
                                                   logits_to_keep=1).logits[0, -1])))
        out = m(input_ids=ids(C.ttft_ids(a.prefix, vocab)), use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        del out
        warm, suffix = [], ids(C.ttft_ids(a.suffix, vocab, offset=1))
        for _ in range(a.runs):
            c = copy.deepcopy(cache)
            t, _ = timed(lambda: int(torch.argmax(m(input_ids=suffix, past_key_values=c, use_cache=True,
                                                    logits_to_keep=1).logits[0, -1])))
            warm.append(t)
            del c
        st.hf_warm_logits = m(input_ids=suffix, past_key_values=copy.deepcopy(cache), use_cache=True,
                              logits_to_keep=1).logits[0, -1].float().cpu()
    del cache
    C.release()
    res = {"cold": {"tokens": a.long, "ttft_s": cold}, "warm": {"prefix": a.prefix, "suffix": a.suffix, **best(warm)}}
    res["summary"] = f"HF cold TTFT {a.long}: {cold:.2f} s; warm {a.prefix}+{a.suffix}: {min(warm) * 1e3:.1f} ms"
    return res


def engine_long(R, st, profile: str) -> dict:
    """One engine: cold TTFT at --long, the warm prefix hit (whole and split), and its exactness against a cold
    prefill of prefix + suffix."""
    import torch

    a, vocab = R.args, st.cfg.vocab
    eng, build_s = C.engine_from_hf(st, profile, a.seed, a.workers, suffix_bucket=a.suffix_bucket)
    # what the engine holds once built (the suffix bucket's graphs keep one private memory pool per slot)
    memory = ({"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
               "suffix_bucket_graphs": eng.bucket_graph_bytes} if torch.cuda.is_available() else None)
    eng.options = dataclasses.replace(eng.options, prefill_chunk=a.chunk)
    long_ids, prefix = C.ttft_ids(a.long, vocab), C.ttft_ids(a.prefix, vocab)
    turn = C.ttft_ids(a.suffix, vocab, offset=1)
    last = C.ttft_ids(a.suffix, vocab, offset=2)  # the previous turn's tokens, dropped by every warm run

    def cold_run(ids):
        eng.reset_slot(0)
        return timed(lambda: int(torch.argmax(eng.prefill(0, ids))))[0]

    cold_run(long_ids[: min(a.long, 2 * a.chunk)])  # compiles / autotunes every prefill shape before timing
    cold = [cold_run(long_ids) for _ in range(a.runs)]
    if a.save_cold_logits:
        torch.save(eng.logits[0].float().cpu(), f"{a.save_cold_logits}.{profile}.pt")
    eng.reset_slot(0)
    cold_full_s, _ = timed(lambda: eng.prefill(0, prefix + turn))
    want = eng.logits[0].clone()
    eng.reset_slot(0)
    eng.prefill(0, prefix + last)
    whole, restore, suffix = [], [], []
    for _ in range(a.runs):
        C.sync()
        t0 = time.perf_counter()
        eng.truncate(0, a.prefix, prefix)
        C.sync()
        t1 = time.perf_counter()
        int(torch.argmax(eng.prefill(0, turn)))
        C.sync()
        t2 = time.perf_counter()
        whole.append(t2 - t0)
        restore.append(t1 - t0)
        suffix.append(t2 - t1)
        got = eng.logits[0].clone()
        eng.truncate(0, a.prefix, prefix)
        eng.prefill(0, last)  # back to "prefix + the previous turn" for the next run
    diff = float((got - want).abs().max())
    cold_ab = cold_variants(a, eng, cold_run, long_ids) if a.cold_ab else None
    table = None
    if a.kernel_table > 0:  # the suffix prefill once more under the profiler: is it host-bound (device sum << wall)?
        eng.truncate(0, a.prefix, prefix)
        table = C.kernel_table(lambda: int(torch.argmax(eng.prefill(0, turn))), st.dev, top=a.kernel_table,
                               total_wanted=True)
        table["suffix_prefill_wall_s"] = min(suffix)
        eng.truncate(0, a.prefix, prefix)
        eng.prefill(0, last)
        cold_table = C.kernel_table(lambda: cold_run(long_ids), st.dev, top=a.kernel_table, total_wanted=True)
    res = {"build_s": build_s, "gpu_memory_after_build": memory, "chunk": a.chunk,
           "checkpoint_every": eng.options.checkpoint_every,
           "cold": {"tokens": a.long, **best(cold)},
           "cold_prefix_plus_suffix_s": cold_full_s,
           "warm": {"prefix": a.prefix, "suffix": a.suffix, **best(whole), "restore_best_s": min(restore),
                    "suffix_prefill_best_s": min(suffix)},
           "warm_vs_cold_logits_max_abs": diff, "warm_equals_cold": diff == 0.0}
    if table is not None:
        res["warm_kernel_table"], res["cold_kernel_table"] = table, cold_table
    if cold_ab is not None:
        res["cold_ab"] = cold_ab
    if getattr(st, "hf_warm_logits", None) is not None:
        hf = st.hf_warm_logits
        res["warm_vs_hf"] = {"max_abs": float((got.float().cpu() - hf).abs().max()),
                             "argmax_equal": int(torch.argmax(got)) == int(torch.argmax(hf))}
    res["summary"] = (f"cold TTFT {a.long}: {min(cold):.3f} s; warm {a.prefix}+{a.suffix}: {min(whole) * 1e3:.1f} ms "
                      f"(restore {min(restore) * 1e3:.2f} ms, suffix {min(suffix) * 1e3:.1f} ms); warm == cold logits: "
                      f"{diff == 0.0} (max|Δ| {diff:.3g})")
    for label, row in (cold_ab or {}).get("variants", {}).items():
        res["summary"] += (f"; cold {label}: {row['ratio_best']:.3f}x the default "
                           f"(max|Δlogits| {row['logits_max_abs']:.3g})")
    if table is not None:
        res["summary"] += (f"; kernels (device sum) warm {table['summed_ms_per_run']:.1f} ms in "
                           f"{table['launches_per_run']:.0f} launches, cold {cold_table['summed_ms_per_run']:.0f} ms")
    del eng
    C.release()
    return res


def cold_variants(a, eng, cold_run, long_ids) -> dict:
    """--cold-ab: per round the default cold run, then each variant's; best of --runs each, the ratio variant /
    default, and the variant's last-token logits against the default's."""
    for label, env, chunk in a.cold_ab:  # compile each variant's kernels / shapes before timing
        t0 = time.perf_counter()
        with variant(eng, env, chunk):
            cold_run(long_ids[: min(a.long, 2 * (chunk or a.chunk))])
        print(f"cold-ab warm-up {label}: {time.perf_counter() - t0:.1f} s", flush=True)  # progress if a call times out
    base, runs, logits = [], {label: [] for label, _, _ in a.cold_ab}, {}
    for _ in range(a.runs):
        base.append(cold_run(long_ids))
        want = eng.logits[0].float().clone()
        for label, env, chunk in a.cold_ab:
            with variant(eng, env, chunk):
                runs[label].append(cold_run(long_ids))
            logits[label] = float((eng.logits[0].float() - want).abs().max())
            print(f"cold-ab round {len(base)} {label}: {runs[label][-1]:.3f} s (default {base[-1]:.3f} s)", flush=True)
    return {"default": best(base), "variants": {
        label: {**best(runs[label]), "ratio_best": min(runs[label]) / min(base), "logits_max_abs": logits[label]}
        for label, _, _ in a.cold_ab}}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parse(argv)
    os.makedirs(a.out, exist_ok=True)
    R = C.Run(a, argv, "ttft_long", {"targets": {"cold_ttft_s_bf16_32k": 3.0, "warm_prefix_hit_ttft_s": 0.050}})
    st = C.hf_engine_state(a, R)
    st.capacity = max(a.long, a.prefix + 2 * a.suffix) + 64
    if R.stage("hf_load", cert.hf_load, R, st) is None:
        return 1
    if a.no_hf:
        R.skip("hf_long", "--no-hf")
    else:
        R.stage("hf_long", hf_long, R, st)
    for p in [p for p in a.profiles.split(",") if p]:
        if R.left() <= 0:
            R.skip(f"engine_{p}", "budget spent")
            continue
        R.stage(f"engine_{p}", engine_long, R, st, p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
