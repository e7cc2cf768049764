"""Fixtures for the T3 distribution tests (helpers live in t3_support.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from t3_support import write_gguf


@pytest.fixture(scope="session")
def warm_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache/ folder holding the embedded SmolLM2's weights id and GGUF metadata.

    Parsing that 98 MB GGUF costs ~2.5 s; computing it once per session keeps the suite fast.
    The cache-miss path itself is tested on tiny GGUF files.
    """
    from modeld.distribution.artifacts import read_gguf_metadata
    from modeld.distribution.identity import gguf_weights_id
    from modeld.distribution.registry import smollm2_gguf_path

    session_home = tmp_path_factory.mktemp("warm-home")
    path = smollm2_gguf_path()
    if path is not None:
        read_gguf_metadata(path, session_home)
        gguf_weights_id(path, home=session_home)
    return session_home / "cache"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warm_cache: Path) -> Path:
    """A fresh MODELD_HOME for every test (autouse: no test may touch the real user cache),
    seeded with the session's warm SmolLM2 cache entries."""
    path = tmp_path / "modeld-home"
    path.mkdir()
    if warm_cache.is_dir():
        shutil.copytree(warm_cache, path / "cache")
    monkeypatch.setenv("MODELD_HOME", str(path))
    return path


@pytest.fixture
def gguf_file(tmp_path: Path) -> Path:
    return write_gguf(tmp_path / "tiny.gguf")
