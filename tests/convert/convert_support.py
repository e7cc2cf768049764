"""Helpers shared by the tests/convert test modules (a uniquely named module, not conftest:
KNOWLEDGE/pitfalls/pytest-helper-modules-shadowed-by-root-conftest.md)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from safetensors import safe_open


def checkpoint_tensors(ckpt: Path) -> dict[str, torch.Tensor]:
    """Every tensor of an HF checkpoint directory, by name."""
    out = {}
    for shard in sorted(ckpt.glob("model-*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            for name in f.keys():
                out[name] = f.get_tensor(name)
    return out


def checkpoint_digest(ckpt: Path) -> str:
    """sha256 over every file of a directory (names and bytes)."""
    h = hashlib.sha256()
    for path in sorted(ckpt.iterdir()):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()
