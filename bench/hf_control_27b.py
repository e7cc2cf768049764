"""HF control for the 27B `qwen3_5` synthetic checkpoint on one GPU: greedy fixture + HF speed.

Builds `Qwen3_5ForCausalLM` (transformers, bf16, sdpa attention, torch GDN fallback: no
flash-linear-attention / causal-conv1d) directly on the GPU and streams `modeld synth --family
qwen3_5 --config 27b --seed 0` weights into it (modeld.qualify.synth_stream: bit-identical to
loading the files `modeld synth` writes, without writing 54 GB). Then, per prompt, a manual greedy
loop over HF's own forward with its cache: prefill (timed), 32 decode steps (each timed with a
device sync). Writes under --out:
  hf_control_27b_fixture.json  magic/version header, versions, regeneration command, per prompt the
                               greedy tokens and the top-k logits of every step
  hf_control_27b_speed.json    prefill time of the 128-token prompt, p50/p90 per-token decode time,
                               tok/s, peak memory, GPU, versions
Imports only torch, transformers, numpy, rich-free modeld modules (runs on the H200 image).

    PYTHONUNBUFFERED=1 PYTHONPATH=src:. python3 bench/hf_control_27b.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

import numpy as np

FIXTURE_MAGIC = "modeld-greedy-fixture"
FIXTURE_VERSION = 1
COMMAND = ("PYTHONUNBUFFERED=1 PYTHONPATH=src:. python3 bench/hf_control_27b.py --out $OUT "
           "--config {config} --seed {seed} --new-tokens {new}")


def prompts(vocab_hi: int) -> list[list[int]]:
    """Fixed prompts: token ids drawn once from a seeded generator (below the special ids)."""
    rng = np.random.default_rng(20261129)
    return [rng.integers(0, vocab_hi, n).tolist() for n in (5, 16, 128)]


def topk(logits, k: int) -> tuple[list[int], list[float]]:
    import torch
    vals, idx = torch.topk(logits.float(), k)
    return idx.tolist(), [float(v) for v in vals.tolist()]


def weight_fingerprint(shape, seed: int) -> str:
    """sha256 over synth chunk 0 of a few tensors (bf16 bytes): proves this numpy draws the same
    values as the machine that made the fixture (compare with the same call elsewhere)."""
    import hashlib

    import torch

    from modeld.convert.qwen3_5_spec import checkpoint_inventory
    from modeld.convert.synth import CHUNK_ELEMS, chunk_values

    h = hashlib.sha256()
    specs = {s.name: s for s in checkpoint_inventory(shape, include_mtp=False)}
    for name in sorted(specs)[:: max(1, len(specs) // 6)]:
        spec = specs[name]
        count = min(CHUNK_ELEMS, int(np.prod(spec.shape)))
        vals = torch.from_numpy(chunk_values(spec, seed, 0, count)).to(torch.bfloat16)
        h.update(name.encode())
        h.update(vals.view(torch.int16).numpy().tobytes())
    return h.hexdigest()


def greedy(model, ids: list[int], new_tokens: int, k: int, device) -> dict:
    """HF forward + cache, greedy; times prefill and every decode step (device-synchronised)."""
    import torch

    x = torch.tensor([ids], device=device)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model(input_ids=x, use_cache=True, logits_to_keep=1)
    torch.cuda.synchronize()
    prefill_s = time.perf_counter() - t0
    cache, logits = out.past_key_values, out.logits[0, -1]
    tokens, steps, step_s = [], [], []
    for j in range(new_tokens):
        tid, tval = topk(logits, k)
        steps.append({"topk_ids": tid, "topk_logits": tval})
        nxt = int(torch.argmax(logits))            # first index on ties, as generate() does
        tokens.append(nxt)
        if j == new_tokens - 1:
            break
        t0 = time.perf_counter()
        out = model(input_ids=torch.tensor([[nxt]], device=device), past_key_values=cache,
                    use_cache=True)
        torch.cuda.synchronize()
        step_s.append(time.perf_counter() - t0)
        cache, logits = out.past_key_values, out.logits[0, -1]
    return {"prompt_ids": ids, "tokens": tokens, "steps": steps, "prefill_s": prefill_s,
            "decode_step_s": step_s}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (e.g. $OUT)")
    ap.add_argument("--config", default="27b", help="modeld synth preset (default 27b)")
    ap.add_argument("--seed", type=int, default=0, help="synth seed (default 0)")
    ap.add_argument("--new-tokens", type=int, default=32, help="greedy tokens per prompt (default 32)")
    ap.add_argument("--top-k", type=int, default=10, help="logits kept per step (default 10)")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu for a dry run on tiny presets")
    args = ap.parse_args(argv)

    import torch
    import transformers
    from transformers import Qwen3_5ForCausalLM

    from modeld.convert.qwen3_5_spec import preset
    from modeld.convert.synth import GENERATOR_VERSION, model_id_for
    from modeld.qualify.synth_stream import hf_text_config, stream_into

    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    else:                                           # CPU dry run: make the cuda calls no-ops
        torch.cuda.synchronize = lambda *a, **k: None
    gpu = torch.cuda.get_device_name(0) if dev.type == "cuda" else platform.processor() or "cpu"
    print(f"torch {torch.__version__} transformers {transformers.__version__} numpy {np.__version__} "
          f"device {gpu}", flush=True)
    shape = preset(args.config)
    t0 = time.perf_counter()
    with torch.device(dev):
        model = Qwen3_5ForCausalLM._from_config(hf_text_config(shape), dtype=torch.bfloat16,
                                                attn_implementation="sdpa").eval()
    init_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    last = [0.0]

    def progress(done, total):
        if time.perf_counter() - last[0] > 15:
            last[0] = time.perf_counter()
            print(f"  streamed {done / 1e9:.2f} / {total / 1e9:.2f} G elements", flush=True)

    n = stream_into(model, shape, args.seed, workers=args.workers, progress=progress)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    load_s = time.perf_counter() - t0
    mem_weights = torch.cuda.max_memory_allocated() if dev.type == "cuda" else 0
    print(f"model built in {init_s:.1f} s, {n / 1e9:.3f} G weights streamed in {load_s:.1f} s", flush=True)

    fingerprint = weight_fingerprint(shape, args.seed)
    print(f"weight fingerprint {fingerprint}", flush=True)
    cases = []
    with torch.no_grad():
        greedy(model, prompts(shape.bos_id)[0], 2, args.top_k, dev)      # warm-up, untimed
        for ids in prompts(shape.bos_id):
            r = greedy(model, ids, args.new_tokens, args.top_k, dev)
            print(f"  prompt {len(ids):4d} tokens: prefill {r['prefill_s'] * 1e3:8.1f} ms, decode p50 "
                  f"{np.median(r['decode_step_s']) * 1e3:6.1f} ms, tokens {r['tokens'][:8]}...", flush=True)
            cases.append(r)
        gen = model.generate(torch.tensor([cases[0]["prompt_ids"]], device=dev), do_sample=False,
                             max_new_tokens=args.new_tokens, eos_token_id=None, pad_token_id=shape.bos_id)
        gen_tokens = gen[0, len(cases[0]["prompt_ids"]):].tolist()   # may stop early at eos
        generate_agrees = bool(gen_tokens) and gen_tokens == cases[0]["tokens"][:len(gen_tokens)]
    peak = torch.cuda.max_memory_allocated() if dev.type == "cuda" else 0

    versions = {"torch": torch.__version__, "transformers": transformers.__version__,
                "numpy": np.__version__, "python": platform.python_version(),
                "cuda": torch.version.cuda, "device": gpu}
    command = COMMAND.format(config=args.config, seed=args.seed, new=args.new_tokens)
    fixture = {
        "magic": FIXTURE_MAGIC, "format_version": FIXTURE_VERSION, "family": "qwen3_5",
        "model_id": model_id_for(shape, args.seed),
        "checkpoint": {"generator": GENERATOR_VERSION, "config": args.config, "layers": shape.layers,
                       "seed": args.seed, "weight_fingerprint_sha256": fingerprint,
                       "regenerate_weights":
                       f"modeld synth --family qwen3_5 --config {args.config} --seed {args.seed} -o DIR"},
        "control": {"library": "transformers", "class": "Qwen3_5ForCausalLM", "dtype": "bfloat16",
                    "attn_implementation": "sdpa", "gdn_path": "torch fallback (no fla, no causal-conv1d)",
                    "versions": versions},
        "regenerate": command, "top_k": args.top_k, "new_tokens": args.new_tokens,
        "generate_agrees_with_manual_loop": generate_agrees,
        "cases": [{"prompt_ids": c["prompt_ids"], "tokens": c["tokens"], "steps": c["steps"]} for c in cases],
    }
    steps = np.array([s for c in cases for s in c["decode_step_s"]])
    speed = {
        "kind": "hf-control", "model_id": fixture["model_id"], "dtype": "bfloat16", "batch": 1,
        "prefill_128_s": cases[-1]["prefill_s"], "prefill_prompt_tokens": len(cases[-1]["prompt_ids"]),
        "decode_step_p50_s": float(np.median(steps)), "decode_step_p90_s": float(np.percentile(steps, 90)),
        "decode_tok_per_s_p50": float(1.0 / np.median(steps)), "decode_steps_measured": int(steps.size),
        "peak_memory_bytes": int(peak), "weights_memory_bytes": int(mem_weights),
        "weight_stream_s": load_s, "versions": versions, "command": command,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    os.makedirs(args.out, exist_ok=True)
    for name, obj in (("hf_control_27b_fixture.json", fixture), ("hf_control_27b_speed.json", speed)):
        with open(os.path.join(args.out, name), "w") as f:
            json.dump(obj, f, indent=1)
    print(f"SUMMARY {fixture['model_id']} on {gpu}: prefill({speed['prefill_prompt_tokens']}) "
          f"{speed['prefill_128_s'] * 1e3:.1f} ms, decode p50 {speed['decode_step_p50_s'] * 1e3:.2f} ms "
          f"({speed['decode_tok_per_s_p50']:.1f} tok/s), peak {peak / 2**30:.1f} GiB, "
          f"generate==loop {generate_agrees}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
