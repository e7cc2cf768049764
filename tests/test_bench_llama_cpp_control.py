"""bench/llama_cpp_control.py on the CPU build of llama-cpp-python: the control's greedy tokens and first tokens are
transformers' on the same checkpoint (so the H200 run times the right computation), and the JSON holds the rows the
report reads."""

from __future__ import annotations

import json

import torch

from bench import llama_cpp_control as lc
from modeld.convert import gguf_export as ge


def test_control_tokens_are_transformers_greedy(synth_ckpt, tmp_path):
    from transformers import AutoConfig, Qwen3_5ForCausalLM

    folder = synth_ckpt("small", 0)
    gguf_path = tmp_path / "small.gguf"
    ge.export(ge.open_checkpoint(folder), gguf_path, "f32")
    out = tmp_path / "out"
    assert lc.main(["--out", str(out), "--gguf", str(gguf_path), "--context", "16", "--steps", "4",
                    "--ttft", "16,32", "--ctx", "128", "--threads", "2"]) == 0
    doc = json.loads((out / "llama_cpp_control.json").read_text())
    assert doc["gguf"]["bytes"] == gguf_path.stat().st_size and doc["vocab"] == 4096
    d = doc["decode"]
    assert d["steps"] == 4 and 0 < d["p50_s"] <= d["p90_s"] and abs(d["tok_per_s_p50"] * d["p50_s"] - 1) < 1e-9
    assert [t["prompt_tokens"] for t in doc["ttft"]] == [16, 32] and len(doc["ttft"][0]["ttft_s_runs"]) == 3

    config = AutoConfig.from_pretrained(folder).text_config
    model = Qwen3_5ForCausalLM.from_pretrained(folder, config=config, dtype=torch.float32).eval()
    ids, greedy = lc.decode_ids(16, 4096), []
    with torch.no_grad():
        for _ in range(1 + 3 + 4):   # the prompt's token, the bench's 3 warm steps, then its 4 timed ones
            greedy.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
            ids.append(greedy[-1])
        firsts = [int(model(input_ids=torch.tensor([lc.ttft_ids(n, 4096)])).logits[0, -1].argmax()) for n in (16, 32)]
    assert d["greedy_tokens_head"] == greedy[4:]   # each timed step's output
    assert [t["first_token"] for t in doc["ttft"]] == firsts


def test_quantized_controls_keep_the_head_and_embeddings_unless_asked(synth_ckpt, tmp_path):
    """--quantize q8_0 (the control beside our fp8 profile) quantizes the layer matrices with llama.cpp's own
    quantizer and keeps output.weight and token_embd.weight as exported, the way our recipes keep the lm_head and
    embeddings; --quantize-output quantizes the head too. Both files load and decode in the bench."""
    q8_0, f32 = 8, 0   # ggml type ids
    gguf_path = tmp_path / "small.gguf"
    ge.export(ge.open_checkpoint(synth_ckpt("small", 0)), gguf_path, "f32")
    types = {}
    for extra in ([], ["--quantize-output"]):
        out = tmp_path / f"out{len(extra)}"
        assert lc.main(["--out", str(out), "--gguf", str(gguf_path), "--quantize", "q8_0", *extra, "--context", "8",
                        "--steps", "2", "--ttft", "8", "--ctx", "64", "--threads", "2"]) == 0
        doc = json.loads((out / "llama_cpp_control.json").read_text())
        q = doc["quantize"]
        assert q["kind"] == "q8_0" and q["bytes"] == doc["gguf"]["bytes"] < 0.5 * gguf_path.stat().st_size
        assert doc["decode"]["steps"] == 2 and len(doc["decode"]["greedy_tokens_head"]) == 2
        path = lc.Path(q["path"])
        types[len(extra)] = {n: lc.gguf_tensor_type(path, n)
                             for n in ("output.weight", "token_embd.weight", "blk.0.ffn_down.weight")}
    assert types[0] == {"output.weight": f32, "token_embd.weight": f32, "blk.0.ffn_down.weight": q8_0}
    assert types[1]["output.weight"] == q8_0 and types[1]["blk.0.ffn_down.weight"] == q8_0
