"""CUDA quantization is bit-identical to the CPU's (run on the H200: `pytest tests/convert -m gpu`)."""

from __future__ import annotations

import pytest
import torch

from modeld.convert import quantize as Q
from modeld.convert.qwen3_5_spec import checkpoint_inventory, preset
from modeld.convert.synth import chunk_values, storage_tensor
from modeld.convert.synth_source import write_synth_mspec

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _synth_rows(name: str, rows: int) -> torch.Tensor:
    """The first `rows` rows of a 27B synth tensor (the values the 27B artifact quantizes)."""
    spec = next(s for s in checkpoint_inventory(preset("27b")) if s.name == name)
    k = spec.shape[1]
    values = chunk_values(spec, 0, 0, rows * k)            # rows * k <= CHUNK_ELEMS for these
    return storage_tensor(values, spec.dtype).view(rows, k)


WEIGHTS = [("model.language_model.layers.0.mlp.down_proj.weight", 96),
           ("model.language_model.layers.3.self_attn.q_proj.weight", 512),
           ("mtp.fc.weight", 256)]


@needs_cuda
@pytest.mark.parametrize("name,rows", WEIGHTS)
def test_int4_and_fp8_cuda_equal_cpu_bit_for_bit(name, rows):
    w = _synth_rows(name, rows)
    for cpu, gpu in zip(Q.quantize_int4(w, 128, name), Q.quantize_int4(w.cuda(), 128, name)):
        assert gpu.device.type == "cpu" and torch.equal(cpu.view(torch.uint8), gpu.view(torch.uint8))
    for cpu, gpu in zip(Q.quantize_fp8(w, name), Q.quantize_fp8(w.cuda(), name, out_device="cuda")):
        assert torch.equal(cpu.view(torch.uint8), gpu.cpu().view(torch.uint8))


@needs_cuda
def test_random_scales_cover_many_rounding_cases():
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(4096, 1024, generator=g) * torch.logspace(-4, 1, 4096)[:, None]).to(torch.bfloat16)
    for cpu, gpu in zip(Q.quantize_int4(w, 128), Q.quantize_int4(w.cuda(), 128)):
        assert torch.equal(cpu.view(torch.uint8), gpu.view(torch.uint8))
    for cpu, gpu in zip(Q.quantize_fp8(w), Q.quantize_fp8(w.cuda())):
        assert torch.equal(cpu.view(torch.uint8), gpu.view(torch.uint8))


@needs_cuda
@pytest.mark.parametrize("profile", ["fp8", "int4"])
def test_direct_artifact_on_cuda_equals_cpu(profile, tmp_path):
    a = write_synth_mspec(preset("small"), 0, profile, tmp_path / "cpu.mspec", workers=4)
    b = write_synth_mspec(preset("small"), 0, profile, tmp_path / "gpu.mspec", workers=4, device="cuda")
    assert a.path.read_bytes() == b.path.read_bytes()
