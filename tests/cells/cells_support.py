"""Helpers for the reference-cell tests (importable by name; conftest puts this folder on sys.path)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

VENV_BIN = Path(sys.executable).parent
MODELD = str(VENV_BIN / "modeld")
GIB = 1 << 30


def modeld(*args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run the installed `modeld` console script; stdout/stderr as text."""
    return subprocess.run([MODELD, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONWARNINGS": "ignore", **(env or {})})


def write_tiny_llama(out: Path) -> None:
    """A seeded 2-layer llama HF checkpoint (float32) with a 256-symbol byte-level tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-5,
                      rope_theta=10000.0, max_position_embeddings=512, tie_word_embeddings=True)
    LlamaForCausalLM(cfg).float().save_pretrained(out)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.save(str(out / "tokenizer.json"))


def direct_greedy_text(path: Path, prompt: str, max_tokens: int) -> tuple[str, int]:
    """Drive the family's engine directly (reference kernels, CPU, no cell, no session): encode
    `prompt` as the artifact's tokenizer does (plus BOS when the .mspec says add_bos_token),
    prefill, then argmax until an end token or `max_tokens`. Returns (text, completion tokens)."""
    from modeld.execution.artifacts import open_artifact
    from modeld.execution.bindings import reference_kernels
    from modeld.execution.tokenizer import Tokenizer

    art = open_artifact(path)
    meta = art.source.file.directory.metadata.get("tokenizer") or {}
    family = art.source.file.directory.family
    if family == "qwen3_5":
        from modeld.models.qwen3_5.config import Qwen35Config
        from modeld.models.qwen3_5.engine import EngineOptions, Qwen35Engine

        cfg = Qwen35Config.from_hf(art.config)
        eng = Qwen35Engine(cfg, art.source, "cpu", reference_kernels(), EngineOptions(slots=1, capacity=256))
    else:
        from modeld.models.llama.config import LlamaConfig
        from modeld.models.llama.engine import EngineOptions, LlamaEngine

        eos = meta.get("eos_token_id")
        cfg = LlamaConfig.from_hf(art.config, (eos,) if isinstance(eos, int) else ())
        eng = LlamaEngine(cfg, art.source, "cpu", reference_kernels(), EngineOptions(slots=1, capacity=256))
    tok = Tokenizer(art.tokenizer_json)
    bos = getattr(cfg, "bos_id", None)
    ids = ([bos] if meta.get("add_bos_token") and isinstance(bos, int) else []) + tok.encode(prompt)
    logits = eng.prefill(0, ids)
    out: list[int] = []
    for _ in range(max_tokens):
        nxt = int(logits.reshape(-1, cfg.vocab)[-1].argmax())
        if nxt in cfg.eos_ids:
            break
        out.append(nxt)
        logits = eng.decode([nxt])[0]
    return tok.decode(out), len(out)


def host_json(path: Path, gpus: int) -> Path:
    """Write simulated host facts: `gpus` x H200 (sm_90, 141 GiB), or a GPU-less host."""
    from modeld.host.facts import GpuFacts, HostFacts

    cards = tuple(GpuFacts(index=i, name="NVIDIA H200", arch="sm_90", total_memory_bytes=141 * GIB,
                           free_memory_bytes=140 * GIB) for i in range(gpus))
    facts = HostFacts(os="Linux", os_release="6.8", machine="x86_64", python="3.12", cpu_model="Test CPU",
                      cpu_cores=16, ram_total_bytes=128 * GIB, ram_available_bytes=100 * GIB, gpus=cards,
                      driver_version="560.35.03" if gpus else None,
                      cuda_driver_version="12.6" if gpus else None,
                      cuda_runtime_version="12.6" if gpus else None, interconnect="none", sources=("json",))
    path.write_text(facts.to_json())
    return path


def specialized_manifest(cell_id: str, family: str, model_id: str, weights_id: str) -> dict:
    """A specialized engine cell for one exact identity on one sm_90 GPU (rank 100)."""
    return {"id": cell_id, "version": "1", "backend": "engine", "family": family,
            "description": "test: a certified cell for one exact identity",
            "serves": [{"model_id": model_id, "weights_id": weights_id}],
            "artifact_formats": ["mspec"],
            "requirements": {"gpu_archs": ["sm_90"], "gpu_count": 1, "min_total_memory_bytes": GIB},
            "rank": 100, "weight_profile": "bf16", "kv_profile": "bf16", "context_tiers": [],
            "unsupported_modes": []}
