"""H200: write the 27B synthetic .mspec artifact straight from the generator, inspect and verify it.

Run on the device machine from the repository root (python3 3.12, torch with CUDA):

    PYTHONPATH=src:. python3 bench/artifact_qwen3_5_27b.py            # int4, into /tmp
    PYTHONPATH=src:. python3 bench/artifact_qwen3_5_27b.py --config small --device cpu   # CPU dry run

Steps, each timed, each a subprocess of the real CLI:
  1. `pytest tests/convert/test_convert_gpu.py -m gpu`: CUDA quantization == CPU, bit for bit
     (27B tensors, random scales, a `small` artifact written both ways);
  2. `python3 -m modeld synth --config 27b --seed 0 --to-mspec OUT --profile P --device cuda`
     (= `modeld synth` + `modeld convert --profile P`, byte for byte, without the 54 GB checkpoint);
  3. `python3 -m modeld inspect --json OUT`;  4. `python3 -m modeld verify OUT` (re-hashes it all).
The identity is compared with the one precomputed on the CPU (bench/artifact_qwen3_5_27b.expected.json):
equal means the GPU-quantized artifact is the CPU converter's artifact. The artifact is kept (for
`modeld resolve` / `modeld serve`). Writes $OUT/artifact_qwen3_5_27b.json (also printed).
Step timeouts (120 + 330 + 30 + 110 s) keep a run under the device tool's 600 s per command.
Exit status: 0 when every step passed and the identity matched (or no expectation exists), else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXPECTED = HERE / "artifact_qwen3_5_27b.expected.json"


def step(name: str, cmd: list[str], results: dict, env: dict, timeout: float) -> subprocess.CompletedProcess | None:
    """Run `cmd`, stream its output through, record rc and wall time under results[name]."""
    print(f"== {name}: {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:             # the child was killed; show how far it got
        for part in (exc.stdout, exc.stderr):
            if part:
                sys.stdout.write((part.decode() if isinstance(part, bytes) else part)[-3000:])
        results[name] = {"rc": None, "seconds": round(time.perf_counter() - start, 2), "error": "timeout"}
        print(f"== {name}: TIMEOUT after {timeout} s", flush=True)
        return None
    seconds = round(time.perf_counter() - start, 2)
    sys.stdout.write(proc.stdout[-4000:])
    sys.stdout.write(proc.stderr[-3000:])
    results[name] = {"rc": proc.returncode, "seconds": seconds,
                     "peak_rss_children_gb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e6, 2)}
    print(f"== {name}: rc {proc.returncode} in {seconds} s", flush=True)
    return proc


def div_probe() -> dict:
    """How often CUDA `t / 15.0` (Python scalar: reciprocal multiply) and `t / tensor(15.0)` differ
    from the CPU's true division, over 16 Mi random fp32 values (the KNOWLEDGE pitfall, measured)."""
    import torch

    if not torch.cuda.is_available():
        return {"skipped": "no CUDA"}
    x = torch.rand(1 << 24, generator=torch.Generator().manual_seed(0)) * 8
    ref = x / 15.0
    xc = x.cuda()
    by_scalar = (xc / 15.0).cpu()
    by_tensor = (xc / torch.tensor(15.0, device="cuda")).cpu()
    return {"values": x.numel(), "scalar_div_mismatches": int((by_scalar != ref).sum()),
            "tensor_div_mismatches": int((by_tensor != ref).sum()),
            "fp16_scale_mismatches_scalar_div": int((by_scalar.half() != ref.half()).sum())}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", default="int4", choices=["bf16", "fp8", "int4"])
    p.add_argument("--lm-head", default="bf16", choices=["bf16", "fp8", "int4"],
                   help="as `modeld convert --lm-head`: bf16 (default) or the --profile's own format (key P+qhead)")
    p.add_argument("--config", default="27b", choices=["27b", "small", "tiny"], help="synth preset (dry runs: small)")
    p.add_argument("--out-dir", type=Path, default=Path("/tmp"), help="where the artifact goes (default /tmp)")
    p.add_argument("--workers", type=int, default=16, help="synth generator threads (default 16)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--skip-gpu-tests", action="store_true", help="skip step 1")
    args = p.parse_args()

    # the expectation's key and the file: P+qhead (the profile's own head format), int4+fp8head
    name = args.profile + ("" if args.lm_head == "bf16" else "+qhead" if args.lm_head == args.profile
                           else f"+{args.lm_head}head")
    out = args.out_dir / f"qwen3_5-{args.config}-seed0-{name}.mspec"
    need = 25e9 if args.config == "27b" else 1e9                  # int4 27B: 18.3 GB
    report_dir = Path(os.environ.get("OUT", "."))
    env = dict(os.environ, MODELD_PROGRESS="lines", MODELD_PROGRESS_EVERY="10")
    py = sys.executable
    free = shutil.disk_usage(args.out_dir).free
    results: dict = {"artifact": str(out), "config": args.config, "profile": name, "device": args.device,
                     "free_disk_gb_before": round(free / 1e9, 1)}
    try:
        import numpy
        import torch

        results["versions"] = {"python": sys.version.split()[0], "torch": torch.__version__, "numpy": numpy.__version__,
                               "cuda": torch.version.cuda,
                               "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    except ImportError as err:                            # record it; the subprocesses will fail loudly
        results["versions"] = {"error": str(err)}
    if free < need:
        results["error"] = f"only {free / 1e9:.1f} GB free in {args.out_dir}; need {need / 1e9:.0f} GB"
        return finish(results, report_dir, ok=False)

    try:
        results["div_probe"] = div_probe()
    except Exception as err:                              # informative only; never blocks the artifact
        results["div_probe"] = {"error": repr(err)}
    if not args.skip_gpu_tests:
        step("gpu_tests", [py, "-m", "pytest", "tests/convert/test_convert_gpu.py", "-m", "gpu", "-q",
                           "-p", "no:cacheprovider"], results, env, timeout=120)
    write = step("write", [py, "-m", "modeld", "synth", "--family", "qwen3_5", "--config", args.config, "--seed", "0",
                           "--to-mspec", str(out), "--profile", args.profile, "--device", args.device,
                           "--workers", str(args.workers), "--force"]
                 + (["--lm-head", args.lm_head] if args.lm_head != "bf16" else []), results, env, timeout=330)
    ok = write is not None and write.returncode == 0
    if ok:
        results["write"]["file_gb"] = round(out.stat().st_size / 1e9, 3)
        inspect = step("inspect", [py, "-m", "modeld", "inspect", "--json", str(out)], results, env, timeout=30)
        if inspect is not None and inspect.returncode == 0:
            results["identity"] = json.loads(inspect.stdout)
        verify = step("verify", [py, "-m", "modeld", "verify", str(out)], results, env, timeout=110)
        ok = ok and inspect is not None and inspect.returncode == 0 and verify is not None and verify.returncode == 0
    key = f"{args.config}/{name}"
    expected = json.loads(EXPECTED.read_text()).get(key) if EXPECTED.is_file() else None
    if expected and "identity" in results:
        got = results["identity"]
        results["identity_matches_cpu_precompute"] = all(
            got.get(k) == expected[k] for k in ("model_id", "weights_id", "tokenizer_id", "recipe_hash"))
        results["expected"] = expected
        if out.is_file():                                 # config/tokenizer metadata too, not gating
            results["file_bytes_match"] = out.stat().st_size == expected.get("file_bytes")
        ok = ok and results["identity_matches_cpu_precompute"]
    gpu = results.get("gpu_tests")
    ok = ok and (gpu is None or gpu["rc"] == 0)
    return finish(results, report_dir, ok)


def finish(results: dict, report_dir: Path, ok: bool) -> int:
    results["ok"] = ok
    text = json.dumps(results, indent=2)
    print(text)
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "artifact_qwen3_5_27b.json").write_text(text + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
