"""Rung 1: config parsing and strict weight loading into the fixed arena layout, byte parity."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from modeld.execution.errors import (
    MissingTensorError,
    ModelConfigError,
    TensorDtypeMismatch,
    TensorShapeMismatch,
    UnexpectedTensorError,
    WeightParityError,
)
from modeld.execution.sources import SafetensorsDirSource
from modeld.models.qwen3_5.config import Qwen35Config
from modeld.models.qwen3_5.weights import Qwen35Weights


@pytest.mark.parametrize("name", ["tiny", "odd"])
def test_load_and_byte_parity(ckpt_dir, name):
    d = ckpt_dir(name)
    cfg = Qwen35Config.from_file(d / "config.json")
    src = SafetensorsDirSource(d)
    w = Qwen35Weights(cfg, "cpu")
    report = w.load(src)
    n_text = len([n for n in src.names() if not n.startswith("mtp.")])
    assert report.consumed == n_text and all(s.startswith("mtp.") for s in report.skipped)
    assert w.verify_parity(src) == n_text
    # identity spot checks: concatenated slots hold their parts in order
    raw = {k: v for f in d.glob("*.safetensors") for k, v in load_file(str(f)).items()}
    p = "model.language_model.layers.0.linear_attn."
    ip, ba = w["L0.gdn.in_proj"], w["L0.gdn.ba"]
    assert torch.equal(ip[: cfg.conv_dim], raw[p + "in_proj_qkv.weight"])
    assert torch.equal(ip[cfg.conv_dim:], raw[p + "in_proj_z.weight"])
    assert torch.equal(ba[cfg.lin_v_heads:], raw[p + "in_proj_a.weight"])
    assert torch.equal(w["L0.gdn.conv"], raw[p + "conv1d.weight"][:, 0, :])
    assert torch.equal(w["lm_head"], raw["lm_head.weight"])
    # F32-stored GDN params are rounded to bf16 exactly as HF's bf16 load does
    if raw[p + "A_log"].dtype == torch.float32:
        assert set(report.casts) >= {"L0.gdn.A_log", "L0.gdn.norm"}
        assert torch.equal(w["L0.gdn.A_log"], raw[p + "A_log"].to(torch.bfloat16))
    # parity catches a flipped byte
    w["L1.mlp.down"].view(torch.int16)[0, 0] ^= 1
    with pytest.raises(WeightParityError):
        w.verify_parity(src)


def _edited_copy(src_dir, dst_dir, edit):
    shutil.copytree(src_dir, dst_dir)
    for f in dst_dir.glob("*.safetensors"):
        tensors = load_file(str(f))
        edit(tensors)
        f.unlink()
        save_file(tensors, str(f))
    return dst_dir


P = "model.language_model.layers.0."


@pytest.mark.parametrize("edit, error", [
    (lambda t: t.pop(P + "mlp.up_proj.weight", None), MissingTensorError),
    (lambda t: t.__setitem__("model.language_model.extra.weight", torch.zeros(2)), UnexpectedTensorError),
    (lambda t: t.__setitem__(P + "mlp.up_proj.weight", t[P + "mlp.up_proj.weight"][:-1].clone())
     if P + "mlp.up_proj.weight" in t else None, TensorShapeMismatch),
    (lambda t: t.__setitem__(P + "mlp.up_proj.weight", t[P + "mlp.up_proj.weight"].float())
     if P + "mlp.up_proj.weight" in t else None, TensorDtypeMismatch),
], ids=["missing", "leftover", "shape", "dtype"])
def test_strict_loading_errors(ckpt_dir, tmp_path, edit, error):
    d = _edited_copy(ckpt_dir("tiny"), tmp_path / "ck", edit)
    cfg = Qwen35Config.from_file(d / "config.json")
    with pytest.raises(error):
        Qwen35Weights(cfg, "cpu").load(SafetensorsDirSource(d))


def test_config_errors(ckpt_dir):
    raw = json.loads((ckpt_dir("tiny") / "config.json").read_text())
    cfg = Qwen35Config.from_hf(raw)
    assert cfg.attn_layers == (3,) and cfg.rotary_dim == 8 and 992 in cfg.eos_ids
    bad = json.loads(json.dumps(raw))
    del bad["text_config"]["hidden_size"]
    with pytest.raises(ModelConfigError):
        Qwen35Config.from_hf(bad)
    bad = json.loads(json.dumps(raw))
    bad["text_config"]["num_key_value_heads"] = 3
    with pytest.raises(ModelConfigError):
        Qwen35Config.from_hf(bad)
    bad = json.loads(json.dumps(raw))
    bad["text_config"]["model_type"] = "llama"
    with pytest.raises(ModelConfigError):
        Qwen35Config.from_hf(bad)


def test_mspec_artifact_loads_the_same_arena(ckpt_dir, mspec_file):
    """Rung 1 on the real artifact format: the .mspec (converted from the same checkpoint) fills
    a byte-identical arena; identity comes from the file."""
    from modeld.execution.artifacts import open_artifact

    art = open_artifact(mspec_file("tiny"))
    assert art.weights_id.startswith("sha256:") and art.model_id == "synthetic/qwen3_5-tiny-L4-seed0"
    cfg = Qwen35Config.from_hf(art.config)
    a = Qwen35Weights(cfg, "cpu")
    a.load(art.source)
    assert a.verify_parity(art.source) == 56
    b = Qwen35Weights(cfg, "cpu")
    b.load(SafetensorsDirSource(ckpt_dir("tiny")))
    assert torch.equal(a.arena.storage, b.arena.storage)
