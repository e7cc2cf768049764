"""GGUF import: lossless Q4_1 -> int4 g32, q/k un-permutation, tokenizer rebuild, stable identity."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from modeld.convert import errors as CE  # noqa: E402
from modeld.convert import quantize as Q  # noqa: E402
from modeld.convert.emit import emit  # noqa: E402
from modeld.convert.gguf_import import plan_gguf, unpermute_rows  # noqa: E402
from modeld.mspec import open_mspec  # noqa: E402

@pytest.fixture(scope="module")
def imported(tmp_path_factory, smollm2_gguf):
    out = tmp_path_factory.mktemp("gguf") / "smollm2.mspec"
    emit(plan_gguf(smollm2_gguf, None), out)
    return out


@pytest.fixture(scope="module")
def gguf_tensors(smollm2_gguf):
    # GGUFReader parses the whole file (KNOWLEDGE/pitfalls/gguf-reader-parses-everything.md): once.
    return {t.name: t for t in gguf.GGUFReader(str(smollm2_gguf)).tensors}


def test_import_is_deterministic(imported, tmp_path, smollm2_gguf):
    again = emit(plan_gguf(smollm2_gguf, "int4"), tmp_path / "again.mspec")
    assert again.path.read_bytes() == imported.read_bytes()
    with open_mspec(imported, verify=True) as m:
        d = m.directory
        assert d.weights_id == again.directory.weights_id
        assert d.model_id == "HuggingFaceTB/SmolLM2-135M-Instruct" and d.family == "llama"
        assert d.recipe["profile"] == "int4" and d.recipe["linear"] == "int4_asym/g32/lo-nibble-first/v1"
        assert d.metadata["config"]["tie_word_embeddings"] is True and "lm_head.weight" not in m
        assert d.metadata["chat_template"].startswith("{% for message in messages %}")


def test_int4_objects_dequantize_exactly_like_gguf(imported, gguf_tensors):
    tensors = gguf_tensors
    checked = 0
    with open_mspec(imported) as m:
        for layer in (0, 13, 29):
            for g_name, hf in (("attn_q", "self_attn.q_proj"), ("attn_k", "self_attn.k_proj"),
                               ("attn_v", "self_attn.v_proj"), ("attn_output", "self_attn.o_proj"),
                               ("ffn_gate", "mlp.gate_proj"), ("ffn_up", "mlp.up_proj"), ("ffn_down", "mlp.down_proj")):
                t = tensors[f"blk.{layer}.{g_name}.weight"]
                assert t.tensor_type == gguf.GGMLQuantizationType.Q4_1
                n, k = (int(x) for x in reversed(t.shape.tolist()))
                ref = gguf.quants.dequantize(np.asarray(t.data), gguf.GGMLQuantizationType.Q4_1).reshape(n, k)
                if g_name in ("attn_q", "attn_k"):
                    ref = ref[unpermute_rows(n, 9 if g_name == "attn_q" else 3)]
                base = f"layers.{layer}.{hf}"
                ours = Q.dequantize_int4(m.tensor(base + ".qweight"), m.tensor(base + ".scales"), m.tensor(base + ".mins"))
                assert torch.equal(ours, torch.from_numpy(np.ascontiguousarray(ref))), base
                checked += 1
        emb = tensors["token_embd.weight"]
        ref = gguf.quants.dequantize(np.asarray(emb.data), gguf.GGMLQuantizationType(emb.tensor_type))
        assert torch.equal(m.tensor("embed_tokens.weight", dtype="float32"), torch.from_numpy(ref.reshape(49152, 576)))
        assert torch.equal(m.tensor("norm.weight"), torch.from_numpy(np.array(tensors["output_norm.weight"].data)))
    assert checked == 21


def _rope(x: torch.Tensor, pairs: str, base: float = 100000.0) -> torch.Tensor:
    """x [T, H, D] float64 at positions 0..T-1; 'half': HF rotate_half pairing, 'adjacent': GGUF NORM."""
    t, _, d = x.shape
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)           # [D/2]
    ang = torch.arange(t, dtype=torch.float64)[:, None] * inv[None]             # [T, D/2]
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]
    a, b = (x[..., : d // 2], x[..., d // 2:]) if pairs == "half" else (x[..., 0::2], x[..., 1::2])
    ra, rb = a * cos - b * sin, a * sin + b * cos
    return torch.cat([ra, rb], -1) if pairs == "half" else torch.stack([ra, rb], -1).reshape(x.shape)


def test_unpermuted_q_k_give_llama_cpp_attention_scores_under_hf_rope(imported, gguf_tensors):
    tensors = gguf_tensors

    def gguf_rows(name, n, k):
        return torch.from_numpy(gguf.quants.dequantize(np.asarray(tensors[name].data), gguf.GGMLQuantizationType.Q4_1)
                                .reshape(n, k)).double()

    x = torch.randn(7, 576, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with open_mspec(imported) as m:
        wq = Q.dequantize_int4(*(m.tensor(f"layers.5.self_attn.q_proj.{p}") for p in ("qweight", "scales", "mins"))).double()
        wk = Q.dequantize_int4(*(m.tensor(f"layers.5.self_attn.k_proj.{p}") for p in ("qweight", "scales", "mins"))).double()
    q_hf = _rope((x @ wq.T).reshape(7, 9, 64), "half")
    k_hf = _rope((x @ wk.T).reshape(7, 3, 64), "half")
    q_gg = _rope((x @ gguf_rows("blk.5.attn_q.weight", 576, 576).T).reshape(7, 9, 64), "adjacent")
    k_gg = _rope((x @ gguf_rows("blk.5.attn_k.weight", 192, 576).T).reshape(7, 3, 64), "adjacent")
    kv_of = torch.arange(9) // 3
    s_hf = torch.einsum("thd,shd->hts", q_hf, k_hf[:, kv_of])
    s_gg = torch.einsum("thd,shd->hts", q_gg, k_gg[:, kv_of])
    assert torch.allclose(s_hf, s_gg, rtol=1e-9, atol=1e-9)
    s_wrong = torch.einsum("thd,shd->hts", _rope((x @ wq.T).reshape(7, 9, 64), "adjacent"), k_gg[:, kv_of])
    assert not torch.allclose(s_wrong, s_gg, atol=1e-3)           # the permutation matters


def test_tokenizer_matches_llama_cpp(imported, smollm2_gguf):
    from tokenizers import Tokenizer

    with open_mspec(imported) as m:
        tok = Tokenizer.from_str(m.blob("tokenizer/tokenizer.json").decode())
        assert m.directory.metadata["tokenizer"]["eos_token_id"] == 2
    llama_cpp = pytest.importorskip("llama_cpp")
    ref = llama_cpp.Llama(str(smollm2_gguf), vocab_only=True, verbose=False)
    for text in ["Hello world 12345, café!", "<|im_start|>user\nWhy is the sky blue?<|im_end|>\n",
                 "  leading spaces\tand tabs\n\nnew lines", "東京 😀 naïve — 3.14159", "def f(x):\n    return x**2"]:
        ours = tok.encode(text).ids
        assert ours == ref.tokenize(text.encode(), add_bos=False, special=True), text
        assert tok.decode(ours, skip_special_tokens=False) == text


def _tiny_gguf(path: Path, arch: str = "llama", extra: bool = False, q_type=None) -> Path:
    """A 2-layer llama GGUF (hidden 64) with Q8_0/Q4_1/F16/F32 tensors and a byte-level vocab."""
    q_type = q_type or gguf.GGMLQuantizationType.Q4_1
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(2)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_string("general.organization", "test")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    from tokenizers.pre_tokenizers import ByteLevel
    tokens = ["<|endoftext|>"] + sorted(ByteLevel.alphabet())
    w.add_token_list(tokens)
    w.add_token_types([3] + [1] * (len(tokens) - 1))
    w.add_token_merges([])
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_vocab_size(len(tokens))
    rng = np.random.default_rng(0)
    vocab = len(tokens)

    def add(name, shape, qtype):
        data = rng.standard_normal(shape).astype(np.float32) * 0.1
        if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            w.add_tensor(name, data.astype(np.float32 if qtype.name == "F32" else np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)

    add("token_embd.weight", (vocab, 64), gguf.GGMLQuantizationType.Q8_0)
    add("output_norm.weight", (64,), gguf.GGMLQuantizationType.F32)
    add("output.weight", (vocab, 64), gguf.GGMLQuantizationType.F16)
    for i in range(2):
        for n, shape in (("attn_q", (64, 64)), ("attn_k", (32, 64)), ("attn_v", (32, 64)), ("attn_output", (64, 64)),
                         ("ffn_gate", (128, 64)), ("ffn_up", (128, 64)), ("ffn_down", (64, 128))):
            add(f"blk.{i}.{n}.weight", shape, q_type)
        add(f"blk.{i}.attn_norm.weight", (64,), gguf.GGMLQuantizationType.F32)
        add(f"blk.{i}.ffn_norm.weight", (64,), gguf.GGMLQuantizationType.F32)
    if extra:
        add("rope_freqs.weight", (8,), gguf.GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("profile", ["int4", "bf16", "fp8"])
def test_tiny_gguf_profiles(tmp_path, profile):
    src = _tiny_gguf(tmp_path / "tiny-model.Q4_1.gguf")
    result = emit(plan_gguf(src, profile), tmp_path / f"{profile}.mspec")
    with open_mspec(result.path, verify=True) as m:
        assert m.directory.model_id == "test/tiny-model"
        assert m.tensor("lm_head.weight").dtype == torch.bfloat16        # F16 lm_head -> bf16 (recipe)
        assert m.tensor("embed_tokens.weight").dtype == torch.float32     # Q8_0 dequantized exactly
        names = {o.name for o in m.objects}
        expect = {"int4": "layers.1.mlp.up_proj.qweight", "bf16": "layers.1.mlp.up_proj.weight",
                  "fp8": "layers.1.mlp.up_proj.weight_scale"}[profile]
        assert expect in names


def test_tiny_gguf_errors(tmp_path):
    with pytest.raises(CE.UnsupportedFamilyError):
        plan_gguf(_tiny_gguf(tmp_path / "a.gguf", arch="qwen2"), None)
    with pytest.raises(CE.LeftoverTensorError):
        plan_gguf(_tiny_gguf(tmp_path / "b.gguf", extra=True), None)
    bad = tmp_path / "c.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 64)
    with pytest.raises(CE.SourceFormatError):
        plan_gguf(bad, None)
    q8 = emit(plan_gguf(_tiny_gguf(tmp_path / "d.gguf", q_type=gguf.GGMLQuantizationType.Q8_0), "int4"),
              tmp_path / "d.mspec")
    with open_mspec(q8.path) as m:              # non-Q4_1 linears in an int4 import: dequantized, bf16
        assert m.tensor("layers.0.self_attn.q_proj.weight").dtype == torch.bfloat16


@pytest.mark.slow
def test_imported_weights_reproduce_llama_cpp_logits(imported, smollm2_gguf):
    """End to end: the artifact, run as an HF llama in fp32, gives llama.cpp's logits.

    Slow (~10-35 s on 2 shared cores); the fast variants are the exact-dequantization and
    RoPE-score tests above, which pin the same two properties tensor by tensor."""
    transformers = pytest.importorskip("transformers")
    llama_cpp = pytest.importorskip("llama_cpp")
    from tokenizers import Tokenizer

    with open_mspec(imported) as m:
        cfg = m.directory.metadata["config"]
        hf = transformers.LlamaConfig(**{k: cfg[k] for k in (
            "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "vocab_size", "rms_norm_eps", "rope_theta", "tie_word_embeddings", "max_position_embeddings")})
        from transformers.initialization import no_init_weights

        with no_init_weights():                 # every weight is loaded below; skip the 13 s init
            model = transformers.LlamaForCausalLM(hf).float().eval()
        state = {}
        for o in m.objects:
            if o.name.endswith(".qweight"):
                base = o.name[:-len(".qweight")]
                state[f"model.{base}.weight"] = Q.dequantize_int4(*(m.tensor(f"{base}.{p}") for p in ("qweight", "scales", "mins")))
            elif o.kind == "tensor" and not o.name.endswith((".scales", ".mins")):
                state[f"model.{o.name}"] = m.tensor(o.name).float()
        missing, unexpected = model.load_state_dict(state, strict=False)
        assert missing == ["lm_head.weight"] and unexpected == []          # tied to embed_tokens
        model.lm_head.weight = model.model.embed_tokens.weight
        tok = Tokenizer.from_str(m.blob("tokenizer/tokenizer.json").decode())
    ids = tok.encode("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n").ids
    with torch.no_grad():
        ours = model(torch.tensor([ids])).logits[0].double()
    ref = llama_cpp.Llama(str(smollm2_gguf), logits_all=True, verbose=False, n_ctx=128, n_threads=1)
    ref.eval(ids)
    theirs = torch.tensor(np.array(ref.scores[:len(ids)]), dtype=torch.float64)
    # llama.cpp quantizes activations to Q8 inside its Q4_1 dot products: close, not equal.
    assert torch.nn.functional.cosine_similarity(ours, theirs, dim=-1).min() > 0.99
    assert ours[-1].argmax() == theirs[-1].argmax()
