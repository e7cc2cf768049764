"""Shared fixtures: one well-formed sample .mspec file (every dtype, 0-d, zero-size, int4, fp8, blob)."""

from __future__ import annotations

from pathlib import Path

import pytest

from modeld.mspec import write_mspec
from modeld.mspec.crafting import SAMPLE_IDENTITY, sample_objects


@pytest.fixture(scope="session")
def sample_bytes(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("mspec") / "sample.mspec"
    write_mspec(path, objects=sample_objects(), **SAMPLE_IDENTITY)
    return path.read_bytes()
