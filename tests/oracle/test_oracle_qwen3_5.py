"""oracle.qwen3_5: loading (both layouts, strictness), state, capture/inject, precision modes."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import oracle.qwen3_5 as oq
from oracle._common import CheckpointError, OracleError


def _ids(model, n, seed=0):
    return np.random.default_rng(seed).integers(0, model.config.vocab, n).tolist()


def test_loads_both_layouts(hf_qwen_ckpt, synth_ckpt):
    a = oq.load(hf_qwen_ckpt("a"))
    assert a.prefix == "model." and a.config.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    t = oq.load(synth_ckpt("tiny"))
    assert t.prefix == "model.language_model." and t.config.rotary_dim == 8
    for m in (a, t):
        logits = m.forward(_ids(m, 5))
        assert logits.shape == (5, m.config.vocab) and np.all(np.isfinite(logits))


def test_tied_embeddings_reuse_the_embedding(hf_qwen_ckpt):
    m = oq.load(hf_qwen_ckpt("c"))
    assert m.w["lm_head.weight"] is m.w["model.embed_tokens.weight"]


def _rewrite(src, dst, edit):
    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"))
    return str(dst)


@pytest.mark.parametrize("edit", ["missing", "extra", "shape"])
def test_loading_is_strict(hf_qwen_ckpt, tmp_path, edit):
    name = "model.layers.0.linear_attn.A_log"
    fn = {"missing": lambda t: t.pop(name),
          "extra": lambda t: t.__setitem__("model.layers.0.surprise", np.zeros(3, np.float32)),
          "shape": lambda t: t.__setitem__(name, np.zeros(5, np.float32))}[edit]
    from pathlib import Path
    bad = _rewrite(Path(hf_qwen_ckpt("a")), tmp_path / "bad", fn)
    with pytest.raises(CheckpointError):
        oq.load(bad)


def test_mtp_and_visual_tensors_are_ignored(hf_qwen_ckpt, tmp_path):
    from pathlib import Path
    d = _rewrite(Path(hf_qwen_ckpt("a")), tmp_path / "mtp", lambda t: t.update(
        {"mtp.fc.weight": np.zeros((2, 2), np.float32), "model.visual.x": np.zeros(2, np.float32)}))
    oq.load(d)


def test_bad_arguments_raise(hf_qwen_ckpt, tmp_path):
    d = hf_qwen_ckpt("a")
    with pytest.raises(OracleError):
        oq.load(d, dtype=np.float64, emulate_bf16=True)
    with pytest.raises(OracleError):
        oq.load(d, dtype=np.float16)
    with pytest.raises(OracleError):
        oq.load(d, gdn_form="fast")
    m = oq.load(d)
    for ids in ([], [m.config.vocab], [-1]):
        with pytest.raises(OracleError):
            m.forward(ids)
    with pytest.raises(OracleError):
        m.forward([1, 2], inject={1: np.zeros((3, m.config.hidden))})
    with pytest.raises(CheckpointError):
        oq.load(str(tmp_path / "absent"))
    cfg = json.load(open(f"{d}/config.json"))
    cfg["rope_parameters"]["rope_type"] = "yarn"
    (tmp_path / "yarn").mkdir()
    json.dump(cfg, open(tmp_path / "yarn" / "config.json", "w"))
    with pytest.raises(OracleError):
        oq.Config.from_hf(cfg)


@pytest.mark.parametrize("config", ["a", "b"])
def test_incremental_decode_equals_full_forward(hf_qwen_ckpt, config):
    """Prefill 67 tokens (crosses a chunk), then 1 token at a time: every row equals the full pass."""
    m = oq.load(hf_qwen_ckpt(config), dtype=np.float64)
    ids = _ids(m, 72, seed=3)
    full = m.forward(ids)
    state = m.new_state()
    rows = [m.forward(ids[:67], state)]
    for t in ids[67:]:
        rows.append(m.forward([t], state))
    assert state.pos == 72
    assert np.max(np.abs(np.concatenate(rows) - full)) < 1e-9 * np.max(np.abs(full))


def test_recurrent_and_chunked_models_agree(hf_qwen_ckpt):
    d = hf_qwen_ckpt("b")
    ids = _ids(oq.load(d), 70, seed=4)
    a = oq.load(d, dtype=np.float64, gdn_form="chunked").forward(ids)
    b = oq.load(d, dtype=np.float64, gdn_form="recurrent").forward(ids)
    assert np.max(np.abs(a - b)) < 1e-9 * np.max(np.abs(a))


def test_float32_tracks_float64(hf_qwen_ckpt):
    d = hf_qwen_ckpt("b")
    m32, m64 = oq.load(d), oq.load(d, dtype=np.float64)
    ids = _ids(m32, 40)
    a, b = m32.forward(ids), m64.forward(ids)
    assert a.dtype == np.float32 and b.dtype == np.float64
    assert np.max(np.abs(a - b)) < 1e-4 * np.max(np.abs(b))


def test_capture_names_and_injection(hf_qwen_ckpt):
    m = oq.load(hf_qwen_ckpt("a"))
    ids = _ids(m, 9)
    cap = {}
    logits = m.forward(ids, capture=cap)
    subs = ("in", "input_layernorm", "mixer", "mid", "post_attention_layernorm", "mlp", "out")
    want = {"embed", "norm", "logits"} | {f"layers.{i}.{s}" for i in range(4) for s in subs}
    assert set(cap) == want
    assert all(cap[k].shape == (9, m.config.hidden) for k in want - {"logits"})
    # injecting a layer's own captured input reproduces the run; injecting something else does not
    assert np.array_equal(m.forward(ids, inject={2: cap["layers.2.in"]}), logits)
    other = m.forward(ids, inject={2: cap["layers.2.in"] * 1.5})
    assert not np.allclose(other, logits)
    # layer() alone, fed layer i's input, reproduces layer i's output
    c2 = {}
    out = m.layer(3, cap["layers.3.in"], m.new_state(), c2)
    assert np.array_equal(out, cap["layers.3.out"])


def test_emulate_bf16_rounds_weights_and_activations(hf_qwen_ckpt):
    from oracle._common import round_bf16
    m = oq.load(hf_qwen_ckpt("a"), emulate_bf16=True)
    cap = {}
    m.forward(_ids(m, 6), capture=cap)
    for k in ("layers.0.mixer", "layers.3.out", "logits"):
        assert np.array_equal(cap[k], round_bf16(cap[k])), k


def test_generate_is_greedy_over_forward(hf_qwen_ckpt):
    m = oq.load(hf_qwen_ckpt("a"))
    prompt = _ids(m, 5, seed=9)
    toks = m.generate(prompt, 6)
    seq = list(prompt)
    for t in toks:
        assert t == int(np.argmax(m.forward(seq)[-1]))
        seq.append(t)
    assert m.generate(prompt, 6, eos_id=toks[1]) == toks[:2]
