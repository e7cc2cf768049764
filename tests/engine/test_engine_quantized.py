"""Rung 6 (first cut): fp8 and int4 .mspec profiles load into their own fixed layouts (byte
parity with the artifact) and run the same schedule through the quantized linear kernels.

Control: the bf16 engine loaded with the *dequantized* weights of the same artifact (rounded to
bf16). Quantization error then cancels out and only the quantized kernels' arithmetic and the
bf16 re-rounding of the weights remain — a wiring bug (wrong scale row, swapped nibble, wrong
group) shows up as an error as large as the quantization error itself. The bf16 checkpoint is
reported too (pure quantization error, for the ladder table)."""

from __future__ import annotations

import pytest
import torch

from engine_support import random_prompt
from modeld.execution.artifacts import open_artifact
from modeld.kernels.logits import reference as logits_ref
from modeld.kernels.linear.quant import dequantize_fp8, dequantize_int4
from modeld.models.qwen3_5.config import Qwen35Config
from modeld.models.qwen3_5.engine import EngineOptions, Qwen35Engine
from modeld.models.qwen3_5.forward import Probe


class DequantSource:
    """The artifact's tensors with every quantized linear replaced by its bf16 dequantization."""

    def __init__(self, src) -> None:
        self.src = src
        names = set(src.names())
        self.quant = {n.removesuffix(".qweight") for n in names if n.endswith(".qweight")}
        self.quant |= {n.removesuffix(".weight_scale") for n in names if n.endswith(".weight_scale")}
        drop = {f"{b}.{s}" for b in self.quant for s in ("qweight", "scales", "mins", "weight", "weight_scale")}
        self._names = sorted((names - drop) | {b + ".weight" for b in self.quant})

    def names(self):
        return self._names

    def _deq(self, base):
        s = self.src
        if base + ".qweight" in s.names():
            w = dequantize_int4(s.tensor(base + ".qweight"), s.tensor(base + ".scales"), s.tensor(base + ".mins"))
        else:
            w = dequantize_fp8(s.tensor(base + ".weight"), s.tensor(base + ".weight_scale"))
        return w.to(torch.bfloat16)

    def meta(self, name):
        if name.removesuffix(".weight") in self.quant:
            w = self._deq(name.removesuffix(".weight"))
            return w.dtype, tuple(w.shape)
        return self.src.meta(name)

    def tensor(self, name):
        base = name.removesuffix(".weight")
        return self._deq(base) if base in self.quant else self.src.tensor(name)


def build(cfg, source):
    return Qwen35Engine(cfg, source, "cpu", options=EngineOptions(capacity=128))


def teacher_forced(a_eng, b_eng, prompt, steps):
    a, b = a_eng.prefill(0, prompt), b_eng.prefill(0, prompt)
    errs, agree = [float((a - b).abs().max())], int(int(a.argmax()) == int(b.argmax()))
    for _ in range(steps):
        t = int(b.argmax())
        a, b = a_eng.decode([t])[0], b_eng.decode([t])[0]
        errs.append(float((a - b).abs().max()))
        agree += int(int(a.argmax()) == int(b.argmax()))
    return max(errs), agree


@pytest.mark.parametrize("profile, group, lm_head", [("fp8", 0, "bf16"), ("int4", 128, "bf16"),
                                                     ("fp8", 0, "fp8"), ("int4", 128, "int4")],
                         ids=["fp8", "int4", "fp8-qhead", "int4-qhead"])
def test_quantized_profile_matches_its_dequantized_control(mspec_file, profile, group, lm_head):
    art = open_artifact(mspec_file("tiny", profile, lm_head))
    cfg = Qwen35Config.from_hf(art.config)
    q = build(cfg, art.source)
    assert q.weights.profile == profile and q.weights.slot_profiles["L0.mlp.down"] == (profile, group)
    assert q.weights.head_profile == ((profile, group) if lm_head != "bf16" else ("bf16", 0))
    assert q.weights.verify_parity(art.source) > 56  # every component tensor byte-checked
    deq = build(cfg, DequantSource(art.source))
    bf16 = build(cfg, open_artifact(mspec_file("tiny", "bf16")).source)
    assert q.weights.nbytes < bf16.weights.nbytes
    prompt = random_prompt(1024, 40, 31)
    err_ctrl, agree_ctrl = teacher_forced(q, deq, prompt, 8)
    err_quant, _ = teacher_forced(q, bf16, prompt, 8)
    print(f"{profile}: vs dequantized control {err_ctrl:.3f} ({agree_ctrl}/9), vs bf16 {err_quant:.3f}")
    assert err_ctrl < 0.5 and agree_ctrl >= 8, (err_ctrl, agree_ctrl)  # measured 0.225 fp8, 0.241 int4
    assert err_ctrl < err_quant / 2  # the kernels' arithmetic is far below the quantization error


HEAD_PARTS = {"fp8": ("weight", "weight_scale"), "int4": ("qweight", "scales", "mins")}


@pytest.mark.parametrize("profile, head", [("fp8", "fp8"), ("int4", "int4"), ("int4", "fp8")],
                         ids=["fp8", "int4", "int4-fp8head"])
def test_quantized_head_artifact_serves_close_to_the_bf16_head(mspec_file, profile, head):
    """`modeld convert --lm-head H`: the engine loads the head in its layout (byte parity, fewer arena bytes: the
    roofline counts the smaller head), and its logits and greedy tokens stay close to the bf16-head artifact of the
    same profile (the head's own quantization error is the only difference); an int4 artifact may carry an fp8
    head."""
    art_q, art_b = open_artifact(mspec_file("tiny", profile, head)), open_artifact(mspec_file("tiny", profile))
    assert art_q.weights_id != art_b.weights_id
    cfg = Qwen35Config.from_hf(art_q.config)
    q, b = build(cfg, art_q.source), build(cfg, art_b.source)
    assert q.weights.verify_parity(art_q.source) == b.weights.verify_parity(art_b.source) + len(HEAD_PARTS[head]) - 1
    assert all(q.weights[f"lm_head.{k}"].numel() for k in HEAD_PARTS[head])
    v, d = cfg.vocab, cfg.hidden
    head_bytes = v * d + 4 * v if head == "fp8" else v * d // 2 + 2 * 2 * v * (d // 128)
    assert b.weights.nbytes - q.weights.nbytes == pytest.approx(2 * v * d - head_bytes, abs=4096)
    # every other weight is the same, so the hidden state is too: the quantized engine's logits are exactly the
    # logits op on the artifact's head parts applied to the bf16-head engine's last hidden state
    prompt, last = random_prompt(1024, 40, 31), {}
    lb = b.prefill(0, prompt, probe=Probe(layer=lambda i, h: last.__setitem__(i, h.clone())))
    parts = [art_q.source.tensor(f"lm_head.{k}") for k in HEAD_PARTS[head]]
    op = getattr(logits_ref, f"final_norm_logits_{head}")
    assert torch.equal(q.prefill(0, prompt), op(last[cfg.layers - 1], b.weights["final_norm"], *parts, cfg.eps)[0])
    scale = float(lb.abs().max())
    q.reset_slot(0)
    b.reset_slot(0)
    err, agree = teacher_forced(q, b, prompt, 8)
    print(f"{profile} / {head} head: vs bf16 head max|d logit| {err:.4f} (max |logit| {scale:.2f}), argmax {agree}/9")
    # measured: fp8 0.073 of 11.3 (9/9), int4 1.18 of 11.3 (8/9): the head's own quantization error
    assert 0 < err < (0.1 if head == "fp8" else 0.25) * scale and agree >= 7, (err, scale, agree)
    tokens = {}
    for name, eng in (("q", q), ("b", b)):
        eng.reset_slot(0)
        x, out = eng.prefill(0, random_prompt(1024, 12, 5)), []
        for _ in range(8):
            out.append(int(x.argmax()))
            x = eng.decode([out[-1]])[0]
            assert torch.isfinite(x).all()
        tokens[name] = out
    assert all(0 <= t < cfg.vocab for t in tokens["q"])
    assert sum(a == c for a, c in zip(tokens["q"], tokens["b"])) >= 6, tokens


def test_quantized_head_on_the_triton_binding(mspec_file):
    """The Triton logits path of a quantized head inside the schedule (interpreter on CPU)."""
    from modeld.execution.bindings import reference_kernels, triton_kernels

    art = open_artifact(mspec_file("tiny", "int4", "int4"))
    cfg = Qwen35Config.from_hf(art.config)
    opts = EngineOptions(capacity=64)
    tt = Qwen35Engine(cfg, art.source, "cpu", kernels=triton_kernels(), options=opts)
    ref = Qwen35Engine(cfg, art.source, "cpu", kernels=reference_kernels(), options=opts)
    prompt = random_prompt(1024, 10, 0)
    a, b = tt.prefill(0, prompt), ref.prefill(0, prompt)
    assert int(a.argmax()) == int(b.argmax()) and float((a - b).abs().max()) < 1.0
    a, b = tt.decode([7])[0], ref.decode([7])[0]
    assert torch.isfinite(a).all() and float((a - b).abs().max()) < 1.0


@pytest.mark.gpu
@pytest.mark.parametrize("profile", ["fp8", "int4"])
def test_gpu_quantized_head_graph_replays_like_eager(mspec_file, profile):
    """On CUDA: the captured decode step with a quantized head (its Triton GEMV inside the graph) gives
    bit-identical logits to the eager step, and prefill agrees with the reference kernels."""
    from modeld.execution.bindings import reference_kernels

    art = open_artifact(mspec_file("tiny", profile, profile))
    cfg = Qwen35Config.from_hf(art.config)
    graphed = Qwen35Engine(cfg, art.source, "cuda", options=EngineOptions(capacity=64, use_graph=True))
    eager = Qwen35Engine(cfg, art.source, "cuda", options=EngineOptions(capacity=64, use_graph=False))
    ref = Qwen35Engine(cfg, art.source, "cuda", kernels=reference_kernels(), options=EngineOptions(capacity=64))
    assert graphed.graph.captured and graphed.weights.head_profile[0] == profile
    prompt = random_prompt(1024, 10, 0)
    a, b = graphed.prefill(0, prompt).clone(), ref.prefill(0, prompt)
    assert int(a.argmax()) == int(b.argmax()) and float((a - b).abs().max()) < 1.0   # as the CPU binding test
    eager.prefill(0, prompt)
    for tok in (7, 8, 9):
        assert torch.equal(graphed.decode([tok])[0].clone(), eager.decode([tok])[0].clone())
