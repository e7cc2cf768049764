"""The qwen3_5 engine on the H200 with Triton kernels: greedy parity vs the HF fixture, then speed.

Loads the synthetic checkpoint (`modeld synth` values streamed straight into the engine's weight
arena, no files: `SynthSource`) into `Qwen35Engine` bound to the Triton kernels, with the decode
step captured as a CUDA graph. Then:

1. parity: for every case of the HF greedy fixture (tests/fixtures/hf_control_qwen3_5_27b_seed0.json
   for the 27B L64 preset; made by bench/hf_control_27b.py: HF bf16 on this GPU), prefill the
   prompt and feed HF's tokens one decode step at a time (teacher forcing); per step: does the
   engine's argmax equal HF's token, and the max |engine - HF| over HF's top-k logits. A
   disagreement is acceptable only at a near-tie: HF's logit of the engine's pick is within --tie
   (2 bf16 ulps) + that step's logit error of HF's top (KNOWLEDGE/pitfalls/greedy-parity-breaks-at-bf16-logit-ties.md).
   With --reference the same engine code also runs on the PyTorch reference kernels (on the GPU),
   which separates kernel error from schedule error.
2. speed: decode (graph replay + argmax + host read, i.e. what a serving loop pays per token),
   p50/p90 over --steps steps at a 128-token context; TTFT (prefill + first argmax, synchronised)
   for each --ttft length; each beside its roofline (weights + GDN state bytes per token at the
   measured 4.27 TB/s copy bandwidth) and the HF baseline of the fixture's speed file if given.

Writes $OUT/engine_qwen3_5.json (every number + versions) and prints a summary. Exits 0 even when
parity fails (the JSON says so); exits 1 only when the engine cannot load or run at all.

    PYTHONUNBUFFERED=1 PYTHONPATH=src:. python3 bench/engine_qwen3_5.py --out $OUT
    (options: --config 27b --layers 64 --steps 128 --ttft 128,1024,8192 --reference)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

import numpy as np

COPY_BW = 4.27e12  # measured device-to-device bytes/s (TARGETS.md)
FIXTURE = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "hf_control_qwen3_5_27b_seed0.json")


class SynthSource:
    """TensorSource over `modeld synth` values (seed, preset): tensors are generated on demand,
    chunks in parallel, bit-identical to the files `modeld synth` writes."""

    def __init__(self, shape, seed: int, workers: int) -> None:
        from modeld.convert.qwen3_5_spec import checkpoint_inventory

        self.specs = {s.name: s for s in checkpoint_inventory(shape, include_mtp=False)}
        self.seed, self.pool = seed, ThreadPoolExecutor(workers)

    def names(self):
        return sorted(self.specs)

    def meta(self, name):
        import torch

        s = self.specs[name]
        return (torch.float32 if s.dtype == "F32" else torch.bfloat16), tuple(s.shape)

    def tensor(self, name):
        import torch

        from modeld.convert.synth import CHUNK_ELEMS, chunk_values

        s = self.specs[name]
        n = math.prod(s.shape)
        dtype = torch.float32 if s.dtype == "F32" else torch.bfloat16
        out = torch.empty(n, dtype=dtype)

        def fill(c):
            count = min(CHUNK_ELEMS, n - c * CHUNK_ELEMS)
            out[c * CHUNK_ELEMS: c * CHUNK_ELEMS + count] = torch.from_numpy(chunk_values(s, self.seed, c, count)).to(dtype)

        list(self.pool.map(fill, range(max(1, math.ceil(n / CHUNK_ELEMS)))))
        return out.view(s.shape)


def sync():
    import torch

    torch.cuda.synchronize()


def parity(engine, fixture: dict, tie: float) -> dict:
    import torch

    rows, worst = [], 0.0
    ok = True
    for case in fixture["cases"]:
        engine.reset_slot(0)
        logits = engine.prefill(0, case["prompt_ids"])
        agree, ties, errs = 0, 0, []
        for j, (tok, step) in enumerate(zip(case["tokens"], case["steps"])):
            ids = torch.tensor(step["topk_ids"], device=logits.device)
            ref = torch.tensor(step["topk_logits"])
            errs.append(float((logits[ids].float().cpu() - ref).abs().max()))
            pick = int(torch.argmax(logits))
            if pick == tok:
                agree += 1
            elif pick in step["topk_ids"] and (
                    step["topk_logits"][0] - step["topk_logits"][step["topk_ids"].index(pick)] <= tie + errs[-1]):
                ties += 1  # HF's own logit of our pick is within rounding noise of HF's top
            else:
                ok = False
            if j + 1 < len(case["tokens"]):
                logits = engine.decode([tok])[0]
        worst = max(worst, max(errs))
        rows.append({"prompt_tokens": len(case["prompt_ids"]), "steps": len(case["tokens"]), "agree": agree,
                     "near_tie_disagreements": ties, "max_topk_logit_err": max(errs),
                     "first_step_err": errs[0]})
    return {"pass": ok, "max_topk_logit_err": worst, "cases": rows}


def decode_speed(engine, steps: int, context: int, pick=None) -> dict:
    """Decode steps at a `context`-token prompt in every slot (each step: one token per slot, slot 0's token fed
    to all). The token is slot 0's argmax, or with `pick` (logits [slots, V] -> ids [slots] on the device, e.g. a
    configured `SlotSampler.pick`) its pick, so the timed step includes that sampler. tok_per_s_p50 counts every
    slot's token: slots / p50 step time."""
    import torch

    def choose(logits) -> int:  # int() reads the id back: the step's host sync
        return int(torch.argmax(logits[0])) if pick is None else int(pick(logits)[0])

    slots = engine.options.slots
    for s in range(slots):
        engine.reset_slot(s)
        engine.prefill(s, [(5 * i + 1) % (engine.config.vocab - 32) for i in range(context)])
    tok = 11
    for _ in range(5):  # warm
        tok = choose(engine.decode([tok] * slots))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        tok = choose(engine.decode([tok] * slots))
        times.append(time.perf_counter() - t0)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):  # graph replays back to back, one sync at the end (device time per step)
        engine.graph()
    sync()
    replay = (time.perf_counter() - t0) / steps
    a = np.array(times)
    return {"context": context, "steps": steps, "slots": slots, "p50_s": float(np.median(a)),
            "p90_s": float(np.percentile(a, 90)), "tok_per_s_p50": float(slots / np.median(a)), "replay_only_s": replay}


def ttft(engine, lengths: list[int]) -> list[dict]:
    """TTFT per prompt length: prefill + first argmax, best of 3 (reset between runs)."""
    import torch

    out = []
    for n in lengths:
        if n + 1 > engine.options.capacity:
            continue
        ids = [(7 * i + 3) % (engine.config.vocab - 32) + 10 for i in range(n)]
        samples = []
        for _ in range(3):
            engine.reset_slot(0)
            sync()
            t0 = time.perf_counter()
            int(torch.argmax(engine.prefill(0, ids)))
            samples.append(time.perf_counter() - t0)
        out.append({"prompt_tokens": n, "ttft_s_min": min(samples), "ttft_s_runs": samples,
                    "prefill_tok_per_s": n / min(samples)})
    return out


def ttft_by_chunk(eng, n: int, chunks: str) -> list[dict]:
    """TTFT at n tokens with prefill_chunk = c for each c (the cell's schedule knob: a longer chunk gives the
    GEMMs more rows per weight pass; checkpoint_every stays, pieces checkpoint inside themselves). The engine reads
    its options per prefill; they are restored afterwards."""
    import dataclasses

    saved, out = eng.options, []
    try:
        for c in (int(x) for x in chunks.split(",") if x):
            eng.options = dataclasses.replace(saved, prefill_chunk=c)
            r = ttft(eng, [n])
            if r:
                out.append({"prefill_chunk": c, **r[0]})
    finally:
        eng.options = saved
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder ($OUT)")
    ap.add_argument("--config", default="27b", help="synth preset (default 27b)")
    ap.add_argument("--layers", type=int, default=None, help="override the preset depth (parity needs the fixture's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fixture", default=FIXTURE, help="HF greedy fixture (default: the 27B L64 seed-0 one)")
    ap.add_argument("--hf-speed", default=None, help="hf_control_27b_speed.json for the baseline column")
    ap.add_argument("--tie", type=float, default=0.125, help="near-tie margin (default 2 bf16 ulps at |logit| 8..16)")
    ap.add_argument("--steps", type=int, default=128, help="decode steps timed")
    ap.add_argument("--ttft", default="128,1024,8192", help="prompt lengths for TTFT")
    ap.add_argument("--capacity", type=int, default=8448, help="KV positions (default 8448)")
    ap.add_argument("--reference", action="store_true", help="also run parity on reference kernels (GPU)")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--profile", default="bf16", choices=("bf16", "fp8", "int4"),
                    help="weight profile: bf16 (default; parity vs the fixture) or fp8/int4 (quantized on the fly)")
    ap.add_argument("--lm-head", default="bf16", choices=("bf16", "fp8", "int4"),
                    help="lm_head as `modeld convert --lm-head`: bf16 (default) or the --profile's own format")
    ap.add_argument("--device", default="cuda", help="cuda (default); cpu = dry run on reference kernels (tiny presets)")
    args = ap.parse_args(argv)

    import torch

    from modeld.convert.qwen3_5_spec import hf_config, preset
    from modeld.convert.recipe import check_lm_head
    from modeld.execution.bindings import reference_kernels, triton_kernels
    from modeld.models.qwen3_5.config import Qwen35Config
    from modeld.models.qwen3_5.engine import EngineOptions, Qwen35Engine

    os.makedirs(args.out, exist_ok=True)
    result: dict = {"bench": "engine_qwen3_5", "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "argv": sys.argv[1:]}
    dev = torch.device(args.device)
    import triton

    gpu = torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu (dry run)"
    result["versions"] = {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
                          "gpu": gpu, "cuda": torch.version.cuda}
    if dev.type != "cuda":  # dry run: reference kernels, no device syncs
        global sync
        sync = lambda: None  # noqa: E731
        torch.cuda.memory_allocated = torch.cuda.max_memory_allocated = lambda *a, **k: 0
        torch.cuda.empty_cache = lambda: None
    shape = preset(args.config, args.layers)
    cfg = Qwen35Config.from_hf(hf_config(shape))
    src = SynthSource(shape, args.seed, args.workers)
    check_lm_head(args.profile, args.lm_head)
    if args.profile != "bf16":  # the bytes of `modeld convert --profile P [--lm-head P]`, quantized on the GPU
        from modeld.qualify.hf_weights import QuantizedSource

        src = QuantizedSource(src, args.profile, device="cuda" if dev.type == "cuda" else None,
                              lm_head=args.lm_head)
    opts = EngineOptions(slots=1, capacity=args.capacity, checkpoints=2)  # the cell's prefill schedule

    def save():
        with open(os.path.join(args.out, "engine_qwen3_5.json"), "w") as f:
            json.dump(result, f, indent=1)

    try:
        t0 = time.perf_counter()
        eng = Qwen35Engine(cfg, src, dev, triton_kernels() if dev.type == "cuda" else reference_kernels(), opts)
        sync()
        result["load"] = {"seconds": time.perf_counter() - t0, "profile": eng.weights.profile_summary(),
                          "weights_bytes": eng.weights.nbytes,
                          "state_bytes": eng.state.nbytes, "graph_captured": eng.graph.captured,
                          "graph_error": eng.graph_error, "gpu_mem_allocated": torch.cuda.memory_allocated()}
        print("load", result["load"], flush=True)
    except Exception:
        result["load_error"] = traceback.format_exc()
        print(result["load_error"], flush=True)
        save()
        return 1
    save()

    fixture = None
    if os.path.exists(args.fixture):
        fixture = json.load(open(args.fixture))
        result["fixture"] = {"path": os.path.relpath(args.fixture), "model_id": fixture.get("model_id"),
                             "control": fixture.get("control")}
        if fixture["checkpoint"]["config"] != args.config or fixture["checkpoint"]["layers"] != shape.layers \
                or fixture["checkpoint"]["seed"] != args.seed:
            fixture = None
    for label, ks in (("triton", None), ("reference", reference_kernels() if args.reference else None)):
        if fixture is None or (label == "reference" and ks is None):
            continue
        try:
            e = eng if ks is None else Qwen35Engine(cfg, src, dev, ks, EngineOptions(**{**opts.__dict__, "use_graph": False}))
            result[f"parity_{label}"] = r = parity(e, fixture, args.tie)
            print(f"parity[{label}] pass={r['pass']} max top-k logit err {r['max_topk_logit_err']:.3f} "
                  + " ".join(f"{c['agree']}/{c['steps']}" for c in r["cases"]), flush=True)
            if ks is not None:
                del e
                torch.cuda.empty_cache()
        except Exception:
            result[f"parity_{label}_error"] = traceback.format_exc()
            print(result[f"parity_{label}_error"], flush=True)
        save()

    weight_read = eng.weights.nbytes - eng.weights["embed"].numel() * 2  # embeddings are gathered
    gdn_state = eng.spec.fixed_bytes_per_slot * 2  # read + written once per token
    try:
        d = decode_speed(eng, args.steps, 128)
        floor = (weight_read + gdn_state + eng.spec.bytes_per_token * 128) / COPY_BW
        d.update({"roofline_floor_s": floor, "fraction_of_roofline": floor / d["p50_s"],
                  "graph_captured": eng.graph.captured})
        if args.hf_speed and os.path.exists(args.hf_speed):
            hf = json.load(open(args.hf_speed))
            d["hf_baseline_p50_s"] = hf["decode_step_p50_s"]
            d["speedup_vs_hf"] = hf["decode_step_p50_s"] / d["p50_s"]
        result["decode"] = d
        print("decode", d, flush=True)
    except Exception:
        result["decode_error"] = traceback.format_exc()
        print(result["decode_error"], flush=True)
    save()
    try:
        result["ttft"] = ttft(eng, [int(x) for x in args.ttft.split(",") if x])
        print("ttft", result["ttft"], flush=True)
    except Exception:
        result["ttft_error"] = traceback.format_exc()
        print(result["ttft_error"], flush=True)
    result["peak_gpu_mem"] = torch.cuda.max_memory_allocated()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
