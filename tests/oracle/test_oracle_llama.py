"""oracle.llama against HF LlamaForCausalLM on a small seeded model (SmolLM2 itself: tests/qualify)."""

from __future__ import annotations

import numpy as np
import pytest

import oracle.llama as ol
from oracle._common import CheckpointError


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=72, intermediate_size=120, num_hidden_layers=3, vocab_size=211,
                      num_attention_heads=6, num_key_value_heads=2, head_dim=12, rms_norm_eps=1e-5,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5 * (3.0 if "embed" in name else 1.0))
    d = tmp_path_factory.mktemp("llama")
    model.save_pretrained(d)
    return str(d)


def test_matches_hf_float32_and_decodes_incrementally(llama_dir):
    import torch
    from transformers import LlamaForCausalLM

    m = ol.load(llama_dir)
    ids = np.random.default_rng(0).integers(0, 211, 30).tolist()
    hf = LlamaForCausalLM.from_pretrained(llama_dir, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].numpy()
    ours = m.forward(ids)
    assert np.max(np.abs(ours - ref)) < 1e-4 * np.max(np.abs(ref))
    m64 = ol.load(llama_dir, dtype=np.float64)
    full = m64.forward(ids)
    state = ol.State()
    rows = [m64.forward(ids[:20], state)] + [m64.forward([t], state) for t in ids[20:]]
    assert np.max(np.abs(np.concatenate(rows) - full)) < 1e-9 * np.max(np.abs(full))
    with torch.no_grad():
        g = hf.generate(torch.tensor([ids[:4]]), max_new_tokens=8, do_sample=False, eos_token_id=None,
                        pad_token_id=0)[0, 4:].tolist()
    assert m.generate(ids[:4], 8) == g


def test_bf16_emulation_tracks_hf_bf16(llama_dir):
    import torch
    from transformers import LlamaForCausalLM

    ids = np.random.default_rng(1).integers(0, 211, 20).tolist()
    hf = LlamaForCausalLM.from_pretrained(llama_dir, dtype=torch.bfloat16, attn_implementation="eager").eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float().numpy()
    emu = ol.load(llama_dir, emulate_bf16=True).forward(ids)
    plain = ol.load(llama_dir).forward(ids)
    err_emu, err_plain = np.max(np.abs(emu - ref)), np.max(np.abs(plain - ref))
    assert err_emu < 2e-2 * np.max(np.abs(ref))
    assert err_emu < err_plain                   # emulating the roundings gets closer to HF bf16


def test_strict_loading(llama_dir, tmp_path):
    import shutil

    from safetensors.numpy import load_file, save_file
    d = tmp_path / "bad"
    shutil.copytree(llama_dir, d)
    t = load_file(str(d / "model.safetensors"))
    t.pop("model.layers.1.mlp.up_proj.weight")
    save_file(t, str(d / "model.safetensors"))
    with pytest.raises(CheckpointError):
        ol.load(str(d))
