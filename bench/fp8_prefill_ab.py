"""fp8 weights, long prefill: bf16 activations (w8a16, the certified default) against fp8 activations
(w8a8, `MODELD_FP8_PREFILL=w8a8`, linear/w8a8.py) in ONE engine on the H200 — speed and what the
activation rounding does to the model's output.

The 27B synthetic checkpoint is streamed into one fp8 `Qwen35Engine` (the converter's own quantizer,
on the GPU, as bench/engine_qwen3_5.py --profile fp8 does). Per mode, switched through
`linear.triton.FP8_PREFILL` (read per call; both modes share every weight and every decode kernel):
* TTFT at each --ttft length (prefill + first argmax, synchronised, best of 3);
* on a seeded pseudo-random prompt of --compare tokens: the last position's logits after prefill,
  then --decode greedy steps (decode is M = 1, identical kernels in both modes, so any difference
  comes from the KV cache and GDN state the prefill left behind).
Reported: TTFT per mode and the speedup; max / mean |Δlogit| (w8a8 − w8a16) at the prefill's last
position and per decode step, argmax agreement, and the first step where the greedy continuations
diverge. Context for the size of |Δ|: the 2026-11-29 certification measured the bf16 engine against
HF at max |Δ| ≈ 1.08 and fp8 (w8a16) against its dequantized reference at ≈ 1.0.

Writes $OUT/fp8_prefill_ab.json. Exit 0 unless the engine cannot load.

    PYTHONUNBUFFERED=1 PYTHONPATH=src:. python3 bench/fp8_prefill_ab.py --out $OUT         # H200, ~2 min
    PYTHONPATH=src:. python3 bench/fp8_prefill_ab.py --out /tmp/ab --device cpu --config tiny \
        --ttft 40 --compare 40 --decode 3                                                   # CPU dry run
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _qwen_common as C  # noqa: E402  (build_engine: the certification's engine options)
import engine_qwen3_5 as EB  # noqa: E402  (SynthSource, ttft, sync)

MODES = ("w8a16", "w8a8")


def continuation(engine, prompt: list[int], steps: int):
    """Logits [V] after prefill, then `steps` greedy decode steps: (logits list, tokens list)."""
    import torch

    engine.reset_slot(0)
    logits = [engine.prefill(0, prompt).float().clone()]
    tokens = [int(torch.argmax(logits[0]))]
    for _ in range(steps):
        logits.append(engine.decode([tokens[-1]])[0].float().clone())
        tokens.append(int(torch.argmax(logits[-1])))
    return logits, tokens


def compare(a, b) -> dict:
    import torch

    d = (a - b).abs()
    return {"max_abs": float(d.max()), "mean_abs": float(d.mean()),
            "argmax_equal": bool(torch.argmax(a) == torch.argmax(b))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder ($OUT)")
    ap.add_argument("--config", default="27b", help="synth preset (default 27b; tiny for a CPU dry run)")
    ap.add_argument("--seed", type=int, default=0, help="synth seed")
    ap.add_argument("--ttft", default="2048,8192", help="TTFT prompt lengths")
    ap.add_argument("--compare", type=int, default=8192, help="prompt length of the output comparison")
    ap.add_argument("--decode", type=int, default=32, help="greedy decode steps after the compared prefill")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (dry run on reference kernels)")
    args = ap.parse_args(argv)

    import torch

    from modeld.convert.qwen3_5_spec import hf_config, preset
    from modeld.kernels.linear import triton as lin
    from modeld.models.qwen3_5.config import Qwen35Config
    from modeld.qualify.hf_weights import QuantizedSource

    os.makedirs(args.out, exist_ok=True)
    dev = torch.device(args.device)
    if dev.type != "cuda":
        EB.sync = lambda: None
    lengths = sorted({int(x) for x in args.ttft.split(",") if x})
    shape = preset(args.config, None)
    cfg = Qwen35Config.from_hf(hf_config(shape))
    t0 = time.perf_counter()
    src = QuantizedSource(EB.SynthSource(shape, args.seed, args.workers), "fp8",
                          device="cuda" if dev.type == "cuda" else None)
    eng = C.build_engine(cfg, src, dev, capacity=max(lengths + [args.compare]) + args.decode + 8)
    result = {"bench": "fp8_prefill_ab", "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "argv": sys.argv[1:], "load_s": time.perf_counter() - t0,
              "gpu": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu (dry run)",
              "torch": torch.__version__, "w8a8_min_m": lin.W8A8_MIN_M, "modes": {}}
    print(f"fp8 engine loaded in {result['load_s']:.1f} s", flush=True)
    gen = torch.Generator().manual_seed(1234)
    prompt = torch.randint(10, cfg.vocab - 32, (args.compare,), generator=gen).tolist()
    runs = {}
    saved = lin.FP8_PREFILL
    try:
        for mode in MODES:
            lin.FP8_PREFILL = mode
            ttft = EB.ttft(eng, lengths)
            logits, tokens = continuation(eng, prompt, args.decode)
            runs[mode] = (logits, tokens)
            result["modes"][mode] = {"ttft": ttft, "tokens": tokens}
            print(mode, " ".join(f"TTFT {t['prompt_tokens']}: {t['ttft_s_min'] * 1e3:.0f} ms" for t in ttft), flush=True)
    finally:
        lin.FP8_PREFILL = saved
    (la, ta), (lb, tb) = runs["w8a16"], runs["w8a8"]
    diverge = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), None)
    steps = [compare(b, a) for a, b in zip(la, lb)]
    upto = len(steps) if diverge is None else diverge + 1  # after a divergence the inputs differ
    result["comparison"] = {
        "prompt_tokens": args.compare, "prefill_last": steps[0], "per_step": steps[:upto],
        "max_abs_until_divergence": max(s["max_abs"] for s in steps[:upto]),
        "greedy_tokens_equal": sum(x == y for x, y in zip(ta, tb)), "greedy_steps": len(ta),
        "first_divergence": diverge}
    result["speedup_ttft"] = {str(a["prompt_tokens"]): a["ttft_s_min"] / b["ttft_s_min"]
                              for a, b in zip(result["modes"]["w8a16"]["ttft"], result["modes"]["w8a8"]["ttft"])}
    with open(os.path.join(args.out, "fp8_prefill_ab.json"), "w") as f:
        json.dump(result, f, indent=1)
    c = result["comparison"]
    print(f"SUMMARY w8a8 vs w8a16: TTFT speedup {result['speedup_ttft']}; prefill-last max|Δ| "
          f"{c['prefill_last']['max_abs']:.3f} mean {c['prefill_last']['mean_abs']:.4f} argmax equal "
          f"{c['prefill_last']['argmax_equal']}; greedy {c['greedy_tokens_equal']}/{c['greedy_steps']} equal, first "
          f"divergence {c['first_divergence']}; max|Δ| until then {c['max_abs_until_divergence']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
