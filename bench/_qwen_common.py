"""Measurement helpers of bench/cert_qwen3_5_27b.py (HF control + qwen3_5 engine in one process).

The timing loops of the engine (`decode_speed`, `ttft`, roofline constant) and of the HF control
(`greedy`, `prompts`, `weight_fingerprint`) are imported from bench/engine_qwen3_5.py and
bench/hf_control_27b.py unchanged; what is new here is teacher-forced logits at every step for
both sides, HF's TTFT, freeing an engine, and a torch.profiler kernel table. Every function
mutates only the engine / model state it is handed (slot 0, HF's cache is never kept).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import platform
import sys
import time
import traceback

T_START = time.perf_counter()  # the budget clock starts when the bench imports this module

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import engine_qwen3_5 as engine_bench  # noqa: E402  (bench/engine_qwen3_5.py)
import hf_control_27b as hf_bench  # noqa: E402, F401  (bench/hf_control_27b.py; used as C.hf_bench)

COPY_BW = engine_bench.COPY_BW
FIXTURE = engine_bench.FIXTURE


def cpu_shims() -> None:
    """Dry run on CPU: device syncs become no-ops (the benches' timing loops call them)."""
    import torch

    torch.cuda.synchronize = lambda *a, **k: None
    engine_bench.sync = lambda: None


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def versions(device) -> dict:
    import numpy as np
    import torch
    import transformers
    import triton

    out = {"torch": torch.__version__, "triton": triton.__version__, "transformers": transformers.__version__,
           "numpy": np.__version__, "python": platform.python_version(), "cuda": torch.version.cuda}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out.update({"gpu": props.name, "gpu_memory_bytes": int(props.total_memory),
                    "sm_count": props.multi_processor_count, "capability": f"{props.major}.{props.minor}"})
        try:
            import pynvml
            pynvml.nvmlInit()
            out["driver"] = pynvml.nvmlSystemGetDriverVersion()
        except Exception as exc:  # nvml is optional: the record says why it is missing
            out["driver"] = f"unknown ({type(exc).__name__})"
    else:
        out["gpu"] = "cpu (dry run)"
    return out


@contextlib.contextmanager
def held_env(env: dict[str, str]):
    """`env` set in os.environ for the block, every variable's earlier value (or absence) restored afterwards."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def engine_tf_logits(engine, cases: list[tuple[list[int], list[int]]]):
    """Teacher-forced engine logits per case: prefill the prompt (its last position), then one
    decode step per forced token but the last -> [len(tokens), V] fp32 per case (clones).
    Uses slot 0 (reset first); an engine with more slots runs the same case in every slot (each decode
    step then has B identical tokens, so the batched kernels are exercised) and returns slot 0's rows."""
    import torch

    out = []
    slots = engine.options.slots
    for prompt, tokens in cases:
        for s in range(slots):
            engine.reset_slot(s)
            logits = engine.prefill(s, prompt)  # a view of the engine's logits: clone slot 0's before anything runs
            if s == 0:
                first = logits.clone()
        rows = [first]
        for tok in tokens[:-1]:
            rows.append(engine.decode([tok] * slots)[0].clone())
        out.append(torch.stack(rows))
    return out


def random_cases(n: int, prompt_len: int, tokens: int, vocab_hi: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """n (prompt, forced tokens) pairs of seeded random ids below vocab_hi: teacher forcing needs no greedy
    run (every position compares two sets of logits for the same context)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [(rng.integers(0, vocab_hi, prompt_len).tolist(), rng.integers(0, vocab_hi, tokens).tolist())
            for _ in range(n)]


def other_flips(eng_logits, ref_logits, top_k: int, tie: float, device=None) -> dict:
    """compare_logits per case (the near-tie rule, unchanged) merged, without the per-case rows; keeps every
    disagreement that is not a near-tie ("other"), with its case index. `device`: where to compare (default:
    the reference's)."""
    from modeld.qualify.logit_compare import compare_logits, merge

    rows = [compare_logits(e.to(device or r.device), r.to(device or r.device), top_k, tie)
            for e, r in zip(eng_logits, ref_logits)]
    m = merge(rows)
    m.pop("cases")
    m["other_flips"] = [dict(f, case=i) for i, r in enumerate(rows) for f in r["disagreements"] if not f["near_tie"]]
    return m


def hf_tf_logits(model, cases: list[tuple[list[int], list[int]]], device):
    """Reference logits: one HF forward, no cache, over prompt + tokens[:-1]; the logits at the
    last prompt position and every forced position -> [len(tokens), V] fp32 per case."""
    import torch

    out = []
    with torch.no_grad():
        for prompt, tokens in cases:
            ids = torch.tensor([list(prompt) + list(tokens[:-1])], device=device)
            logits = model(input_ids=ids, use_cache=False).logits[0]            # [P+T-1, V] bf16
            out.append(logits[len(prompt) - 1:].float())
    return out


def logits_digest(tensors) -> str | None:
    """sha256 (first 16 hex digits) of a list of logits tensors as fp32 bytes, in order; None for no tensors. Two
    records with the same digest saw the same numbers, so a moved gate can be traced to the engine or to the control
    (KNOWLEDGE/findings/fp8-rung6-flips-rose-between-s28-and-s31.md)."""
    import hashlib

    import torch

    if not tensors:
        return None
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def ttft_ids(n: int, vocab: int, offset: int = 0) -> list[int]:
    """The prompt bench/engine_qwen3_5.ttft uses for length n (so HF and engine see the same); `offset` shifts every
    id (another turn of the same length)."""
    return [(7 * i + 3 + offset) % (vocab - 32) + 10 for i in range(n)]


def hf_ttft(model, n: int, vocab: int, device, runs: int = 1) -> dict:
    """HF prefill of n tokens with its cache + first argmax, synchronised; min over `runs`."""
    import torch

    ids = torch.tensor([ttft_ids(n, vocab)], device=device)
    samples = []
    with torch.no_grad():
        for _ in range(runs):
            sync()
            t0 = time.perf_counter()
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            int(torch.argmax(out.logits[0, -1]))
            samples.append(time.perf_counter() - t0)
            del out
    return {"prompt_tokens": n, "ttft_s_min": min(samples), "ttft_s_runs": samples,
            "prefill_tok_per_s": n / min(samples)}


def build_engine(cfg, source, device, capacity: int, slots: int = 1, suffix_bucket: int | None = None):
    """Qwen35Engine, `slots` slots (one by default), EngineOptions' prefill schedule and 2 checkpoints (and
    `suffix_bucket`, EngineOptions' padded suffix step; 0 = off; None = what the serving cell (one slot) takes on
    this device, and off for more slots, whose engines would capture one step per slot); Triton kernels + CUDA graph
    on CUDA, the reference kernels (eager) elsewhere."""
    from modeld.execution.bindings import reference_kernels, triton_kernels
    from modeld.models.qwen3_5.engine import EngineOptions, Qwen35Engine, default_suffix_bucket

    if suffix_bucket is None:
        suffix_bucket = default_suffix_bucket(device, capacity) if slots == 1 else 0

    ks = triton_kernels() if device.type == "cuda" else reference_kernels()
    opts = EngineOptions(slots=slots, capacity=capacity, checkpoints=2, suffix_bucket=suffix_bucket)
    return Qwen35Engine(cfg, source, device, ks, opts)


def hf_engine_state(args, R):
    """The state of a bench that builds engines from HF's parameters (bench/engine_ab.py,
    bench/engine_whatif.py): args, device (CPU shims off CUDA), synth shape, qwen3_5 config, capacity 512.
    Records versions / config / layers / seed in R.doc. HF's model is loaded by cert.hf_load(R, st)."""
    import types

    import torch

    from modeld.convert.qwen3_5_spec import hf_config, preset
    from modeld.models.qwen3_5.config import Qwen35Config

    st = types.SimpleNamespace(args=args, dev=torch.device(args.device), shape=preset(args.config, args.layers))
    if st.dev.type != "cuda":
        cpu_shims()
    st.cfg = Qwen35Config.from_hf(hf_config(st.shape))
    st.capacity = 512
    R.doc.update({"versions": versions(st.dev), "config": args.config, "layers": st.shape.layers,
                  "seed": args.seed})
    return st


def engine_from_hf(st, profile: str, seed: int, workers: int, slots: int = 1, suffix_bucket: int | None = None,
                   lm_head: str = "bf16"):
    """(engine, build seconds): a Qwen35Engine for `profile` built from the weights HF's model holds
    (`st.model`, `st.shape`; quantized on the device with the converter's functions for fp8 / int4, the lm_head
    too unless `lm_head` is "bf16"), with `st.cfg`, `st.dev`, `st.capacity`; the quantizer's host copies are
    dropped after the build."""
    from modeld.qualify.hf_weights import HFParamSource, QuantizedSource

    src = HFParamSource(st.model, st.shape, engine_bench.SynthSource(st.shape, seed, workers))
    if profile != "bf16":
        src = QuantizedSource(src, profile, lm_head=lm_head)
    t0 = time.perf_counter()
    eng = build_engine(st.cfg, src, st.dev, st.capacity, slots, suffix_bucket)
    sync()
    build_s = time.perf_counter() - t0
    if profile != "bf16":
        src.clear()
    return eng, build_s


def add_checkpoint_args(ap, config_help: str = "synth preset (default 27b)") -> None:
    """--out, --config, --layers, --seed, --device, --workers: the synthetic checkpoint and where it runs."""
    ap.add_argument("--out", required=True, help="output folder ($OUT)")
    ap.add_argument("--config", default="27b", help=config_help)
    ap.add_argument("--layers", type=int, default=None, help="override the preset depth")
    ap.add_argument("--seed", type=int, default=0, help="synth seed (default 0)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (dry run, reference kernels)")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))


def add_compare_args(ap) -> None:
    """--tie, --top-k: the near-tie rule of `modeld.qualify.logit_compare.compare_logits`."""
    ap.add_argument("--tie", type=float, default=0.125, help="near-tie margin (2 bf16 ulps at |logit| 8..16)")
    ap.add_argument("--top-k", type=int, default=10, help="HF top-k for the top-k logit error (default 10)")


def roofline(engine, context: int = 128) -> float:
    """Decode floor in seconds, as bench/engine_qwen3_5.py computes it: weights read once (less
    the gathered embedding) + GDN state read and written + KV at `context`, at COPY_BW."""
    weight_read = engine.weights.nbytes - engine.weights["embed"].numel() * 2
    gdn_state = engine.spec.fixed_bytes_per_slot * 2
    return (weight_read + gdn_state + engine.spec.bytes_per_token * context) / COPY_BW


def release() -> None:
    """Collect garbage and return cached device memory (after the caller dropped its references)."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def kernel_table(fn, device, top: int = 15, repeat: int = 1, total_wanted: bool = False) -> list[dict] | dict:
    """Run fn() `repeat` times under torch.profiler; the `top` entries by self device time (CUDA)
    or self CPU time (dry run): name, calls, ms per run, share of the summed time. total_wanted=True returns
    {"top": those entries, "summed_ms_per_run": the sum over every entry, "launches_per_run": their calls}."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync()
    with profile(activities=acts) as prof:
        for _ in range(repeat):
            fn()
        sync()
    avgs = prof.key_averages()
    key = "self_cpu_time_total"
    if device.type == "cuda":  # torch >= 2.4 says "device"; older releases only "cuda"
        key = next((k for k in ("self_device_time_total", "self_cuda_time_total")
                    if any(getattr(e, k, 0) > 0 for e in avgs)), "self_device_time_total")
    events = [e for e in avgs if getattr(e, key, 0) > 0]
    total = sum(getattr(e, key) for e in events) or 1.0
    events.sort(key=lambda e: getattr(e, key), reverse=True)
    rows = [{"name": e.key[:160], "calls": int(e.count), "ms_per_run": getattr(e, key) / 1e3 / repeat,
             "share": getattr(e, key) / total} for e in events[:top]]
    if not total_wanted:
        return rows
    return {"top": rows, "summed_ms_per_run": total / 1e3 / repeat,
            "launches_per_run": sum(int(e.count) for e in events) / repeat}


class Run:
    """The result document (saved after every stage, atomically), the budget clock (from process
    start, `args.budget_s`) and per-stage bookkeeping: `stage(name, fn, *a)` runs fn, stores its
    dict under stages[name] with its wall time and peak GPU memory, records an exception's
    traceback under errors[name] instead of raising, and prints one SUMMARY line."""

    def __init__(self, args, argv: list[str], bench: str, extra: dict) -> None:
        self.args, self.path = args, os.path.join(args.out, f"{bench}.json")
        self.doc: dict = {"bench": bench, "argv": argv, "budget_s": args.budget_s,
                          "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                          # the modeld switches in force (kernel choices, PDL, ...): part of what was measured
                          "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("MODELD_")},
                          **extra, "stages": {}, "skipped": {}, "errors": {}, "gates": {}}

    def elapsed(self) -> float:
        return time.perf_counter() - T_START

    def left(self) -> float:
        return self.args.budget_s - self.elapsed()

    def save(self) -> None:
        self.doc["elapsed_s"] = self.elapsed()
        with open(self.path + ".tmp", "w") as f:
            json.dump(self.doc, f, indent=1)
        os.replace(self.path + ".tmp", self.path)

    def stage(self, name: str, fn, *a):
        """Run one stage: its dict goes to stages[name]; an exception is recorded, not raised."""
        import torch

        t0 = time.perf_counter()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        try:
            res = fn(*a)
        except Exception:
            self.doc["errors"][name] = traceback.format_exc()
            print(f"STAGE {name} FAILED after {time.perf_counter() - t0:.1f} s:\n{self.doc['errors'][name]}", flush=True)
            self.save()
            return None
        res["stage_s"] = time.perf_counter() - t0
        res["peak_gpu_mem"] = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
        self.doc["stages"][name] = res
        self.save()
        print(f"SUMMARY {name} [{res['stage_s']:.1f} s, t={self.elapsed():.0f} s] {res.get('summary', '')}", flush=True)
        return res

    def skip(self, name: str, why: str) -> None:
        self.doc["skipped"][name] = why
        self.save()
        print(f"SKIP {name}: {why}", flush=True)


def kernel_profile(engine, device, long_n: int) -> dict:
    """Kernel tables of one engine: decode as graph replays (5) and as one eager step at a
    128-token context, and one prefill of `long_n` tokens (after an unprofiled warm-up).
    Mutates slot 0 (reset first)."""
    engine.reset_slot(0)
    engine.prefill(0, ttft_ids(128, engine.config.vocab))
    engine.decode([11])
    res = {"decode_graph_replay": kernel_table(engine.graph, device, repeat=5),
           "decode_eager_step": kernel_table(engine._decode_step, device, repeat=1)}

    def prefill():
        engine.reset_slot(0)
        engine.prefill(0, ttft_ids(long_n, engine.config.vocab))

    prefill()  # warm (compiles any shape not seen yet)
    res[f"prefill_{long_n}"] = kernel_table(prefill, device, repeat=1)
    return res
