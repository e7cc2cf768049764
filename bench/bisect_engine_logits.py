"""Which commit moved the engine's numbers: ONE HF load, then each tree's engine on the certification's cases.

A certification gate that moves between two commits (KNOWLEDGE/findings/fp8-rung6-flips-rose-between-s28-and-s31.md)
costs one full `cert-at` run (≈ 6 min) per bisection step. This bench loads the synthetic 27B into HF once, computes
the rung-6 reference once (HF on bf16(dequant(quant(W))) for a quantized profile, HF itself for bf16) over the
certification's fixture + flip set (the same 1632 positions, the same seeds), then, per tree made by
`tools/tree_at.sh COMMIT`, imports THAT tree's modeld and bench helpers afresh (every module of the previous tree
dropped from sys.modules), builds its engine from HF's parameters exactly as the certification does and records:

  digests   the certification's logits digests (fixture, flip set): equal digests = the same numbers
  flips     "other" argmax flips vs the reference (the rung-6 count; the near-tie rule unchanged)
  vs_first  max |Δ| against the first tree's logits (0: bit for bit)

Every tree's row is saved as soon as it is done ($OUT/bisect_engine_logits.json), so a call cut short keeps them.
The comparison functions are HEAD's (bound before the first tree is imported).

    PYTHONUNBUFFERED=1 PYTHONPATH=src:. python3 bench/bisect_engine_logits.py --out $OUT \\
        --trees .scratch/at-e514bc0,.scratch/at-4fd3400,. --profile fp8
    dry run (CPU, reference kernels): OMP_NUM_THREADS=1 PYTHONPATH=src:. python bench/bisect_engine_logits.py \\
        --out /tmp/bis --trees .,.scratch/at-e514bc0 --device cpu --config tiny --workers 2 --flip-cases 2
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import types

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)

import _qwen_common as C  # noqa: E402
import cert_qwen3_5_27b as cert  # noqa: E402


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", required=True,
                    help="comma-separated code trees (tools/tree_at.sh COMMIT -> .scratch/at-COMMIT; '.' = this one), "
                         "in the order to run; 'TREE|VAR=VALUE+VAR=VALUE' runs that tree with those environment "
                         "variables set (e.g. '.|MODELD_ROUND_BITS=1': one of a commit's switches back)")
    ap.add_argument("--profile", default="fp8", choices=("bf16", "fp8", "int4"), help="engine profile (default fp8)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="no new tree starts past this many seconds")
    own, rest = ap.parse_known_args(argv)
    # the certification's own options (seeds, case counts, near-tie rule, capacity) with its defaults
    ca = cert.parse(rest)
    return own, ca


def purge_trees(roots: list[str]) -> None:
    """Drop every module loaded from one of `roots` (modeld and the bench helpers) and their sys.path entries, so
    the next import comes from the next tree."""
    roots = [os.path.realpath(r) + os.sep for r in roots]
    for name, mod in list(sys.modules.items()):
        f = getattr(mod, "__file__", None) or ""
        if name != "__main__" and (name == "modeld" or name.startswith("modeld.")
                                   or any(os.path.realpath(f).startswith(r) for r in roots)):
            del sys.modules[name]
    sys.path[:] = [p for p in sys.path if not any(os.path.realpath(p) + os.sep == r or
                                                  (os.path.realpath(p) + os.sep).startswith(r) for r in roots)]


def tree_env(spec: str) -> tuple[str, dict[str, str]]:
    """'TREE|VAR=VALUE+VAR=VALUE' -> (TREE, {VAR: VALUE}); a bare TREE has no variables."""
    tree, _, env = spec.partition("|")
    pairs = [p.partition("=") for p in env.split("+") if p]
    bad = [p[0] for p in pairs if not p[1] or not p[0].startswith("MODELD_")]
    if bad:
        raise SystemExit(f"--trees {spec!r}: variables are MODELD_NAME=VALUE joined by '+', got {bad}")
    return tree, {k: v for k, _, v in pairs}


def tree_engine_logits(tree: str, st, profile: str, ca, roots: list[str]):
    """(logits of the fixture + flip set on CPU, build seconds, commit) with `tree`'s modeld and bench helpers."""
    purge_trees(roots)   # also re-reads the switches modeld takes at import ($MODELD_ROUND_BITS)
    tree = os.path.realpath(tree)
    sys.path[:0] = [os.path.join(tree, "bench"), os.path.join(tree, "src")]
    tc = importlib.import_module("_qwen_common")
    spec = importlib.import_module("modeld.convert.qwen3_5_spec")
    config = importlib.import_module("modeld.models.qwen3_5.config")
    assert tc.__file__.startswith(tree) and spec.__file__.startswith(tree), (tc.__file__, spec.__file__)
    tst = types.SimpleNamespace(model=st.model, dev=st.dev, capacity=st.capacity,
                                shape=spec.preset(ca.config, ca.layers))
    tst.cfg = config.Qwen35Config.from_hf(spec.hf_config(tst.shape))
    eng, build_s = tc.engine_from_hf(tst, profile, ca.seed, ca.workers)
    # the certification's order: the fixture's cases, then the flip set's, on one engine
    logits = [x.to("cpu") for x in tc.engine_tf_logits(eng, st.forced)]
    logits += [x.to("cpu") for x in tc.engine_tf_logits(eng, st.flip)]
    del eng
    tc.release()
    commit_file = os.path.join(tree, "COMMIT")
    commit = open(commit_file).read().strip() if os.path.exists(commit_file) else os.environ.get("MODELD_COMMIT", "?")
    return logits, build_s, commit


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, ca = parse(argv)
    os.makedirs(ca.out, exist_ok=True)
    import torch

    from modeld.convert.qwen3_5_spec import preset
    from modeld.qualify.hf_weights import DequantSwap
    from modeld.qualify.logit_compare import compare_logits, merge

    t_start = time.perf_counter()
    specs = [tree_env(t) for t in own.trees.split(",") if t]
    trees = sorted({t for t, _ in specs})
    missing = [t for t in trees if not os.path.isdir(os.path.join(t, "src", "modeld"))]
    if missing:
        raise SystemExit(f"--trees: no src/modeld under {missing} (make them with tools/tree_at.sh COMMIT)")
    # only the code folders: a tree may be this checkout, whose root also holds the virtual environment
    roots = [os.path.join(BENCH, "..", "src"), BENCH] + [os.path.join(t, d) for t in trees for d in ("src", "bench")]
    st = types.SimpleNamespace(dev=torch.device(ca.device), shape=preset(ca.config, ca.layers))
    if st.dev.type != "cuda":
        C.cpu_shims()
    lengths = sorted({int(x) for x in ca.ttft.split(",") if x})
    st.capacity = max(max(lengths) + 256, 512, ca.long_prompt_len + ca.long_tokens + 64)   # the certification's
    fx = json.load(open(ca.fixture)) if os.path.exists(ca.fixture) else None
    if fx and (fx["checkpoint"]["config"], fx["checkpoint"]["layers"], fx["checkpoint"]["seed"]) == (
            ca.config, st.shape.layers, ca.seed):
        st.forced = [(c["prompt_ids"], c["tokens"]) for c in fx["cases"]]
    else:   # no applicable fixture (a dry run): seeded random cases stand in
        st.forced = C.random_cases(2, 8, ca.new_tokens, st.shape.bos_id, 7)
    st.flip = C.random_cases(ca.flip_cases, ca.flip_prompt_len, ca.flip_tokens, st.shape.bos_id, ca.flip_seed)
    doc: dict = {"bench": "bisect_engine_logits", "argv": argv, "profile": own.profile,
                 "versions": C.versions(st.dev), "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                 "cases": {"fixture": len(st.forced), "flip_set": len(st.flip)}, "trees": []}
    path = os.path.join(ca.out, "bisect_engine_logits.json")

    def save() -> None:
        doc["elapsed_s"] = time.perf_counter() - t_start
        with open(path + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(path + ".tmp", path)

    doc["hf_load"] = cert.hf_load(types.SimpleNamespace(args=ca), st)   # sets st.model
    cases = st.forced + st.flip
    t0 = time.perf_counter()
    if own.profile == "bf16":
        ref = [x.to("cpu") for x in C.hf_tf_logits(st.model, cases, st.dev)]
    else:   # rung 6's reference: HF on the dequantized weights, then HF's originals back for the engines' builds
        swap = DequantSwap(st.model, st.shape)
        swap.backup()
        swap.apply(own.profile)
        ref = [x.to("cpu") for x in C.hf_tf_logits(st.model, cases, st.dev)]
        doc["restore_checksum"] = swap.restore()
        swap.drop_backup()
    doc["reference"] = {"seconds": time.perf_counter() - t0, "what": "HF" if own.profile == "bf16" else
                        f"HF on dequantized {own.profile}", "digests": {
                            "fixture": C.logits_digest(ref[:len(st.forced)]),
                            "flip_set": C.logits_digest(ref[len(st.forced):])}}
    save()
    print(f"SUMMARY reference [{doc['reference']['seconds']:.1f} s] {doc['reference']}", flush=True)
    first = None
    for tree, env in specs:
        if time.perf_counter() - t_start > own.budget_s:
            doc["trees"].append({"tree": tree, "env": env, "skipped": f"budget {own.budget_s:.0f} s"})
            save()
            continue
        t0 = time.perf_counter()
        try:
            with C.held_env(env):
                logits, build_s, commit = tree_engine_logits(tree, st, own.profile, ca, roots)
        except Exception as exc:   # an old tree that cannot build is a row, not the end of the bisection
            doc["trees"].append({"tree": tree, "env": env, "error": f"{type(exc).__name__}: {exc}"})
            save()
            print(f"TREE {tree} {env} FAILED: {type(exc).__name__}: {exc}", flush=True)
            continue
        rows = [compare_logits(e, r, ca.top_k, ca.tie) for e, r in zip(logits, ref)]
        m = merge(rows)
        first = first or logits
        row = {"tree": tree, "env": env, "commit": commit, "build_s": build_s, "seconds": time.perf_counter() - t0,
               "digests": {"fixture": C.logits_digest(logits[:len(st.forced)]),
                           "flip_set": C.logits_digest(logits[len(st.forced):])},
               "other_flips": m["other_disagreements"], "positions": m["positions"],
               "max_abs_full": m["max_abs_full"], "mean_abs_full": m["mean_abs_full"],
               "flips_at": [dict(d, case=i) for i, r in enumerate(rows) for d in r["disagreements"]
                            if not d["near_tie"]],
               "vs_first_max_abs": max(float((a - b).abs().max()) for a, b in zip(logits, first))}
        doc["trees"].append(row)
        save()
        print(f"TREE {commit[:9]} {env or ''} other flips {row['other_flips']}/{row['positions']} max|Δ| "
              f"{row['max_abs_full']:.4f} mean {row['mean_abs_full']:.4f} digests {row['digests']} vs first "
              f"{row['vs_first_max_abs']:.4g} [{row['seconds']:.0f} s, t={time.perf_counter() - t_start:.0f} s]",
              flush=True)
        del logits
    return 0


if __name__ == "__main__":
    sys.exit(main())
