"""Which kernel call makes two engine builds differ: every op call of a short prefill + decode, traced per side.

bench/bisect_engine_logits.py finds the commit or switch that moved an engine's logits (session 33: round_to's GPU
convert, `MODELD_ROUND_BITS=0`, moved the 27B fp8 engine's certification logits; every probed kernel family gave
equal bits: KNOWLEDGE/findings/round-to-convert-moved-the-engine-logits-s33.md). This bench finds the kernel: per
side (a tree and switches, the bisect's 'TREE|VAR=VALUE+…' specs, each side's modeld imported afresh) it builds the
engine EAGER (no CUDA graph; the padded suffix step as configured) on `modeld synth` weights (--layers deep, fp8 /
int4 quantized on the device as the converter does), wraps every function of its KernelSet and records, per call:
the op, the digests of its tensor arguments before and after (weights over --max-arg-elements are not hashed) and
its outputs (kept on the host). Then, against the first side, the first call whose inputs agree and whose outputs or
in-place arguments differ is the culprit: its op, call number, shapes, max |Δ|, differing element count and the
first differing values (bits included).

    PYTHONUNBUFFERED=1 PYTHONPATH=src:. python3 bench/trace_engine_ops.py --out $OUT/trace --profile fp8 \\
        --sides ".|MODELD_ROUND_BITS=1,.|MODELD_ROUND_BITS=0"
    dry run (CPU, reference kernels): OMP_NUM_THREADS=1 PYTHONPATH=src:. python bench/trace_engine_ops.py \\
        --out /tmp/tr --sides ".,." --device cpu --config tiny --workers 2
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import sys
import time
import types

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)

import _qwen_common as C  # noqa: E402
from bisect_engine_logits import purge_trees, tree_env  # noqa: E402

OPS = ("rmsnorm", "gated_rmsnorm", "rope", "conv1d", "gdn", "embedding", "sampling", "linear", "attention", "logits")


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder ($OUT)")
    ap.add_argument("--sides", required=True, help="comma-separated 'TREE|VAR=VALUE+…' specs ('.' = this tree); "
                    "every side is compared with the first")
    ap.add_argument("--profile", default="fp8", choices=("bf16", "fp8", "int4"))
    ap.add_argument("--config", default="27b")
    ap.add_argument("--layers", type=int, default=8, help="model depth (default 8: two GDN x3 + attention groups)")
    ap.add_argument("--seed", type=int, default=0, help="synth seed")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--prompt-len", type=int, default=24, help="prompt tokens (the certification's flip set: 24)")
    ap.add_argument("--decode-steps", type=int, default=4)
    ap.add_argument("--prompt-seed", type=int, default=20261130)
    ap.add_argument("--suffix-bucket", type=int, default=None,
                    help="EngineOptions.suffix_bucket (default: what the certification's engine takes on the device)")
    ap.add_argument("--max-arg-elements", type=int, default=1 << 22,
                    help="tensor arguments above this many elements (weights) are not hashed (default 4M)")
    return ap.parse_args(argv)


def digest(t) -> str:
    import torch

    x = t.detach()
    if x.dtype in (torch.bfloat16, torch.float16):
        x = x.view(torch.int16)
    elif x.dtype.itemsize == 1:
        x = x.view(torch.uint8)
    return hashlib.sha256(x.contiguous().cpu().numpy().tobytes()).hexdigest()[:16] + f":{tuple(t.shape)}"


def tensors(obj, prefix: str = "", depth: int = 4):
    """(label, tensor) pairs inside args / outputs: tensors, tuples, lists, dicts, dataclass-like objects (at most
    `depth` levels down: an argument object may point back into the engine)."""
    import torch

    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif depth <= 0:
        return
    elif isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            yield from tensors(v, f"{prefix}[{i}]", depth - 1)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from tensors(v, f"{prefix}.{k}", depth - 1)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (types.ModuleType, type)) and not callable(obj):
        for k, v in vars(obj).items():
            yield from tensors(v, f"{prefix}.{k}", depth - 1)


class Recorder:
    def __init__(self, max_arg: int) -> None:
        self.calls: list[dict] = []
        self.max_arg = max_arg

    def args_digest(self, a, k, before: bool = False) -> dict:
        """Digests of the tensor arguments; before the call an `out=` buffer's contents are not an input (an
        empty-allocated buffer holds whatever the allocator left)."""
        return {lab: (digest(t) if t.numel() <= self.max_arg else f"unhashed:{tuple(t.shape)}")
                for lab, t in tensors((a, k)) if not (before and lab.startswith("[1].out"))}

    def wrap(self, op: str, name: str, fn):
        def traced(*a, **k):
            pre = self.args_digest(a, k, before=True)
            out = fn(*a, **k)
            outs = {lab: t.detach().to("cpu", copy=True) for lab, t in tensors(out, "out")}
            self.calls.append({"op": f"{op}.{name}", "pre": pre, "post": self.args_digest(a, k),
                               "out": {lab: digest(t) for lab, t in outs.items()}, "tensors": outs})
            return out
        return traced


class TracedOp:
    """A kernel module whose functions record their calls (constants and classes pass through)."""

    def __init__(self, op: str, module, rec: Recorder) -> None:
        self._op, self._module, self._rec = op, module, rec

    def __getattr__(self, name: str):
        v = getattr(self._module, name)
        if callable(v) and not isinstance(v, type) and not name.startswith("_"):
            return self._rec.wrap(self._op, name, v)
        return v


def run_side(spec: str, a, roots: list[str]) -> tuple[list[dict], dict]:
    """One side's traced calls (prefill of the prompt, then the decode steps) and its final logits digest."""
    import torch

    tree, env = tree_env(spec)
    with C.held_env(env):
        purge_trees(roots)
        tree = os.path.realpath(tree)
        sys.path[:0] = [os.path.join(tree, "bench"), os.path.join(tree, "src")]
        eb = importlib.import_module("engine_qwen3_5")
        spec_mod = importlib.import_module("modeld.convert.qwen3_5_spec")
        config = importlib.import_module("modeld.models.qwen3_5.config")
        bindings = importlib.import_module("modeld.execution.bindings")
        engine_mod = importlib.import_module("modeld.models.qwen3_5.engine")
        hf_weights = importlib.import_module("modeld.qualify.hf_weights")
        dev = torch.device(a.device)
        shape = spec_mod.preset(a.config, a.layers)
        cfg = config.Qwen35Config.from_hf(spec_mod.hf_config(shape))
        src = eb.SynthSource(shape, a.seed, a.workers)
        if a.profile != "bf16":
            src = hf_weights.QuantizedSource(src, a.profile, device=dev)
        ks = bindings.default_kernels(dev)
        rec = Recorder(a.max_arg_elements)
        traced = bindings.KernelSet(ks.name, *(TracedOp(op, getattr(ks, op), rec) for op in OPS))
        capacity = 512
        bucket = a.suffix_bucket if a.suffix_bucket is not None else engine_mod.default_suffix_bucket(dev, capacity)
        opts = engine_mod.EngineOptions(slots=1, capacity=capacity, checkpoints=2, use_graph=False,
                                        suffix_bucket=bucket)
        eng = engine_mod.Qwen35Engine(cfg, src, dev, traced, opts)
        rec.calls.clear()   # the build's own calls (warm-ups) are not the comparison
        import numpy as np

        rng = np.random.default_rng(a.prompt_seed)
        prompt = rng.integers(0, shape.bos_id, a.prompt_len).tolist()
        forced = rng.integers(0, shape.bos_id, a.decode_steps).tolist()
        eng.reset_slot(0)
        logits = [eng.prefill(0, prompt).clone()]
        for tok in forced:
            logits.append(eng.decode([tok])[0].clone())
        summary = {"tree": tree, "env": env, "calls": len(rec.calls), "suffix_bucket": bucket,
                   "logits_digest": hashlib.sha256(b"".join(x.float().cpu().numpy().tobytes()
                                                            for x in logits)).hexdigest()[:16]}
        del eng
        return rec.calls, summary


def first_difference(base: list[dict], other: list[dict]) -> dict | None:
    """The first call whose inputs agree and whose outputs / in-place arguments differ (or where the two call
    sequences part), with the differing tensors described; None when every call agrees."""
    import torch

    for i, (x, y) in enumerate(zip(base, other)):
        if x["op"] != y["op"]:
            return {"call": i, "kind": "sequence", "base_op": x["op"], "other_op": y["op"]}
        if x["pre"] != y["pre"]:
            bad = sorted(k for k in x["pre"] if x["pre"][k] != y["pre"].get(k))
            return {"call": i, "kind": "inputs differ (an earlier side effect went unrecorded)", "op": x["op"],
                    "arguments": bad}
        if x["out"] == y["out"] and x["post"] == y["post"]:
            continue
        nth = sum(1 for c in base[:i] if c["op"] == x["op"])
        res = {"call": i, "kind": "kernel", "op": x["op"], "nth_call_of_op": nth,
               "in_place_differs": sorted(k for k in x["post"] if x["post"][k] != y["post"].get(k)), "outputs": {}}
        for lab, t in x["tensors"].items():
            u = y["tensors"].get(lab)
            if u is None or torch.equal(t, u):
                continue
            d = (t.float() - u.float()).abs()
            idx = torch.nonzero(d.flatten() > 0).flatten()[:8]
            flat_t, flat_u = t.flatten(), u.flatten()
            res["outputs"][lab] = {
                "shape": list(t.shape), "dtype": str(t.dtype), "max_abs": float(d.max()),
                "differing": int((d > 0).sum()), "of": t.numel(),
                "first": [{"index": int(j), "base": float(flat_t[j]), "other": float(flat_u[j])} for j in idx]}
        return res
    if len(base) != len(other):
        return {"call": min(len(base), len(other)), "kind": "sequence", "lengths": [len(base), len(other)]}
    return None


def main(argv=None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    os.makedirs(a.out, exist_ok=True)
    specs = [s for s in a.sides.split(",") if s]
    if len(specs) < 2:
        raise SystemExit("--sides: at least two specs (every side is compared with the first)")
    trees = sorted({tree_env(s)[0] for s in specs})
    missing = [t for t in trees if not os.path.isdir(os.path.join(t, "src", "modeld"))]
    if missing:
        raise SystemExit(f"--sides: no src/modeld under {missing}")
    roots = [os.path.join(BENCH, "..", "src"), BENCH] + [os.path.join(t, d) for t in trees for d in ("src", "bench")]
    import torch

    if a.device == "cpu":
        torch.set_num_threads(max(1, a.workers))
    doc: dict = {"bench": "trace_engine_ops", "argv": sys.argv[1:] if argv is None else argv, "sides": [],
                 "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path = os.path.join(a.out, "trace_engine_ops.json")
    base = None
    for spec in specs:
        t0 = time.perf_counter()
        calls, summary = run_side(spec, a, roots)
        summary["seconds"] = time.perf_counter() - t0
        if base is None:
            base = calls
        else:
            summary["first_difference"] = first_difference(base, calls)
            summary["differing_calls"] = sum(1 for x, y in zip(base, calls) if x["out"] != y["out"]
                                             or x["post"] != y["post"])
            del calls
        doc["sides"].append(summary)
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
        fd = summary.get("first_difference")
        print(f"SIDE {spec}: {summary['calls']} calls, logits {summary['logits_digest']}, differing calls "
              f"{summary.get('differing_calls', '-')}, first difference "
              f"{json.dumps(fd)[:1500] if fd else 'none'} [{summary['seconds']:.0f} s]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
