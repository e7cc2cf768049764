"""llama.cpp (llama-cpp-python) on the same qwen3_5 weights as our engine: the second control of TARGETS.md
("≥ 2× llama.cpp on the same model and GPU") and the fall-through backend's speed on that model.

The GGUF comes from `modeld export-gguf` (--gguf PATH), or is exported first from the synthetic checkpoint
(--synth 27b --seed 0: generated on the fly, no checkpoint on disk; --gguf-dir picks where the file goes, /dev/shm
on the H200 whose disk is 64 GB). Measured the way bench/engine_qwen3_5.py measures our engine, with the same ids:
* decode at a --context-token prompt: per token, one llama_decode of the token and the argmax read back (what a
  serving loop pays per token), p50 / p90 over --steps, tok/s;
* TTFT per --ttft length: the prompt evaluated (llama.cpp splits it into --batch-token ubatches) and the first
  argmax read, best of 3, the context cleared between runs.
Offload: every layer on the GPU (--n-gpu-layers -1) with flash attention, when the llama.cpp build has a GPU
backend; `gpu_offload` in the JSON says whether it had one (a CPU build runs the same code, for a dry run).
--quantize q8_0 / q4_1 / q4_k_m first runs llama.cpp's own quantizer on the GGUF (the like-for-like control of our
fp8 / int4 profiles; output.weight and the token embeddings keep the GGUF's type unless --quantize-output, as our
recipes keep the lm_head and embeddings; KNOWLEDGE/findings/llama-cpp-control-qwen3_5-27b-h200.md).

    PYTHONUNBUFFERED=1 PYTHONPATH=src:. python3 bench/llama_cpp_control.py --out $OUT --synth 27b --seed 0 \
        --gguf-dir /dev/shm
    dry run (CPU, ~10 s): PYTHONPATH=src:. python3 bench/llama_cpp_control.py --out /tmp/lc --synth small \
        --gguf-dir /tmp --outtype f32 --context 16 --steps 3 --ttft 16,32 --ctx 128
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# llama_cpp before numpy: a CUDA build of llama-cpp-python 0.3.36 segfaults while loading a model when numpy was
# imported first (H200, session 23; KNOWLEDGE/pitfalls/llama-cpp-cuda-segfaults-after-numpy-import.md). A missing
# llama_cpp is reported where it is used.
try:
    import llama_cpp  # noqa: F401
except ImportError:
    pass
import numpy as np  # noqa: E402

# llama_ftype of each --quantize choice (llama.h: LLAMA_FTYPE_MOSTLY_Q8_0 / _Q4_1 / _Q4_K_M)
QUANT_FTYPES = {"q8_0": 7, "q4_1": 3, "q4_k_m": 15}


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (llama_cpp_control.json)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--gguf", type=Path, help="a qwen35 GGUF (from `modeld export-gguf`)")
    src.add_argument("--synth", choices=["27b", "tiny", "small"], help="export this synthetic preset first")
    ap.add_argument("--seed", type=int, default=0, help="--synth: seed (default 0)")
    ap.add_argument("--gguf-dir", type=Path, default=Path("/tmp"), help="--synth: where the GGUF goes")
    ap.add_argument("--outtype", default="bf16", choices=["f32", "f16", "bf16"], help="--synth: matrix storage")
    ap.add_argument("--n-gpu-layers", type=int, default=-1, help="layers offloaded (-1: all; default)")
    ap.add_argument("--ctx", type=int, default=9216, help="context size (default 9216: an 8k TTFT fits)")
    ap.add_argument("--batch", type=int, default=2048, help="n_batch = n_ubatch: prefill tokens per step")
    ap.add_argument("--context", type=int, default=128, help="decode: prompt tokens before the timed steps")
    ap.add_argument("--steps", type=int, default=96, help="decode: timed steps (default 96)")
    ap.add_argument("--ttft", default="128,8192", help="TTFT prompt lengths (default 128,8192)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: llama.cpp's)")
    ap.add_argument("--quantize", choices=sorted(QUANT_FTYPES), default=None,
                    help="quantize the GGUF first with llama.cpp's own quantizer, the like-for-like control of a "
                         "quantized profile: q8_0 beside our fp8, q4_1 / q4_k_m beside our int4 (written next to "
                         "the GGUF, reused when present)")
    ap.add_argument("--quantize-output", action="store_true",
                    help="--quantize: quantize output.weight (the lm_head) too; by default it and the token "
                         "embeddings keep the GGUF's type, as our recipes keep them")
    return ap.parse_args(argv)


def export_synth(a) -> tuple[Path, dict]:
    from modeld.convert.gguf_export import export, synth_checkpoint

    path = a.gguf_dir / f"synth-{a.synth}-seed{a.seed}-{a.outtype}.gguf"
    t0 = time.perf_counter()
    if path.exists():
        return path, {"path": str(path), "reused": True}
    with synth_checkpoint(a.synth, a.seed) as ckpt:
        summary = export(ckpt, path, a.outtype)
    summary["seconds"] = time.perf_counter() - t0
    return path, summary


def gguf_tensor_type(path: Path, name: str) -> int:
    """The ggml type id of tensor `name` in the GGUF at `path` (memory-mapped: only the header is read)."""
    from gguf import GGUFReader

    for t in GGUFReader(path).tensors:
        if t.name == name:
            return int(t.tensor_type)
    raise KeyError(f"{path} has no tensor {name}")


def quantize(src: Path, kind: str, quantize_output: bool, threads: int | None) -> tuple[Path, dict]:
    """`src` quantized by llama.cpp (llama_model_quantize) to QUANT_FTYPES[kind]; the file appears only when
    complete. Raises RuntimeError when llama.cpp reports a failure."""
    import llama_cpp

    dst = src.with_name(f"{src.stem}-{kind}{'-qout' if quantize_output else ''}.gguf")
    if dst.exists():
        return dst, {"path": str(dst), "kind": kind, "quantize_output": quantize_output, "reused": True,
                     "bytes": dst.stat().st_size}
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = QUANT_FTYPES[kind]
    params.nthread = threads or 0
    params.quantize_output_tensor = quantize_output
    if not quantize_output:
        params.token_embedding_type = gguf_tensor_type(src, "token_embd.weight")
    partial = dst.with_name(dst.name + ".partial")
    t0 = time.perf_counter()
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(partial).encode(), params)
    if rc != 0:
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"llama_model_quantize({src} -> {kind}) returned {rc}")
    partial.rename(dst)
    return dst, {"path": str(dst), "kind": kind, "quantize_output": quantize_output,
                 "seconds": time.perf_counter() - t0, "bytes": dst.stat().st_size,
                 "source_bytes": src.stat().st_size}


def ttft_ids(n: int, vocab: int) -> list[int]:
    return [(7 * i + 3) % (vocab - 32) + 10 for i in range(n)]           # bench/engine_qwen3_5.ttft's prompt


def decode_ids(n: int, vocab: int) -> list[int]:
    return [(5 * i + 1) % (vocab - 32) for i in range(n)]              # bench/engine_qwen3_5.decode_speed's


def argmax_last(llm) -> int:
    """The argmax of the last evaluated token's logits (llama-cpp-python fills `scores` only with logits_all)."""
    import llama_cpp

    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))))


def measure(a, path: Path) -> dict:
    import llama_cpp

    gpu = bool(llama_cpp.llama_supports_gpu_offload())
    t0 = time.perf_counter()
    kwargs = dict(n_ctx=a.ctx, n_batch=a.batch, n_ubatch=a.batch, n_gpu_layers=a.n_gpu_layers if gpu else 0,
                  flash_attn=gpu, logits_all=False, verbose=False)
    if a.threads:
        kwargs["n_threads"] = a.threads
    llm = llama_cpp.Llama(str(path), **kwargs)
    load_s = time.perf_counter() - t0
    vocab = llm.n_vocab()
    res = {"gpu_offload": gpu, "params": dict(kwargs), "load_s": load_s, "vocab": vocab,
           "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip()}
    try:
        llm.reset()
        llm.eval(decode_ids(a.context, vocab))
        tok = argmax_last(llm)
        for _ in range(3):   # warm
            llm.eval([tok])
            tok = argmax_last(llm)
        steps, tokens = [], []
        for _ in range(a.steps):
            t0 = time.perf_counter()
            llm.eval([tok])
            tok = argmax_last(llm)
            steps.append(time.perf_counter() - t0)
            tokens.append(tok)
        s = np.array(steps)
        res["decode"] = {"context": a.context, "steps": a.steps, "p50_s": float(np.median(s)),
                         "p90_s": float(np.percentile(s, 90)), "tok_per_s_p50": float(1 / np.median(s)),
                         "greedy_tokens_head": tokens[:16]}
        res["ttft"] = []
        for n in (int(x) for x in a.ttft.split(",") if x):
            if n + 1 > a.ctx:
                continue
            ids, runs = ttft_ids(n, vocab), []
            for _ in range(3):
                llm.reset()   # for a hybrid model this also clears the KV and recurrent state (llama-cpp-python)
                t0 = time.perf_counter()
                llm.eval(ids)
                first = argmax_last(llm)
                runs.append(time.perf_counter() - t0)
            res["ttft"].append({"prompt_tokens": n, "ttft_s_min": min(runs), "ttft_s_runs": runs,
                                "prefill_tok_per_s": n / min(runs), "first_token": first})
    finally:
        llm.close()
    return res


def main(argv=None) -> int:
    a = parse(sys.argv[1:] if argv is None else argv)
    os.makedirs(a.out, exist_ok=True)
    import llama_cpp

    doc = {"bench": "llama_cpp_control", "argv": sys.argv[1:] if argv is None else argv,
           "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "env": {k: v for k, v in os.environ.items() if k.startswith("MODELD_")},
           "versions": {"llama_cpp_python": llama_cpp.__version__, "python": sys.version.split()[0]}}
    if a.synth:
        path, doc["export"] = export_synth(a)
    else:
        path = a.gguf
    if a.quantize:
        path, doc["quantize"] = quantize(path, a.quantize, a.quantize_output, a.threads)
    doc["gguf"] = {"path": str(path), "bytes": path.stat().st_size}
    doc.update(measure(a, path))
    out = Path(a.out) / "llama_cpp_control.json"
    out.write_text(json.dumps(doc, indent=1))
    d = doc["decode"]
    tt = " ".join(f"{t['prompt_tokens']}:{t['ttft_s_min'] * 1e3:.0f}ms" for t in doc["ttft"])
    what = f"{'GPU' if doc['gpu_offload'] else 'CPU'} {path.name}"
    print(f"SUMMARY llama.cpp {what}: decode {d['tok_per_s_p50']:.1f} tok/s "
          f"(p50 {d['p50_s'] * 1e3:.2f} ms, p90 {d['p90_s'] * 1e3:.2f} ms at context {d['context']}), TTFT {tt}; "
          f"load {doc['load_s']:.1f} s; wrote {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
