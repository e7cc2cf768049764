"""Count what one engine prefill launches: Triton kernels and the ATen ops between them (CPU, interpreter).

A short prompt's TTFT on the H200 is mostly a fixed cost per prefill (findings/short-prompt-ttft-is-host-bound.md):
the eager prefill's host work. This counts its units on the CPU, without a GPU: the tiny-preset engine bound to
the Triton kernels runs under TRITON_INTERPRET=1; each Triton launch is counted by kernel name, and each ATen op
issued outside a kernel (allocations, views, copies: the glue between launches) by op name. The counts depend on
the schedule, not on the sizes, so tiny's per-layer numbers carry over to the 27B's 64 layers (per prefill chunk;
the 27B's M >= 512 dequantise route adds its own launches). Writes $OUT/prefill_launches.json.

    OMP_NUM_THREADS=1 PYTHONPATH=src:. python3 bench/prefill_launches.py --out /tmp/pl [--tokens 24]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path


def count(tokens: int, workdir: Path) -> dict:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    import triton.runtime.interpreter as interp
    from torch.utils._python_dispatch import TorchDispatchMode

    from modeld.convert.qwen3_5_spec import preset
    from modeld.convert.synth import write_synthetic
    from modeld.execution.bindings import triton_kernels
    from modeld.execution.sources import SafetensorsDirSource
    from modeld.models.qwen3_5.config import Qwen35Config
    from modeld.models.qwen3_5.engine import EngineOptions, Qwen35Engine

    ckpt = workdir / "tiny"
    write_synthetic(preset("tiny"), 0, ckpt, workers=2)
    cfg = Qwen35Config.from_file(ckpt / "config.json")
    eng = Qwen35Engine(cfg, SafetensorsDirSource(ckpt), "cpu", kernels=triton_kernels(),
                       options=EngineOptions(capacity=max(256, tokens + 1)))
    launches: collections.Counter = collections.Counter()
    glue: collections.Counter = collections.Counter()
    inside = [False]  # the interpreter's own tensor traffic inside a kernel is not glue
    real_run = interp.InterpretedFunction.run

    def counted_run(self, *a, **k):
        launches[self.fn.__name__] += 1
        inside[0] = True
        try:
            return real_run(self, *a, **k)
        finally:
            inside[0] = False

    class Glue(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not inside[0]:
                glue[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    prompt = [10 + i % (cfg.vocab - 20) for i in range(tokens)]
    eng.prefill(0, prompt)  # warm: first-call caches are not per-prefill work
    eng.reset_slot(0)
    interp.InterpretedFunction.run = counted_run
    try:
        with Glue():
            eng.prefill(0, prompt)
    finally:
        interp.InterpretedFunction.run = real_run
    layers = len(cfg.layer_types)
    return {"preset": "tiny", "layers": layers, "layer_types": list(cfg.layer_types), "tokens": tokens,
            "triton_launches": sum(launches.values()), "triton_by_kernel": dict(launches.most_common()),
            "aten_glue_ops": sum(glue.values()), "aten_glue_by_op": dict(glue.most_common()),
            "per_layer": {"triton": sum(launches.values()) / layers, "aten_glue": sum(glue.values()) / layers}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--tokens", type=int, default=24, help="prompt tokens (default 24; one prefill chunk)")
    a = ap.parse_args(argv)
    if a.tokens < 1:
        ap.error("--tokens must be >= 1")
    os.makedirs(a.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        res = count(a.tokens, Path(tmp))
    with open(os.path.join(a.out, "prefill_launches.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"{res['tokens']} tokens, {res['layers']} layers: {res['triton_launches']} Triton launches "
          f"({res['per_layer']['triton']:.2f} per layer), {res['aten_glue_ops']} ATen glue ops "
          f"({res['per_layer']['aten_glue']:.1f} per layer)")
    print("  triton:", res["triton_by_kernel"])
    print("  glue:  ", res["aten_glue_by_op"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
