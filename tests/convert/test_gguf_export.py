"""`modeld export-gguf`: a qwen3_5 checkpoint written as llama.cpp's qwen35 GGUF. The proof is llama.cpp itself
(llama-cpp-python, CPU): its logits for a random token sequence against Hugging Face transformers' on the same
checkpoint, on the `small` preset, whose 4 key / 12 value linear-attention heads exercise the value-head reorder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from modeld.convert import gguf_export as ge

ROOT = Path(__file__).resolve().parents[2]


def _hf_logits(folder: str, ids: list[int]) -> np.ndarray:
    from transformers import AutoConfig, Qwen3_5ForCausalLM

    config = AutoConfig.from_pretrained(folder).text_config
    model = Qwen3_5ForCausalLM.from_pretrained(folder, config=config, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float().numpy()


def _llama_logits(gguf_path: Path, ids: list[int]) -> np.ndarray:
    import llama_cpp

    llm = llama_cpp.Llama(str(gguf_path), n_ctx=128, n_batch=128, logits_all=True, verbose=False, n_threads=2)
    try:
        llm.eval(ids)
        return np.array(llm.scores[: len(ids)])
    finally:
        llm.close()


@pytest.fixture(scope="module")
def small_case(synth_ckpt):
    folder = synth_ckpt("small", 0)
    ids = np.random.default_rng(5).integers(0, 3900, 40).tolist()
    return folder, ids, _hf_logits(folder, ids)


def test_llama_cpp_reads_the_export_like_transformers(small_case, tmp_path):
    """f32 export: llama.cpp's logits within 1e-2 of transformers' at every position (measured 0.0019 on logits
    up to ~16), the same argmax everywhere."""
    folder, ids, ref = small_case
    out = tmp_path / "small.gguf"
    summary = ge.export(ge.open_checkpoint(folder), out, "f32")
    assert summary["tensors"] == 109 and summary["vocab"] == 4096 and out.exists()
    got = _llama_logits(out, ids)
    assert np.abs(got - ref).max() < 1e-2
    assert (got.argmax(1) == ref.argmax(1)).all()


def test_without_the_value_head_reorder_llama_cpp_disagrees(small_case, tmp_path, monkeypatch):
    """The reorder is load-bearing: exporting the value heads in Hugging Face's grouped order moves the logits by
    far more than the tolerance above."""
    folder, ids, ref = small_case
    monkeypatch.setattr(ge, "tiled_value_heads", lambda t, *a: t)
    out = tmp_path / "grouped.gguf"
    ge.export(ge.open_checkpoint(folder), out, "f32")
    assert np.abs(_llama_logits(out, ids) - ref).max() > 0.5


def test_bf16_export_stores_matrices_in_bf16(small_case, tmp_path):
    """bf16: every matrix BF16, the 1-D tensors and the conv kernel F32; llama.cpp then also rounds activations, so
    the logits stay near (not at) transformers'."""
    import gguf

    folder, ids, ref = small_case
    out = tmp_path / "small-bf16.gguf"
    ge.export(ge.open_checkpoint(folder), out, "bf16")
    reader = gguf.GGUFReader(str(out))
    types = {t.name: t.tensor_type for t in reader.tensors}
    assert types["blk.0.attn_qkv.weight"] == gguf.GGMLQuantizationType.BF16
    assert types["token_embd.weight"] == gguf.GGMLQuantizationType.BF16
    assert types["blk.0.ssm_conv1d.weight"] == gguf.GGMLQuantizationType.F32
    assert types["blk.0.ssm_a"] == types["output_norm.weight"] == gguf.GGMLQuantizationType.F32
    got = _llama_logits(out, ids)
    assert np.abs(got - ref).max() < 1.0 and (got.argmax(1) == ref.argmax(1)).mean() > 0.9


def test_tiled_value_heads_order():
    """Grouped [k0v0, k0v1, k0v2, k1v0, k1v1, k1v2] → tiled [k0v0, k1v0, k0v1, k1v1, k0v2, k1v2], per head of 2."""
    grouped = torch.arange(12).reshape(12, 1)   # 2 key heads × 3 value heads each × 2 elements
    tiled = ge.tiled_value_heads(grouped, 0, 2, 3, 2).flatten().tolist()
    assert tiled == [0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11]
    cols = ge.tiled_value_heads(grouped.T, 1, 2, 3, 2).flatten().tolist()   # the same along columns
    assert cols == tiled


def test_shapes_llama_cpp_cannot_load_are_refused(synth_ckpt, tmp_path):
    """The odd preset's key / value head dims differ (16 / 24): llama.cpp's qwen35 would reject the file."""
    with pytest.raises(ge.GGUFExportError, match="linear_value_head_dim"):
        ge.export(ge.open_checkpoint(synth_ckpt("odd", 0)), tmp_path / "odd.gguf", "f32")
    assert not list(tmp_path.iterdir())


def test_bad_inputs(synth_ckpt, tmp_path):
    with pytest.raises(ge.GGUFExportError, match="no config.json"):
        ge.open_checkpoint(tmp_path)
    ckpt = ge.open_checkpoint(synth_ckpt("tiny", 0))
    with pytest.raises(ge.GGUFExportError, match="outtype"):
        ge.export(ckpt, tmp_path / "x.gguf", "q4_0")
    existing = tmp_path / "exists.gguf"
    existing.write_bytes(b"keep")
    with pytest.raises(ge.GGUFExportError, match="--force"):
        ge.export(ckpt, existing)
    assert existing.read_bytes() == b"keep"
    other = tmp_path / "llama"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ge.GGUFExportError, match="not a qwen3_5"):
        ge.export(ge.open_checkpoint(other), tmp_path / "y.gguf")


def test_synth_export_equals_the_written_checkpoints(synth_ckpt, tmp_path):
    """--synth generates the tensors `modeld synth` writes: the same GGUF bytes without the checkpoint on disk."""
    ge.export(ge.open_checkpoint(synth_ckpt("tiny", 0)), tmp_path / "disk.gguf", "bf16")
    with ge.synth_checkpoint("tiny", 0, workers=2) as virtual:
        ge.export(virtual, tmp_path / "synth.gguf", "bf16")
    assert (tmp_path / "disk.gguf").read_bytes() == (tmp_path / "synth.gguf").read_bytes()


def test_cli_writes_the_file_and_a_summary(synth_ckpt, tmp_path):
    out = tmp_path / "tiny.gguf"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    r = subprocess.run([sys.executable, "-m", "modeld", "export-gguf", synth_ckpt("tiny", 0), "-o", str(out)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["path"] == str(out) and summary["outtype"] == "bf16" and out.stat().st_size == summary["bytes"]
    again = subprocess.run([sys.executable, "-m", "modeld", "export-gguf", synth_ckpt("tiny", 0), "-o", str(out)],
                           capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 2 and "--force" in again.stderr
