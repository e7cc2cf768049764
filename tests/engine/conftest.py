"""Engine tests: synthetic qwen3_5 checkpoints (written once per session) and HF controls."""

from __future__ import annotations

import sys
from pathlib import Path

import os

import torch

if not torch.cuda.is_available():  # Triton kernels run in the CPU interpreter (set before triton loads)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # hf_control, kernel shims

from modeld.convert.qwen3_5_spec import preset  # noqa: E402
from modeld.convert.synth import write_synthetic  # noqa: E402


@pytest.fixture(scope="session")
def ckpt_dir(tmp_path_factory):
    """Factory: preset name -> synthetic HF checkpoint directory (seed 0), written once."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            d = tmp_path_factory.mktemp("ckpt") / name
            write_synthetic(preset(name), 0, d, workers=2)
            made[name] = d
        return made[name]

    return get


@pytest.fixture(scope="session")
def hf_model(ckpt_dir):
    """Factory: (preset, dtype) -> HF control model, loaded once."""
    from engine_hf_control import load_hf

    cache = {}

    def get(name: str, dtype: torch.dtype = torch.bfloat16):
        key = (name, dtype)
        if key not in cache:
            cache[key] = load_hf(ckpt_dir(name), dtype)
        return cache[key]

    return get


@pytest.fixture(scope="session")
def mspec_file(ckpt_dir, tmp_path_factory):
    """Factory: (preset name, profile, lm_head) -> the synthetic checkpoint converted to a .mspec (once)."""
    from modeld.convert.commands import convert_main

    made: dict[tuple[str, str, str], Path] = {}

    def get(name: str, profile: str = "bf16", lm_head: str = "bf16") -> Path:
        key = (name, profile, lm_head)
        if key not in made:
            out = tmp_path_factory.mktemp("mspec") / f"{name}-{profile}-head-{lm_head}.mspec"
            argv = [str(ckpt_dir(name)), "-o", str(out), "--profile", profile]
            assert convert_main(argv + (["--lm-head", lm_head] if lm_head != "bf16" else [])) == 0
            made[key] = out
        return made[key]

    return get
