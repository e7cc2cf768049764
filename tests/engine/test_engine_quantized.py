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
from modeld.kernels.linear.quant import dequantize_fp8, dequantize_int4
from modeld.models.qwen3_5.config import Qwen35Config
from modeld.models.qwen3_5.engine import EngineOptions, Qwen35Engine


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


@pytest.mark.parametrize("profile, group", [("fp8", 0), ("int4", 128)])
def test_quantized_profile_matches_its_dequantized_control(mspec_file, profile, group):
    art = open_artifact(mspec_file("tiny", profile))
    cfg = Qwen35Config.from_hf(art.config)
    q = build(cfg, art.source)
    assert q.weights.profile == profile and q.weights.slot_profiles["L0.mlp.down"] == (profile, group)
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
