"""SmolLM2-135M on the llama engine on the H200 (Triton kernels, CUDA-graph decode) beside HF.

Weights, in order of preference:
* `--gguf PATH`: the real SmolLM2-135M-Instruct Q4_1 GGUF (98 MB: more than one device call
  carries, so it travels in parts — see the report / docs/quality.md). Needs the pure-Python
  `gguf` package. The engine runs the lossless int4 import (`modeld convert`, cached under
  $MODELD_HOME) and, with --profiles, bf16/fp8 converts; HF loads the same GGUF (dequantized)
  in bf16 on the same GPU.
* otherwise `--synthetic`: a seeded SmolLM2-shaped LlamaForCausalLM (same shapes, so the same
  speed; parity against HF on those weights; labelled "synthetic" everywhere).

Per profile: (1) parity, teacher-forced — HF bf16 (sdpa) picks the continuation of each prompt;
the engine is fed prompt + that continuation and its logits at every step are compared with HF
running THIS profile's dequantized weights (the kernel-parity gate: argmax equal except at
near-ties within --tie-ulps bf16 ulps; max |logit err| over the reference's top-8) and with HF on
the original weights (quality: top-1 agreement, KL); plus free-running greedy's first divergence;
(2) decode speed — per-token time of graph replay + argmax + host read
at a 128-token context (p50/p90, tok/s), plus back-to-back replays (device time per step);
(3) TTFT per prompt length. Then HF's own decode tok/s in the same run (KV-cache greedy, one
token per forward, synchronised per token: what a serving loop pays), and the llama cell's
session API on the GPU (greedy through `LlamaCell`, equal to the engine's).

Writes $OUT/engine_llama.json (every number + versions). Exits 0 when it ran (the JSON says
whether parity held), 1 when the engine could not load or run.

    PYTHONUNBUFFERED=1 PYTHONPATH=src:. python3 bench/engine_llama.py --out $OUT [--gguf /tmp/smol.gguf]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
import traceback

import numpy as np

PROMPTS = ("The capital of France is", "def fibonacci(n):",
           "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n",
           "Water boils at a temperature of",
           "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n",
           "import numpy as np\n\nx = np.")
SMOL = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
            num_attention_heads=9, num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5, rope_theta=100000.0,
            max_position_embeddings=8192, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)


DEVICE = "cuda"


def sync():
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


# ------------------------------------------------------------------------------- artifacts
def synthetic_checkpoint(work: str, seed: int) -> str:
    """A seeded SmolLM2-shaped HF checkpoint (float32) + a byte-level tokenizer from the GPT-2 alphabet."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**SMOL)).float()
    out = os.path.join(work, "synthetic-smollm2")
    model.save_pretrained(out)
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())      # 256 byte symbols, ids < 256
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.save(os.path.join(out, "tokenizer.json"))
    return out


class Int4Source:
    """TensorSource over an HF llama checkpoint with every projection quantized to int4 g{group}
    on the fly (kernels.linear.quant.quantize_int4): the layout of the Q4_1 import, for synthetic
    weights (the real GGUF's values are not available without it)."""

    LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

    def __init__(self, base, group: int = 32) -> None:
        self.base, self.group, self._q = base, group, {}
        self._map = {}
        for n in base.names():
            if n.endswith(".weight") and n.split(".")[-2] in self.LINEARS:
                for key in ("qweight", "scales", "mins"):
                    self._map[n[: -len("weight")] + key] = (n, key)
            else:
                self._map[n] = (n, None)

    def names(self):
        return sorted(self._map)

    def _parts(self, src):
        if src not in self._q:
            from modeld.kernels.linear.quant import quantize_int4

            self._q = {src: dict(zip(("qweight", "scales", "mins"), quantize_int4(self.base.tensor(src), self.group)))}
        return self._q[src]

    def meta(self, name):
        src, key = self._map[name]
        if key is None:
            return self.base.meta(name)
        n, k = self.base.meta(src)[1]
        import torch
        return (torch.uint8, (n, k // 2)) if key == "qweight" else (torch.float16, (n, k // self.group))

    def tensor(self, name):
        src, key = self._map[name]
        return self.base.tensor(name) if key is None else self._parts(src)[key]


def hf_from_gguf(gguf: str, dtype):
    from transformers import AutoModelForCausalLM

    from modeld.qualify.smollm2 import _accelerate_check_lifted

    folder, name = os.path.split(os.path.abspath(gguf))
    with _accelerate_check_lifted():
        return AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype)


# ------------------------------------------------------------------------------- measurements
def greedy_engine(engine, ids, n):
    import torch

    engine.reset_slot(0)
    logit = engine.prefill(0, ids)
    out = []
    for _ in range(n):
        out.append(int(torch.argmax(logit)))
        logit = engine.decode([out[-1]])[0]
    return out


def greedy_hf(model, ids, n):
    import torch

    toks, margins = [], []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], device=DEVICE), use_cache=True)
        for _ in range(n):
            lg = out.logits[0, -1].float()
            top = torch.topk(lg, 2).values
            margins.append(float(top[0] - top[1]))
            toks.append(int(torch.argmax(lg)))
            out = model(input_ids=torch.tensor([[toks[-1]]], device=DEVICE), past_key_values=out.past_key_values,
                        use_cache=True)
    return toks, margins


def bf16_ulp(x: float) -> float:
    """One bf16 ulp at |x| (8 significand bits): the rounding grain of HF's bf16 logits."""
    return 2.0 ** (math.floor(math.log2(max(abs(x), 1e-30))) - 7)


def free_running(engine, hf, prompts_ids, n, tie_ulps) -> dict:
    """Free-running greedy of engine and HF: first divergence and HF's top-2 margin there
    (informative: after one near-tie the two continuations are different texts)."""
    rows = []
    for ids in prompts_ids:
        mine = greedy_engine(engine, ids, n)
        ref, margins = greedy_hf(hf, ids, n)
        first = next((j for j, (a, b) in enumerate(zip(mine, ref)) if a != b), None)
        rows.append({"prompt_tokens": len(ids), "first_divergence": first,
                     "hf_margin_there": None if first is None else margins[first], "engine": mine, "hf": ref})
    return {"tokens_per_prompt": n, "cases": rows}


def hf_logits(model, ids) -> "torch.Tensor":
    """HF's logits [T, V] (float32) of one full-sequence forward, no cache."""
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor([ids], device=DEVICE)).logits[0].float()


def teacher_forced(engine, ref_logits: list, base_logits: list, prompts_ids, conts, tie_ulps: float) -> dict:
    """The engine fed the prompt then the control's continuation one token at a time; at every
    step its logits are compared with `ref_logits` (HF on the same — dequantized — weights: the
    kernel-parity gate) and with `base_logits` (HF bf16 on the original weights: quality).

    Gate: every argmax disagreement with the reference must be a near-tie — the reference's logit
    of the engine's pick within `tie_ulps` bf16 ulps of the reference's top (HF's logits are bf16,
    so ties within a couple of ulps are decided by rounding, KNOWLEDGE/pitfalls/greedy-parity-
    breaks-at-bf16-logit-ties.md)."""
    import torch

    ok, rows, all_kl, all_top1 = True, [], [], []
    for ids, cont, ref, base in zip(prompts_ids, conts, ref_logits, base_logits):
        engine.reset_slot(0)
        logit = engine.prefill(0, ids)
        agree = ties = bad = 0
        errs = []
        for j, tok in enumerate(cont):
            r = ref[len(ids) - 1 + j]
            b = base[len(ids) - 1 + j]
            e = logit.float()
            top = torch.topk(r, 8).indices
            errs.append(float((e[top] - r[top]).abs().max()))
            pick, want = int(torch.argmax(e)), int(torch.argmax(r))
            if pick == want:
                agree += 1
            elif float(r[want] - r[pick]) <= tie_ulps * bf16_ulp(float(r[want])):
                ties += 1
            else:
                bad += 1
            all_top1.append(pick == int(torch.argmax(b)))
            lp, lq = torch.log_softmax(b, -1), torch.log_softmax(e, -1)
            all_kl.append(float((lp.exp() * (lp - lq)).sum()))
            if j + 1 < len(cont):
                logit = engine.decode([tok])[0]
        ok &= bad == 0
        rows.append({"prompt_tokens": len(ids), "steps": len(cont), "agree": agree, "near_tie_disagreements": ties,
                     "disagreements_beyond_tie": bad, "max_topk_logit_err": max(errs), "mean_topk_logit_err": float(np.mean(errs))})
    return {"pass": bool(ok), "tie_ulps": tie_ulps, "cases": rows,
            "max_topk_logit_err": max(r["max_topk_logit_err"] for r in rows),
            "quality_vs_hf_bf16": {"top1_agreement": float(np.mean(all_top1)), "mean_kl": float(np.mean(all_kl)),
                                   "max_kl": float(np.max(all_kl)), "positions": len(all_kl)}}


def dequantized_weights(art) -> dict:
    """{hf param name: float32 weight} for every quantized linear of an .mspec, through the
    converter's own dequantizers (modeld.qualify.hf_weights.dequantize_parts — the layouts'
    definitions in docs/interfaces.md, not the engine's kernels)."""
    from modeld.qualify.hf_weights import dequantize_parts

    src, out = art.source, {}
    for n in src.names():
        base, _, comp = n.rpartition(".")
        if comp == "weight_scale":
            parts = {"weight": src.tensor(base + ".weight"), "weight_scale": src.tensor(n)}
        elif comp == "qweight":
            parts = {"qweight": src.tensor(n), "scales": src.tensor(base + ".scales"), "mins": src.tensor(base + ".mins")}
        else:
            continue
        out["model." + base + ".weight"] = dequantize_parts(parts)
    return out


def swap_weights(hf, weights: dict) -> dict:
    """Copy `weights` into HF's parameters (cast to their dtype); returns the originals (CPU)."""
    import torch

    params = dict(hf.named_parameters())
    saved = {}
    with torch.no_grad():
        for name, w in weights.items():
            saved[name] = params[name].detach().cpu().clone()
            params[name].copy_(w.to(params[name].device, params[name].dtype))
    return saved


def decode_speed(step, reset_and_prefill, steps: int) -> dict:
    """step(tok) -> logits [V] (device); per-token host-visible time and tok/s."""
    import torch

    tok = reset_and_prefill()
    for _ in range(5):
        tok = int(torch.argmax(step(tok)))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        tok = int(torch.argmax(step(tok)))
        times.append(time.perf_counter() - t0)
    a = np.array(times)
    return {"steps": steps, "p50_s": float(np.median(a)), "p90_s": float(np.percentile(a, 90)),
            "tok_per_s_p50": float(1 / np.median(a))}


def engine_speed(engine, steps: int, context: int) -> dict:
    ids = [(5 * i + 1) % (engine.config.vocab - 32) for i in range(context)]

    def reset():
        engine.reset_slot(0)
        import torch
        return int(torch.argmax(engine.prefill(0, ids)))

    out = decode_speed(lambda t: engine.decode([t])[0], reset, steps)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.graph()
    sync()
    out.update(context=context, graph_captured=engine.graph.captured, replay_only_s=(time.perf_counter() - t0) / steps)
    return out


def hf_speed(model, steps: int, context: int) -> dict:
    import torch

    ids = [(5 * i + 1) % 49000 for i in range(context)]
    state = {}

    def reset():
        with torch.no_grad():
            out = model(input_ids=torch.tensor([ids], device=DEVICE), use_cache=True)
        state["pkv"] = out.past_key_values
        return int(torch.argmax(out.logits[0, -1]))

    def step(t):
        with torch.no_grad():
            out = model(input_ids=torch.tensor([[t]], device=DEVICE), past_key_values=state["pkv"], use_cache=True)
        state["pkv"] = out.past_key_values
        return out.logits[0, -1]

    return {"context": context, **decode_speed(step, reset, steps)}


def ttft(engine, lengths) -> list[dict]:
    import torch

    out = []
    for n in lengths:
        ids = [(7 * i + 3) % (engine.config.vocab - 32) + 10 for i in range(n)]
        runs = []
        for _ in range(3):
            engine.reset_slot(0)
            sync()
            t0 = time.perf_counter()
            int(torch.argmax(engine.prefill(0, ids)))
            runs.append(time.perf_counter() - t0)
        out.append({"prompt_tokens": n, "ttft_s_min": min(runs), "prefill_tok_per_s": n / min(runs)})
    return out


# ------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="directory for engine_llama.json")
    ap.add_argument("--gguf", help="the real SmolLM2 Q4_1 GGUF (else synthetic SmolLM2-shaped weights)")
    ap.add_argument("--profiles", default="int4,bf16", help="comma list of bf16,int4,fp8 (GGUF mode; synthetic: bf16,int4)")
    ap.add_argument("--tokens", type=int, default=32, help="greedy tokens per prompt for parity")
    ap.add_argument("--steps", type=int, default=256, help="timed decode steps")
    ap.add_argument("--context", type=int, default=128, help="context length for the decode timing")
    ap.add_argument("--ttft", default="128,512,2048", help="prompt lengths for TTFT")
    ap.add_argument("--device", default="cuda", help="cuda (Triton, graphs) or cpu (reference kernels: a smoke run)")
    ap.add_argument("--tie-ulps", type=float, default=2.0,
                    help="a teacher-forced argmax disagreement passes when the reference's top-2 gap is within this many bf16 ulps")
    args = ap.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    import torch
    import triton

    from modeld.execution.artifacts import open_artifact
    from modeld.execution.bindings import reference_kernels, triton_kernels
    from modeld.execution.tokenizer import Tokenizer
    from modeld.models.llama.config import LlamaConfig
    from modeld.models.llama.engine import EngineOptions, LlamaEngine

    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="engine-llama-")
    os.environ.setdefault("MODELD_HOME", os.path.join(work, "home"))
    res = {"bench": "engine_llama", "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "weights": "real (GGUF)" if args.gguf else "synthetic SmolLM2-shaped (seed 0)",
           "versions": {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
                        "gpu": torch.cuda.get_device_name(0) if DEVICE == "cuda" else "none (cpu smoke)", "cuda": torch.version.cuda},
           "profiles": {}}

    def save():
        with open(os.path.join(args.out, "engine_llama.json"), "w") as f:
            json.dump(res, f, indent=1)

    try:
        if args.gguf:
            from modeld.cells.engine_llama import mspec_for_gguf
            from modeld.convert.commands import convert_main

            arts = {"int4": str(mspec_for_gguf(args.gguf))}
            for p in args.profiles.split(","):
                if p in ("bf16", "fp8"):
                    arts[p] = os.path.join(work, f"smollm2-{p}.mspec")
                    assert convert_main([args.gguf, "-o", arts[p], "--profile", p]) == 0
            hf = hf_from_gguf(args.gguf, torch.bfloat16).to(DEVICE).eval()
        else:
            ckpt = synthetic_checkpoint(work, 0)
            arts = {"bf16": ckpt, "int4": ckpt}
            from transformers import AutoModelForCausalLM

            hf = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16).to(DEVICE).eval()
        tok = Tokenizer(open_artifact(arts.get("int4", next(iter(arts.values())))).tokenizer_json)
        prompts_ids = [tok.encode(p, parse_special=True) for p in PROMPTS]
        res["hf"] = {"dtype": "bfloat16", "attn": str(hf.config._attn_implementation),
                     "decode": hf_speed(hf, args.steps, args.context)}
        conts = [greedy_hf(hf, ids, args.tokens)[0] for ids in prompts_ids]   # HF bf16's own greedy text
        base_logits = [hf_logits(hf, ids + c) for ids, c in zip(prompts_ids, conts)]
        print("HF decode", res["hf"]["decode"], flush=True)
        save()
        for profile in [p for p in args.profiles.split(",") if p in arts]:
            art = open_artifact(arts[profile])
            cfg = LlamaConfig.from_hf(art.config, (2,))
            source = Int4Source(art.source) if profile == "int4" and not args.gguf else art.source
            t0 = time.perf_counter()
            eng = LlamaEngine(cfg, source, DEVICE, triton_kernels() if DEVICE == "cuda" else reference_kernels(),
                              EngineOptions(capacity=4096, use_graph=DEVICE == "cuda"))
            row = {"load_s": time.perf_counter() - t0, "weights_profile": eng.weights.profile(),
                   "weights_bytes": eng.weights.nbytes}
            # Kernel parity against HF on this profile's own (dequantized) weights; quality vs HF bf16.
            deq = dequantized_weights(art) if args.gguf and profile != "bf16" else {}
            saved = swap_weights(hf, deq)
            ref_logits = [hf_logits(hf, ids + c) for ids, c in zip(prompts_ids, conts)] if deq else base_logits
            swap_weights(hf, saved)
            row["parity_teacher_forced"] = tf = teacher_forced(eng, ref_logits, base_logits, prompts_ids, conts, args.tie_ulps)
            tf["reference"] = "HF bf16 with this profile's dequantized weights" if deq else "HF bf16 (same weights)"
            if source is not art.source:   # synthetic int4: HF runs the unquantized weights
                tf["note"] = "weights differ (int4 of the synthetic weights): informative only"
            row["free_running_vs_hf_bf16"] = free_running(eng, hf, prompts_ids, args.tokens, args.tie_ulps)
            row["decode"] = engine_speed(eng, args.steps, args.context)
            row["decode"]["speedup_vs_hf"] = row["decode"]["tok_per_s_p50"] / res["hf"]["decode"]["tok_per_s_p50"]
            row["ttft"] = ttft(eng, [int(x) for x in args.ttft.split(",") if x])
            res["profiles"][profile] = row
            print(profile, {k: row[k] for k in ("weights_profile", "decode")}, "parity", {k: tf[k] for k in ("pass", "max_topk_logit_err", "quality_vs_hf_bf16")}, flush=True)
            save()
            del eng
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
        if args.gguf:   # the cell's session API on the GPU: greedy equals the engine's
            from modeld.cells.engine_llama import LlamaCell
            from modeld.serving.contract import SamplingParams

            cell = LlamaCell(args.gguf, model_id="HuggingFaceTB/SmolLM2-135M-Instruct", device=DEVICE, n_ctx=2048)
            s = cell.new_session()
            s.ensure_prefix(prompts_ids[1])   # warm-up turn: the first call compiles the sampling kernels
            list(s.decode(SamplingParams(max_tokens=4, temperature=0.0)))
            s = cell.new_session()
            s.ensure_prefix(prompts_ids[0])
            t0 = time.perf_counter()
            got = [e.token_id for e in s.decode(SamplingParams(max_tokens=args.tokens, temperature=0.0)) if e.token_id is not None]
            dt = time.perf_counter() - t0
            want = greedy_engine(cell.engine, prompts_ids[0], args.tokens)
            res["cell_session"] = {"tokens": len(got), "equal_to_engine": got == want[: len(got)],
                                   "tok_per_s": len(got) / dt, "identity": cell.identity.__dict__}
            save()
    except Exception:
        res["error"] = traceback.format_exc()
        save()
        print(res["error"], file=sys.stderr)
        return 1
    save()
    print(json.dumps({k: v for k, v in res.items() if k != "profiles"}, indent=1)[:2000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
