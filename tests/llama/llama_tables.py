"""The SmolLM2 parity and quality tables (KNOWLEDGE/findings/smollm2-parity-and-quality.md).

Functions return frozen rows; the tests run them on small slices and assert bounds; `main`
runs them at full size on CPU and prints markdown:

    .venv/bin/python tests/llama/llama_tables.py --quality-tokens 2048 --agree-tokens 32

quality: the eval text (tests/data/eval_text.txt) cut into windows scored from an empty state
(position t predicts t+1): perplexity, top-1 against the text, argmax agreement with HF float32
and HF bf16 (same dequantized weights), for each engine profile and for HF bf16 itself.
llama.cpp agreement: greedy tokens of the engine (int4, lossless Q4_1) vs the llama.cpp cell on
the same GGUF; the first position where they differ (llama.cpp quantizes activations to q8_1 for
its Q4_1 dot products, so exact equality is not expected).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))

EVAL = Path(__file__).resolve().parents[1] / "data" / "eval_text.txt"


@dataclass(frozen=True)
class QualityRow:
    model: str               # "engine bf16" | "engine int4" | "engine fp8" | "HF bf16" | "HF float32"
    predictions: int
    ppl: float
    top1: float              # argmax == the text's next token
    agree_fp32: float        # argmax == HF float32's argmax
    agree_bf16: float        # argmax == HF bf16's argmax
    max_logit_diff_fp32: float


def _nll_top1(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lg = logits.double()
    nll = torch.logsumexp(lg, -1) - lg[torch.arange(len(targets)), targets]
    return nll, lg.argmax(-1) == targets


def hf_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()


def quality_rows(engines: dict, hf32, hf16, ids: list[int], window: int) -> list[QualityRow]:
    """Score every window with every model; engines: {label: LlamaEngine}."""
    acc: dict[str, dict[str, list]] = {}
    for s in range(0, len(ids) - 1, window):
        chunk = ids[s : s + window]
        if len(chunk) < 2:
            continue
        targets = torch.tensor(chunk[1:])
        ref32, ref16 = hf_logits(hf32, chunk)[:-1], hf_logits(hf16, chunk)[:-1]
        outs = {"HF float32": ref32, "HF bf16": ref16}
        for label, eng in engines.items():
            eng.reset_slot(0)
            outs[label] = eng.prefill(0, chunk, all_logits=True)[:-1]
            eng.reset_slot(0)
        for label, lg in outs.items():
            nll, hit = _nll_top1(lg, targets)
            a = acc.setdefault(label, {"nll": [], "hit": [], "a32": [], "a16": [], "diff": []})
            a["nll"].append(nll)
            a["hit"].append(hit)
            a["a32"].append(lg.argmax(-1) == ref32.argmax(-1))
            a["a16"].append(lg.argmax(-1) == ref16.argmax(-1))
            a["diff"].append(float((lg - ref32).abs().max()))
    rows = []
    for label, a in acc.items():
        nll = torch.cat(a["nll"])
        rows.append(QualityRow(label, int(nll.numel()), math.exp(float(nll.mean())),
                               float(torch.cat(a["hit"]).float().mean()), float(torch.cat(a["a32"]).float().mean()),
                               float(torch.cat(a["a16"]).float().mean()), max(a["diff"])))
    return rows


@dataclass(frozen=True)
class AgreementRow:
    prompt: str
    prompt_tokens: int
    same_prompt_ids: bool      # both tokenizers produced the same ids
    engine: tuple[int, ...]
    llama_cpp: tuple[int, ...]
    first_divergence: int | None   # None: identical over the shorter run


def greedy_session(cell, ids: list[int], n: int) -> tuple[int, ...]:
    from modeld.serving.contract import SamplingParams

    s = cell.new_session()
    try:
        s.ensure_prefix(ids)
        return tuple(e.token_id for e in s.decode(SamplingParams(max_tokens=n, temperature=0.0)) if e.token_id is not None)
    finally:
        s.close()


def agreement_rows(engine_cell, cpp_cell, prompts, n: int) -> list[AgreementRow]:
    rows = []
    for text in prompts:
        ids = engine_cell._tokenize(text, True, True)
        cpp_ids = cpp_cell._tokenize(text, True, True)
        a, b = greedy_session(engine_cell, ids, n), greedy_session(cpp_cell, ids, n)
        first = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if first is None and len(a) != len(b):
            first = min(len(a), len(b))
        rows.append(AgreementRow(text, len(ids), list(cpp_ids) == ids, a, b, first))
    return rows


@dataclass(frozen=True)
class ParityRow:
    profile: str
    oracle_mode: str            # "bf16-emulating" or "float32"
    isolated_max_rel: float     # worst layer, each layer fed the oracle's input
    isolated_worst_layer: int
    e2e_logits_rel: float
    e2e_argmax_agree: float
    greedy_vs_hf32: str         # per prompt: first divergence (HF fp32 margin there) or "=" (identical)
    greedy_vs_hf16: str


def parity_rows(engines: dict, hf_dir: Path, hf16, prompt: list[int], greedy_prompts: list[list[int]],
                fixture: dict, n: int) -> list[ParityRow]:
    import oracle.llama

    from llama_parity import engine_layers, layer_errors, oracle_capture
    from llama_support import compare_greedy, engine_greedy, hf_greedy

    caps = {emu: oracle_capture(oracle.llama.load(str(hf_dir), emulate_bf16=emu), prompt) for emu in (True, False)}
    refs16 = [hf_greedy(hf16, ids, n) for ids in greedy_prompts]

    def fmt(r):
        return "=" if r.first_divergence is None else f"{r.first_divergence} ({r.margin_at_divergence:.3f})"

    rows = []
    for profile, eng in engines.items():
        emu = profile == "bf16"
        cap = caps[emu]
        errs = layer_errors(engine_layers(eng, prompt, cap)[0], cap)
        worst = max(errs, key=lambda e: e.rel)
        _outs, logits = engine_layers(eng, prompt, None)
        ref = cap["logits"]
        g32 = []
        for case in fixture["cases"]:
            mine, _ = engine_greedy(eng, case["prompt_ids"], len(case["tokens"]))
            lg = [torch.tensor(sorted(st["topk_logits"], reverse=True)) for st in case["steps"]]
            g32.append(fmt(compare_greedy(mine, case["tokens"], lg)))
        g16 = [fmt(compare_greedy(engine_greedy(eng, ids, n)[0], r, rl)) for ids, (r, rl) in zip(greedy_prompts, refs16)]
        rows.append(ParityRow(profile, "bf16-emulating" if emu else "float32", worst.rel, worst.layer,
                              float(np.abs(logits.numpy() - ref).max() / np.abs(ref).max()),
                              float((logits.numpy().argmax(-1) == ref.argmax(-1)).mean()), ", ".join(g32), ", ".join(g16)))
    return rows


# ------------------------------------------------------------------------------------- main
def _md(rows, cols) -> str:
    out = ["| " + " | ".join(c for c, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(f(r) for _, f in cols) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Print the SmolLM2 quality and llama.cpp agreement tables (CPU).")
    ap.add_argument("--quality-tokens", type=int, default=2048, help="score the first N tokens of the eval text")
    ap.add_argument("--window", type=int, default=512, help="tokens per independently scored window")
    ap.add_argument("--agree-tokens", type=int, default=32, help="greedy tokens per prompt for the llama.cpp table")
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument("--skip-parity", action="store_true")
    ap.add_argument("--skip-agreement", action="store_true")
    args = ap.parse_args(argv)
    from transformers import AutoModelForCausalLM

    from llama_kernels import cached_reference_kernels
    from llama_support import PROMPTS, make_engine
    from modeld.cells.engine_llama import LlamaCell, mspec_for_gguf
    from modeld.convert.commands import convert_main
    from modeld.distribution.identity import gguf_weights_id
    from modeld.qualify.smollm2 import MODEL_ID, gguf_path, hf_checkpoint

    gguf, hf_dir = Path(gguf_path()), Path(hf_checkpoint())
    wid = gguf_weights_id(gguf)
    int4 = mspec_for_gguf(gguf, wid)
    fp8 = int4.with_name("smollm2-fp8.mspec")
    if not fp8.exists():
        assert convert_main([str(gguf), "-o", str(fp8), "--profile", "fp8"]) == 0
    if not args.skip_parity:
        from llama_support import PROMPTS as P
        from modeld.execution.artifacts import open_artifact
        from modeld.execution.tokenizer import Tokenizer
        from modeld.qualify.fixtures import load_fixture

        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        tok = Tokenizer(open_artifact(int4).tokenizer_json)
        prompt = tok.encode(EVAL.read_text(encoding="utf-8")[:400])[:40]
        engines = {p: make_engine(path, cached_reference_kernels()) for p, path in (("bf16", hf_dir), ("int4", int4), ("fp8", fp8))}
        hf16 = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.bfloat16, attn_implementation="eager").eval()
        fx = load_fixture(str(Path(__file__).resolve().parents[1] / "fixtures" / "greedy_smollm2.json"))
        rows = parity_rows(engines, hf_dir, hf16, prompt, [tok.encode(t, parse_special=True) for t in P], fx, 16)
        print(f"\nparity: per-layer vs oracle on {len(prompt)} tokens; greedy first divergence (HF margin there)\n")
        print(_md(rows, [("profile", lambda r: r.profile), ("oracle", lambda r: r.oracle_mode),
                         ("isolated max rel (layer)", lambda r: f"{r.isolated_max_rel:.4f} ({r.isolated_worst_layer})"),
                         ("e2e logits rel", lambda r: f"{r.e2e_logits_rel:.4f}"),
                         ("e2e argmax agree", lambda r: f"{r.e2e_argmax_agree:.3f}"),
                         ("greedy vs HF fp32 (3 fixture prompts x16)", lambda r: r.greedy_vs_hf32),
                         ("greedy vs HF bf16 (6 prompts x16)", lambda r: r.greedy_vs_hf16)]))
        del engines
    if not args.skip_quality:
        from modeld.execution.tokenizer import Tokenizer
        from modeld.execution.artifacts import open_artifact

        ids = Tokenizer(open_artifact(int4).tokenizer_json).encode(EVAL.read_text(encoding="utf-8"))[: args.quality_tokens]
        engines = {f"engine {p}": make_engine(path, cached_reference_kernels())
                   for p, path in (("bf16", hf_dir), ("int4", int4), ("fp8", fp8))}
        hf32 = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
        hf16 = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.bfloat16, attn_implementation="eager").eval()
        rows = quality_rows(engines, hf32, hf16, ids, args.window)
        print(f"\nquality: {len(ids)} tokens, windows of {args.window}\n")
        print(_md(rows, [("model", lambda r: r.model), ("predictions", lambda r: str(r.predictions)),
                         ("perplexity", lambda r: f"{r.ppl:.4f}"), ("top-1 vs text", lambda r: f"{r.top1:.4f}"),
                         ("argmax = HF fp32", lambda r: f"{r.agree_fp32:.4f}"),
                         ("argmax = HF bf16", lambda r: f"{r.agree_bf16:.4f}"),
                         ("max |logit - HF fp32|", lambda r: f"{r.max_logit_diff_fp32:.3f}")]))
        del engines
    if not args.skip_agreement:
        from modeld.cells.llama_cpp import LlamaCppCell

        cell = LlamaCell(gguf, model_id=MODEL_ID, weights_id=wid, device="cpu", n_ctx=512,
                         kernels=cached_reference_kernels())
        cpp = LlamaCppCell(gguf, model_id=MODEL_ID, weights_id=wid, n_ctx=512)
        rows = agreement_rows(cell, cpp, PROMPTS, args.agree_tokens)
        print(f"\nllama.cpp agreement: {args.agree_tokens} greedy tokens per prompt\n")
        print(_md(rows, [("prompt", lambda r: repr(r.prompt)[:48]), ("prompt ids equal", lambda r: str(r.same_prompt_ids)),
                         ("first divergence", lambda r: "none" if r.first_divergence is None else str(r.first_divergence)),
                         ("tokens (engine / llama.cpp)", lambda r: f"{len(r.engine)} / {len(r.llama_cpp)}")]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
