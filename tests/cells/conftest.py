"""Reference-cell tests: tiny .mspec artifacts of each engine family, made once per session.

* `qwen_mspec`: `modeld synth --config tiny` (the root `synth_ckpt` fixture) + `modeld convert`.
* `llama_mspec`: a seeded 2-layer HF LlamaForCausalLM with a byte-level tokenizer + `modeld convert`.
* `foreign_mspec`: a well-formed .mspec of family "test" (the mspec crafting sample).
* `corrupt_mspec`: the qwen artifact with its magic broken.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # cells_support (see pitfalls/pytest-helper-modules-...)


@pytest.fixture(scope="session")
def qwen_mspec(synth_ckpt, tmp_path_factory) -> Path:
    from modeld.convert.commands import convert_main

    out = tmp_path_factory.mktemp("cells-qwen") / "tiny-qwen3_5.mspec"
    assert convert_main([synth_ckpt("tiny"), "-o", str(out), "--profile", "bf16"]) == 0
    return out


@pytest.fixture(scope="session")
def llama_mspec(tmp_path_factory) -> Path:
    from cells_support import write_tiny_llama

    from modeld.convert.commands import convert_main

    root = tmp_path_factory.mktemp("cells-llama")
    write_tiny_llama(root / "hf")
    out = root / "tiny-llama.mspec"
    assert convert_main([str(root / "hf"), "-o", str(out), "--profile", "bf16",
                         "--model-id", "test/tiny-llama"]) == 0
    return out


@pytest.fixture(scope="session")
def foreign_mspec(tmp_path_factory) -> Path:
    from modeld.mspec import write_mspec
    from modeld.mspec.crafting import SAMPLE_IDENTITY, sample_objects

    out = tmp_path_factory.mktemp("cells-foreign") / "foreign.mspec"
    write_mspec(out, **SAMPLE_IDENTITY, objects=sample_objects())
    return out


@pytest.fixture(scope="session")
def corrupt_mspec(qwen_mspec, tmp_path_factory) -> Path:
    data = bytearray(qwen_mspec.read_bytes())
    data[3] ^= 0xFF  # inside the 8-byte magic
    out = tmp_path_factory.mktemp("cells-corrupt") / "corrupt.mspec"
    out.write_bytes(bytes(data))
    return out
