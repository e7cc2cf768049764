"""Shared fixtures: synthetic checkpoints written once per test session (tiny: ~2 MB, ~1 s)."""

from __future__ import annotations

from pathlib import Path

import pytest

from modeld.convert.qwen3_5_spec import preset
from modeld.convert.synth import write_synthetic


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "tiny"
    write_synthetic(preset("tiny"), 7, out, workers=2)
    return out


@pytest.fixture(scope="session")
def odd_ckpt(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "odd"
    write_synthetic(preset("odd"), 3, out, workers=1)
    return out
