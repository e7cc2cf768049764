"""Helpers shared by the llama tests (importable by name; conftest puts this folder on sys.path)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from modeld.execution.artifacts import open_artifact
from modeld.models.llama.config import LlamaConfig
from modeld.models.llama.engine import EngineOptions, LlamaEngine

# A prompt set of plain text and chat-formatted prompts (SmolLM2-Instruct's template), short
# enough for CPU runs. Used for greedy parity and the llama.cpp agreement table.
PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n",
    "Water boils at a temperature of",
    "<|im_start|>user\nName three colors.<|im_end|>\n<|im_start|>assistant\n",
    "import numpy as np\n\nx = np.",
)


def make_engine(path: Path, kernels, capacity: int = 1024) -> LlamaEngine:
    art = open_artifact(path)
    cfg = LlamaConfig.from_hf(art.config, (2,))
    return LlamaEngine(cfg, art.source, "cpu", kernels=kernels, options=EngineOptions(capacity=capacity))


def engine_greedy(eng: LlamaEngine, prompt: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    """Free-running greedy from an empty slot 0: (tokens, logits before each token)."""
    eng.reset_slot(0)
    logit = eng.prefill(0, prompt).clone()
    toks, logits = [], []
    for _ in range(n):
        logits.append(logit)
        toks.append(int(logit.argmax()))
        logit = eng.decode([toks[-1]])[0].clone()
    return toks, logits


def hf_greedy(model, prompt: list[int], n: int) -> tuple[list[int], list[torch.Tensor]]:
    """HF greedy with its KV cache: (tokens, fp32 logits before each token)."""
    toks, logits = [], []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        for _ in range(n):
            lg = out.logits[0, -1].float()
            logits.append(lg)
            toks.append(int(lg.argmax()))
            out = model(input_ids=torch.tensor([[toks[-1]]]), past_key_values=out.past_key_values, use_cache=True)
    return toks, logits


@dataclass(frozen=True)
class GreedyCompare:
    steps: int
    first_divergence: int | None      # first step where the tokens differ (None: identical)
    margin_at_divergence: float | None  # the reference's top-1 minus top-2 logit there


def compare_greedy(mine: list[int], ref: list[int], ref_logits: list[torch.Tensor]) -> GreedyCompare:
    for j, (a, b) in enumerate(zip(mine, ref)):
        if a != b:
            top = ref_logits[j].topk(2).values
            return GreedyCompare(len(ref), j, float(top[0] - top[1]))
    return GreedyCompare(len(ref), None, None)
