"""Helpers shared by the engine tests (importable by name; conftest puts this folder on sys.path)."""

from __future__ import annotations

from pathlib import Path

import torch

from modeld.execution.sources import SafetensorsDirSource
from modeld.models.qwen3_5.config import Qwen35Config
from modeld.models.qwen3_5.engine import EngineOptions, Qwen35Engine


def make_engine(ckpt: Path, kernels=None, **opts) -> Qwen35Engine:
    cfg = Qwen35Config.from_file(ckpt / "config.json")
    options = EngineOptions(**{"capacity": 512, **opts})
    return Qwen35Engine(cfg, SafetensorsDirSource(ckpt), "cpu", kernels=kernels, options=options)


def random_prompt(vocab: int, n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()
