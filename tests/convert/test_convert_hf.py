"""`modeld convert` on HF checkpoints: exact name map, strictness, profiles, identity, inventories."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from modeld.convert import errors as CE
from modeld.convert import quantize as Q
from modeld.convert.commands import convert_main, inspect_main, main as commands_main, verify_main
from modeld.convert.emit import emit
from modeld.convert.hf_convert import plan_hf
from modeld.mspec import open_mspec
from convert_support import checkpoint_tensors as _tensors

PREFIX = "model.language_model."


def _convert(src: Path, out: Path, profile: str = "bf16", **kw):
    return emit(plan_hf(src, profile, **kw), out)


def _variant(src: Path, dst: Path, tensors: dict, config: dict | None = None) -> Path:
    """A copy of checkpoint `src` with `tensors` as its single model.safetensors (and `config`)."""
    dst.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "synth.json"):
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    (dst / "config.json").write_text(json.dumps(config or json.loads((src / "config.json").read_text())))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(dst / "model.safetensors"))
    return dst


def test_bf16_is_an_exact_renamed_copy_with_tokenizer_inside(tiny_ckpt, tmp_path):
    result = _convert(tiny_ckpt, tmp_path / "t.mspec")
    src = _tensors(tiny_ckpt)
    with open_mspec(result.path, verify=True) as m:
        tensors = [o for o in m.objects if o.kind == "tensor"]
        assert len(tensors) == len(src)
        for name, t in src.items():
            target = name[len(PREFIX):] if name.startswith(PREFIX) else name
            got = m.tensor(target)
            assert got.dtype == t.dtype and torch.equal(got.view(torch.uint8), t.view(torch.uint8)), name
        assert m.blob("tokenizer/tokenizer.json") == (tiny_ckpt / "tokenizer.json").read_bytes()
        d = m.directory
        assert d.model_id == "synthetic/qwen3_5-tiny-L4-seed7" and d.family == "qwen3_5"
        assert d.metadata["chat_template"].startswith("{%- for message in messages")
        assert d.metadata["tokenizer"]["bos_token_id"] == 990
        assert d.metadata["config"]["text_config"]["hidden_size"] == 128
    inv = json.loads(result.inventory_json.read_text())
    assert inv["weights_id"] == result.directory.weights_id and len(inv["inventory"]) == len(result.directory.objects)
    assert "layers.3.self_attn.q_proj.weight" in result.inventory_txt.read_text()


def test_identity_is_stable_and_profile_specific(tiny_ckpt, tmp_path):
    a = _convert(tiny_ckpt, tmp_path / "a.mspec", "int4")
    b = _convert(tiny_ckpt, tmp_path / "b.mspec", "int4")
    c = _convert(tiny_ckpt, tmp_path / "c.mspec", "fp8")
    assert a.path.read_bytes() == b.path.read_bytes()
    assert a.directory.weights_id == b.directory.weights_id != c.directory.weights_id
    assert a.directory.recipe_hash != c.directory.recipe_hash
    assert a.directory.tokenizer_id == c.directory.tokenizer_id


def test_fp8_layout_and_error(tiny_ckpt, tmp_path):
    result = _convert(tiny_ckpt, tmp_path / "f.mspec", "fp8")
    src = _tensors(tiny_ckpt)
    with open_mspec(result.path, verify=True) as m:
        q = m.tensor("layers.0.mlp.up_proj.weight", dtype="float8_e4m3fn", shape=(256, 128))
        s = m.tensor("layers.0.mlp.up_proj.weight_scale", dtype="float32", shape=(256,))
        assert m.entry("layers.0.mlp.up_proj.weight").layout == "fp8_e4m3/per-channel/v1"
        w = src[PREFIX + "layers.0.mlp.up_proj.weight"].float()
        assert torch.allclose(s, w.abs().amax(1) / 448)
        err = (Q.dequantize_fp8(q, s) - w).abs()
        assert (err <= w.abs() * 2 ** -4 + s[:, None] * 2 ** -9).all()       # e4m3: 3 mantissa bits
        assert m.tensor("lm_head.weight").dtype == torch.bfloat16                # lm_head stays bf16
        assert m.tensor("layers.0.linear_attn.in_proj_a.weight").dtype == torch.bfloat16
        assert m.tensor("layers.0.linear_attn.A_log").dtype == torch.float32
    rows = {r["name"]: r for r in json.loads(result.inventory_json.read_text())["inventory"]}
    assert 0 < rows["layers.0.mlp.up_proj.weight"]["rel_fro_err"] < 0.05


def test_int4_layout_reconstructs_within_half_a_step(tiny_ckpt, tmp_path):
    result = _convert(tiny_ckpt, tmp_path / "i.mspec", "int4")
    src = _tensors(tiny_ckpt)
    with open_mspec(result.path) as m:
        base = "layers.1.mlp.down_proj"
        qw = m.tensor(base + ".qweight", dtype="uint8", shape=(128, 128))
        sc = m.tensor(base + ".scales", dtype="float16", shape=(128, 2))
        mn = m.tensor(base + ".mins", dtype="float16", shape=(128, 2))
        assert m.entry(base + ".qweight").layout == "int4_asym/g128/lo-nibble-first/v1"
        w = src[PREFIX + base + ".weight"].float()
        err = (Q.dequantize_int4(qw, sc, mn) - w).abs().reshape(128, 2, 128)
        assert (err <= sc.float()[..., None] / 2 + 1e-3).all()


def test_int4_nibble_order_is_low_first():
    w = torch.arange(128, dtype=torch.float32).remainder(16).reshape(1, 128)   # q == w when min 0, scale 1
    qw, sc, mn = Q.quantize_int4(w, 128)
    assert sc.item() == 1.0 and mn.item() == 0.0
    assert qw[0, 0].item() == 0x10 and qw[0, 1].item() == 0x32 and qw[0, 7].item() == 0xFE
    assert torch.equal(Q.dequantize_int4(qw, sc, mn), w)
    flat = torch.full((2, 256), 3.0)
    qw, sc, mn = Q.quantize_int4(flat, 128)                 # max == min: scale 1, q 0, exact
    assert torch.equal(Q.dequantize_int4(qw, sc, mn), flat)


def test_odd_shapes_convert_in_bf16_and_refuse_int4(odd_ckpt, tmp_path):
    result = _convert(odd_ckpt, tmp_path / "o.mspec")
    with open_mspec(result.path) as m:
        assert m.tensor("layers.6.linear_attn.A_log").dtype == torch.bfloat16
        assert "layers.3.self_attn.q_norm.weight" in m
    with pytest.raises(CE.QuantizationShapeError):
        plan_hf(odd_ckpt, "int4")


def test_text_only_model_layout_gives_the_same_weights(tiny_ckpt, tmp_path):
    src = _tensors(tiny_ckpt)
    no_mtp = {k: v for k, v in src.items() if not k.startswith("mtp.")}
    released = _variant(tiny_ckpt, tmp_path / "released", no_mtp)
    text_only = {("model." + k[len(PREFIX):] if k.startswith(PREFIX) else k): v for k, v in no_mtp.items()}
    cfg = json.loads((tiny_ckpt / "config.json").read_text())["text_config"]
    text = _variant(tiny_ckpt, tmp_path / "text", text_only, cfg)
    a = _convert(released, tmp_path / "a.mspec")
    b = _convert(text, tmp_path / "b.mspec")
    assert a.directory.weights_id == b.directory.weights_id
    assert not any(o.name.startswith("mtp.") for o in a.directory.objects)


def test_strict_name_map_errors(tiny_ckpt, tmp_path):
    src = _tensors(tiny_ckpt)
    missing = dict(src)
    del missing[PREFIX + "layers.2.linear_attn.dt_bias"]
    with pytest.raises(CE.MissingTensorError, match="dt_bias"):
        plan_hf(_variant(tiny_ckpt, tmp_path / "m", missing), "bf16")
    with pytest.raises(CE.LeftoverTensorError, match="surprise"):
        plan_hf(_variant(tiny_ckpt, tmp_path / "l", {**src, "model.surprise.weight": torch.zeros(2)}), "bf16")
    reshaped = {**src, PREFIX + "norm.weight": torch.zeros(64, dtype=torch.bfloat16)}
    with pytest.raises(CE.TensorShapeError):
        plan_hf(_variant(tiny_ckpt, tmp_path / "s", reshaped), "bf16")
    ints = {**src, PREFIX + "norm.weight": torch.zeros(128, dtype=torch.int32)}
    with pytest.raises(CE.TensorDtypeError):
        plan_hf(_variant(tiny_ckpt, tmp_path / "d", ints), "bf16")
    vision = {**src, "model.visual.patch_embed.proj.weight": torch.zeros(4, dtype=torch.bfloat16)}
    plan_hf(_variant(tiny_ckpt, tmp_path / "v", vision), "bf16")          # vision is ignored on purpose


def test_source_format_errors(tiny_ckpt, tmp_path):
    bad = tmp_path / "escape"
    shutil.copytree(tiny_ckpt, bad)
    index = json.loads((bad / "model.safetensors.index.json").read_text())
    index["weight_map"]["lm_head.weight"] = "../outside.safetensors"
    (bad / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CE.SourceFormatError, match="outside"):
        plan_hf(bad, "bf16")
    llama_like = {"model_type": "mamba"}
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps(llama_like))
    save_file({"x": torch.zeros(1)}, str(other / "model.safetensors"))
    with pytest.raises(CE.UnsupportedFamilyError):
        plan_hf(other, "bf16")
    with pytest.raises(CE.SourceNotFoundError):
        plan_hf(tmp_path / "nope", "bf16")
    with pytest.raises(CE.UnknownProfileError):
        plan_hf(tiny_ckpt, "int3")


def test_llama_hf_checkpoint(tiny_ckpt, tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=1024,
                                   tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(tmp_path / "llama")
    shutil.copy(tiny_ckpt / "tokenizer.json", tmp_path / "llama" / "tokenizer.json")
    result = _convert(tmp_path / "llama", tmp_path / "l.mspec", "int4", model_id="test/tiny-llama")
    sd = model.state_dict()
    with open_mspec(result.path, verify=True) as m:
        assert m.directory.family == "llama" and "lm_head.weight" not in m       # tied
        assert torch.equal(m.tensor("embed_tokens.weight"), sd["model.embed_tokens.weight"])
        w = sd["model.layers.1.self_attn.k_proj.weight"].float()
        got = Q.dequantize_int4(*(m.tensor(f"layers.1.self_attn.k_proj.{p}") for p in ("qweight", "scales", "mins")))
        assert (got - w).abs().max() < 0.01


def test_commands(tiny_ckpt, tmp_path, capsys):
    out = tmp_path / "cmd.mspec"
    assert convert_main([str(tiny_ckpt), "-o", str(out), "--profile", "fp8"]) == 0
    assert (tmp_path / "cmd.inventory.json").is_file() and (tmp_path / "cmd.inventory.txt").is_file()
    with pytest.raises(CE.OutputExistsError):
        convert_main([str(tiny_ckpt), "-o", str(out)])
    assert convert_main([str(tiny_ckpt), "-o", str(out), "--force"]) == 0
    assert inspect_main([str(out)]) == 0 and verify_main([str(out)]) == 0
    text = capsys.readouterr().out
    assert "weights_id   sha256:" in text and text.count("OK ") == 1
    data = bytearray(out.read_bytes())
    data[-300] ^= 0xFF                                   # inside the last object or its padding
    out.write_bytes(bytes(data))
    assert commands_main(["verify", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(("MspecChecksumMismatch:", "MspecNonzeroPadding:")) and "\n" not in err
    assert commands_main(["convert", str(tmp_path / "missing"), "-o", str(tmp_path / "x.mspec")]) == 2
    assert capsys.readouterr().err.startswith("SourceNotFoundError:")
