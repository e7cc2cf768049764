"""Host cost of the qwen3_5 engine's eager prefill: a short suffix prefilled after a cached prefix, on a model whose
kernels are tiny (the `small` preset, 64 layers by default), so the wall time is the host's: Python, the kernel
wrappers' checks and Triton's launch path. Per profile: the wall of --runs suffix prefills (after a GDN-checkpoint
restore back to the prefix, untimed) and cProfile's top functions over --profiled more.

    PYTHONPATH=src:. python3 bench/host_prefill_prof.py --out $OUT/hp          # H200, ~45 s
    dry run (CPU, reference kernels): --device cpu --config tiny --layers 4 --prefix 32 --suffix 5 --runs 2
    CPU proxy of the host cost (--stub-kernels: the Triton wrappers, checks, routing and torch glue run for real on
    CPU tensors, every Triton launch is a no-op; no GPU, and Triton's own launch path is not in it):
    PYTHONPATH=src:. python3 bench/host_prefill_prof.py --out /tmp/hp --device cpu --stub-kernels --runs 30

Writes $OUT/host_prefill_prof.json (walls, best and median, launches are not counted here) and
$OUT/host_prefill_<profile>.txt (the cProfile tables by internal and cumulative time).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (dry run, reference kernels)")
    ap.add_argument("--config", default="small", help="synth preset (default small)")
    ap.add_argument("--layers", type=int, default=64, help="layers (default 64, the 27B's depth)")
    ap.add_argument("--profiles", default="bf16,fp8,int4", help="weight profiles (default bf16,fp8,int4)")
    ap.add_argument("--prefix", type=int, default=2048, help="cached tokens before the suffix (default 2048)")
    ap.add_argument("--suffix", type=int, default=100, help="tokens prefilled per timed run (default 100)")
    ap.add_argument("--runs", type=int, default=12, help="timed runs per profile (default 12)")
    ap.add_argument("--profiled", type=int, default=5, help="runs under cProfile per profile (default 5)")
    ap.add_argument("--suffix-bucket", type=int, default=0, metavar="N",
                    help="EngineOptions.suffix_bucket (the suffix as one captured padded step; 0: off, the default)")
    ap.add_argument("--stub-kernels", action="store_true",
                    help="CPU only: the engine's Triton bindings with every kernel launch a no-op (outputs are "
                         "garbage; the wall is the Python around the launches)")
    a = ap.parse_args(argv)
    if a.stub_kernels and a.device != "cpu":
        ap.error("--stub-kernels needs --device cpu")
    if min(a.layers, a.prefix, a.suffix, a.runs, a.profiled) < 1:
        ap.error("--layers, --prefix, --suffix, --runs and --profiled must be >= 1")
    return a


def main(argv=None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    if a.stub_kernels:  # before triton is imported: kernels become InterpretedFunction objects, whose run is stubbed
        os.environ["TRITON_INTERPRET"] = "1"
        import triton.runtime.interpreter as interp

        interp.InterpretedFunction.run = lambda self, *args, **kwargs: None
    import torch

    import _qwen_common as C
    import engine_qwen3_5 as EB
    from modeld.convert.qwen3_5_spec import hf_config, preset
    from modeld.models.qwen3_5.config import Qwen35Config
    from modeld.qualify.hf_weights import QuantizedSource

    os.makedirs(a.out, exist_ok=True)
    dev = torch.device(a.device)
    if dev.type != "cuda":
        C.cpu_shims()
    if a.stub_kernels:
        torch.set_num_threads(1)  # the glue ops are tiny: one thread, as the host's launch thread
    shape = preset(a.config, a.layers)
    cfg = Qwen35Config.from_hf(hf_config(shape))
    prefix = [1 + i % (cfg.vocab - 1) for i in range(a.prefix)]
    turn = [1 + (7 * i + 3) % (cfg.vocab - 1) for i in range(a.suffix)]
    doc = {"bench": "host_prefill_prof", "argv": argv if argv is not None else sys.argv[1:],
           "stub_kernels": a.stub_kernels,
           "versions": C.versions(dev), "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("MODELD_")},
           "profiles": {}}
    for prof in [p for p in a.profiles.split(",") if p]:
        src = EB.SynthSource(shape, 0, 4)
        if prof != "bf16":
            src = QuantizedSource(src, prof, device="cuda" if dev.type == "cuda" else None)
        if a.stub_kernels:
            from modeld.execution.bindings import triton_kernels
            from modeld.models.qwen3_5.engine import EngineOptions, Qwen35Engine

            opts = EngineOptions(slots=1, capacity=a.prefix + max(a.suffix, a.suffix_bucket) + 64, prefill_chunk=2048,
                                 checkpoint_every=2048, checkpoints=2, use_graph=False, suffix_bucket=a.suffix_bucket)
            eng = Qwen35Engine(cfg, src, dev, triton_kernels(), opts)
        else:
            eng = C.build_engine(cfg, src, dev, a.prefix + max(a.suffix, a.suffix_bucket) + 64,
                                 suffix_bucket=a.suffix_bucket)
        eng.reset_slot(0)
        eng.prefill(0, prefix)

        def one() -> float:
            eng.truncate(0, a.prefix, prefix)
            C.sync()
            t0 = time.perf_counter()
            eng.prefill(0, turn)
            C.sync()
            return time.perf_counter() - t0

        one()  # compiles every suffix shape
        walls = sorted(one() for _ in range(a.runs))
        pr = cProfile.Profile()
        for _ in range(a.profiled):
            eng.truncate(0, a.prefix, prefix)
            C.sync()
            pr.enable()
            eng.prefill(0, turn)
            C.sync()
            pr.disable()
        text = io.StringIO()
        stats = pstats.Stats(pr, stream=text)
        stats.sort_stats("tottime").print_stats(35)
        stats.sort_stats("cumulative").print_stats(45)
        with open(os.path.join(a.out, f"host_prefill_{prof}.txt"), "w") as f:
            f.write(text.getvalue())
        doc["profiles"][prof] = {"walls_s": walls, "best_s": walls[0], "median_s": walls[len(walls) // 2],
                                 "profiled_s_per_run": stats.total_tt / a.profiled}
        print(f"SUMMARY {prof}: {a.suffix} tokens after {a.prefix}, {a.layers} layers: best {walls[0] * 1e3:.2f} ms, "
              f"median {walls[len(walls) // 2] * 1e3:.2f} ms", flush=True)
        with open(os.path.join(a.out, "host_prefill_prof.json"), "w") as f:
            json.dump(doc, f, indent=1)
        del eng
        C.release()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
