"""Session fixtures for the llama engine tests: SmolLM2-135M-Instruct with its real weights.

Made once per session: the HF-layout float32 checkpoint dequantized from the embedded GGUF
(`modeld.qualify.smollm2.hf_checkpoint`, shared with the qualify tests through $MODELD_HOME),
the lossless int4 .mspec (the cell's own GGUF import, `mspec_for_gguf`) and an fp8 .mspec
(`modeld convert --profile fp8`). The bf16 profile is the HF directory itself: the engine casts
its float32 tensors to bf16 exactly as `modeld convert --profile bf16` and HF's bf16 load do.
Engines run the reference kernels with dequantise-once caching (llama_kernels.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():  # Triton kernels run in the CPU interpreter (set before triton loads)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))

from llama_kernels import cached_reference_kernels  # noqa: E402


@pytest.fixture(scope="session")
def hf_dir(smollm2_gguf) -> Path:
    from modeld.qualify.smollm2 import hf_checkpoint

    return Path(hf_checkpoint())


@pytest.fixture(scope="session")
def gguf_id(smollm2_gguf) -> str:
    from modeld.distribution.identity import gguf_weights_id

    return gguf_weights_id(smollm2_gguf)


@pytest.fixture(scope="session")
def int4_mspec(smollm2_gguf, gguf_id) -> Path:
    from modeld.cells.engine_llama import mspec_for_gguf

    return mspec_for_gguf(smollm2_gguf, gguf_id)


@pytest.fixture(scope="session")
def fp8_mspec(smollm2_gguf, tmp_path_factory) -> Path:
    from modeld.convert.commands import convert_main

    out = tmp_path_factory.mktemp("fp8") / "smollm2-fp8.mspec"
    assert convert_main([str(smollm2_gguf), "-o", str(out), "--profile", "fp8"]) == 0
    return out


@pytest.fixture(scope="session")
def artifact_path(request):
    """Factory: profile -> the artifact path of that profile (each made only when first asked)."""
    fixture = {"bf16": "hf_dir", "int4": "int4_mspec", "fp8": "fp8_mspec"}

    def get(profile: str) -> Path:
        return request.getfixturevalue(fixture[profile])

    return get


@pytest.fixture(scope="session")
def engine(artifact_path):
    """Factory: profile ("bf16" | "int4" | "fp8") -> LlamaEngine on CPU (cached per profile)."""
    from llama_support import make_engine

    made = {}

    def get(profile: str):
        if profile not in made:
            made[profile] = make_engine(artifact_path(profile), cached_reference_kernels())
        return made[profile]

    return get


@pytest.fixture(scope="session")
def hf_model(hf_dir):
    """Factory: torch dtype -> HF LlamaForCausalLM (eager attention) on the same weights."""
    from transformers import AutoModelForCausalLM

    made = {}

    def get(dtype: torch.dtype = torch.bfloat16):
        if dtype not in made:
            made[dtype] = AutoModelForCausalLM.from_pretrained(
                hf_dir, dtype=dtype, attn_implementation="eager").eval()
        return made[dtype]

    return get


@pytest.fixture(scope="session")
def tokenizer(int4_mspec):
    from modeld.execution.artifacts import open_artifact
    from modeld.execution.tokenizer import Tokenizer

    return Tokenizer(open_artifact(int4_mspec).tokenizer_json)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    """Factory: profile -> a tiny seeded llama artifact (HF directory for bf16, converted .mspec
    for int4 g128 / fp8), for kernel-binding tests where SmolLM2 would be too slow."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from modeld.convert.commands import convert_main

    root = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5,
                      rope_theta=10000.0, max_position_embeddings=512, tie_word_embeddings=True)
    LlamaForCausalLM(cfg).float().save_pretrained(root / "hf")
    byte_level_tokenizer().save(str(root / "hf" / "tokenizer.json"))
    made = {"bf16": root / "hf"}

    def get(profile: str) -> Path:
        if profile not in made:
            out = root / f"{profile}.mspec"
            assert convert_main([str(root / "hf"), "-o", str(out), "--profile", profile,
                                 "--model-id", "test/tiny-llama"]) == 0
            made[profile] = out
        return made[profile]

    return get


def byte_level_tokenizer():
    """A 256-token byte-level BPE tokenizer without merges (ids = the 256 byte symbols)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    return tok
