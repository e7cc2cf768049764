"""The opt-in quantized lm_head (`--lm-head P`): the default recipe is unchanged, the quantized head is
stored in the profile's own layout and recorded (new recipe hash and weights_id, every other object
byte-identical), its reconstruction error is in the inventory, and every misuse raises a named error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from modeld.convert import errors as CE
from modeld.convert import quantize as Q
from modeld.convert.commands import convert_main, synth_main
from modeld.convert.emit import emit
from modeld.convert.hf_convert import plan_hf
from modeld.convert.identity_preview import synth_identity
from modeld.convert.recipe import recipe_dict
from modeld.mspec import format as F
from modeld.mspec import open_mspec
from convert_support import checkpoint_tensors

EXPECTED = Path(__file__).resolve().parents[2] / "bench" / "artifact_qwen3_5_27b.expected.json"


def test_default_recipe_dict_is_unchanged():
    linear = {"bf16": "bfloat16", "fp8": "fp8_e4m3/per-channel/v1", "int4": "int4_asym/g128/lo-nibble-first/v1"}
    expected = json.loads(EXPECTED.read_text())
    for profile in ("bf16", "fp8", "int4"):
        got = recipe_dict(profile, "qwen3_5", "hf-safetensors")
        assert got == {"converter": "modeld.convert/v1", "family": "qwen3_5", "profile": profile,
                       "source_format": "hf-safetensors", "linear": linear[profile], "lm_head": "bf16",
                       "embeddings": "as stored", "norms_conv_ssm_params": "as stored",
                       "kept_linears": ["linear_attn.in_proj_a", "linear_attn.in_proj_b"]}
        assert got == recipe_dict(profile, "qwen3_5", "hf-safetensors", lm_head="bf16")
        # the recipe hash the committed 27B identities (and their certifications) were made with
        assert F.recipe_hash(got) == expected[f"27b/{profile}"]["recipe_hash"]
    # the CPU expectations of the quantized-head artifacts: this recipe's
    for profile, head, key in (("fp8", "fp8", "qhead"), ("int4", "int4", "qhead"), ("int4", "fp8", "fp8head")):
        qhead = F.recipe_hash(recipe_dict(profile, "qwen3_5", "hf-safetensors", lm_head=head))
        for config in ("27b", "small"):
            assert expected[f"{config}/{profile}+{key}"]["recipe_hash"] == qhead


@pytest.mark.parametrize("profile", ["fp8", "int4"])
def test_quantized_head_is_recorded_and_changes_only_the_head(profile, tiny_ckpt, tmp_path):
    base = emit(plan_hf(tiny_ckpt, profile), tmp_path / "base.mspec")
    qh = emit(plan_hf(tiny_ckpt, profile, lm_head=profile), tmp_path / "qhead.mspec")
    layout = F.FP8_LAYOUT if profile == "fp8" else F.int4_layout(128)
    assert qh.directory.recipe["lm_head"] == layout and base.directory.recipe["lm_head"] == "bf16"
    assert qh.directory.recipe_hash != base.directory.recipe_hash
    assert qh.directory.weights_id != base.directory.weights_id
    head = {"fp8": ("weight", "weight_scale"), "int4": ("qweight", "scales", "mins")}[profile]
    a = {o.name: o for o in base.directory.objects}
    b = {o.name: o for o in qh.directory.objects}
    assert set(b) - set(a) == {f"lm_head.{k}" for k in head} - {"lm_head.weight"}
    assert all(a[n].sha256 == b[n].sha256 for n in a if not n.startswith("lm_head."))
    w = checkpoint_tensors(tiny_ckpt)["lm_head.weight"].float()
    with open_mspec(qh.path, verify=True) as m:
        parts = [m.tensor(f"lm_head.{k}") for k in head]          # views of the mapped file: use them inside
        assert all(m.entry(f"lm_head.{k}").layout == layout for k in head)
        w_hat = Q.dequantize_fp8(*parts) if profile == "fp8" else Q.dequantize_int4(*parts)
    rel = float((w_hat - w).norm() / w.norm())
    rows = {r["name"]: r for r in json.loads(qh.inventory_json.read_text())["inventory"]}
    row = rows["lm_head.weight" if profile == "fp8" else "lm_head.qweight"]
    assert row["rel_fro_err"] == pytest.approx(rel, rel=1e-4) and 0 < rel < (0.05 if profile == "fp8" else 0.15)
    assert row["max_abs_err"] == pytest.approx(float((w_hat - w).abs().max()), rel=1e-4)


def test_preview_and_direct_write_equal_convert(tiny_ckpt, tmp_path, capsys):
    """The CPU identity expectation of a quantized-head artifact is computed like the others'."""
    ref = emit(plan_hf(tiny_ckpt, "int4", lm_head="int4"), tmp_path / "ref.mspec")
    ident = synth_identity("tiny", 7, "int4", workers=1, lm_head="int4")
    assert (ident.weights_id, ident.recipe_hash) == (ref.directory.weights_id, ref.directory.recipe_hash)
    out = tmp_path / "direct.mspec"
    assert synth_main(["--config", "tiny", "--seed", "7", "--to-mspec", str(out), "--profile", "int4",
                       "--lm-head", "int4", "--workers", "1"]) == 0
    assert out.read_bytes() == ref.path.read_bytes()
    capsys.readouterr()
    assert synth_main(["--config", "tiny", "--seed", "7", "--identity", "--profile", "int4", "--lm-head", "int4",
                       "--workers", "1"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["weights_id"], shown["recipe_hash"]) == (ref.directory.weights_id, ref.directory.recipe_hash)


def test_bad_lm_head_choices_raise(tiny_ckpt, tmp_path):
    for profile, lm_head in (("bf16", "fp8"), ("bf16", "int4"), ("fp8", "int4"), ("fp8", "q8"), ("int4", "q8")):
        with pytest.raises(CE.UnknownProfileError, match="lm_head"):
            recipe_dict(profile, "qwen3_5", "hf-safetensors", lm_head=lm_head)
        with pytest.raises(CE.UnknownProfileError, match="lm_head"):
            plan_hf(tiny_ckpt, profile, lm_head=lm_head)
    with pytest.raises(CE.UnknownProfileError, match="profile's own format"):
        convert_main([str(tiny_ckpt), "-o", str(tmp_path / "x.mspec"), "--lm-head", "fp8"])   # profile bf16
    with pytest.raises(SystemExit):
        convert_main([str(tiny_ckpt), "-o", str(tmp_path / "x.mspec"), "--profile", "fp8", "--lm-head", "q8"])
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(CE.UnknownProfileError, match="checkpoint directories only"):
        convert_main([str(gguf), "-o", str(tmp_path / "g.mspec"), "--profile", "int4", "--lm-head", "int4"])
    assert not (tmp_path / "x.mspec").exists() and not (tmp_path / "g.mspec").exists()


def test_tied_checkpoint_refuses_a_quantized_head(tiny_ckpt, tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                   tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(tmp_path / "llama")
    shutil.copy(tiny_ckpt / "tokenizer.json", tmp_path / "llama" / "tokenizer.json")
    with pytest.raises(CE.UnknownProfileError, match="ties lm_head"):
        plan_hf(tmp_path / "llama", "fp8", model_id="test/tied", lm_head="fp8")


def test_help_names_the_option(capsys):
    for main in (convert_main, synth_main):
        with pytest.raises(SystemExit):
            main(["--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "--lm-head {bf16,fp8,int4}" in text and "weights_id" in text
