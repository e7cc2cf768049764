"""The oracle's safetensors reader and bf16 bit tricks, against torch and safetensors."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from oracle._common import (CheckpointError, bf16_bits_to_f32, index_checkpoint, load_tensor,
                            round_bf16)

SPECIALS = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 1e-40, -1e-40, 3.4e38, 1.00390625,
                     1.005859375, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 65504.0, 2**-133], dtype=np.float32)


def test_round_bf16_matches_torch_on_random_ties_and_specials():
    rng = np.random.default_rng(0)
    scale = 10.0 ** rng.integers(-30, 30, 100_000)
    x = np.concatenate([SPECIALS, rng.standard_normal(100_000).astype(np.float32) * scale])
    # exact ties between two bf16 values (round half to even)
    ties = (np.arange(1, 5000, dtype=np.uint32) << 16 | 0x8000).view(np.float32)
    x = np.concatenate([x, ties, -ties]).astype(np.float32)
    ours = round_bf16(x)
    ref = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))


def test_round_bf16_keeps_nan_and_float64_dtype():
    x = np.array([np.nan, 1.0 + 2**-10], dtype=np.float64)
    out = round_bf16(x)
    assert out.dtype == np.float64 and np.isnan(out[0]) and out[1] == 1.0
    nan_payload = np.array([0x7F800001], dtype=np.uint32).view(np.float32)   # would round to inf
    assert np.isnan(round_bf16(nan_payload)[0])


def test_bf16_widening_is_exact():
    bits = np.arange(0, 1 << 16, dtype=np.uint16)
    ours = bf16_bits_to_f32(bits)
    ref = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).float().numpy()
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))


def test_reader_matches_safe_open_for_every_dtype(tmp_path):
    rng = np.random.default_rng(1)
    tensors = {"a": torch.from_numpy(rng.standard_normal((3, 5)).astype(np.float32)),
               "b": torch.from_numpy(rng.standard_normal(7).astype(np.float16)),
               "c": torch.randn(4, 2, 3).to(torch.bfloat16), "d": torch.arange(6, dtype=torch.int64),
               "scalar": torch.tensor(2.5)}
    save_file(tensors, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"e": torch.ones(2, 2)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    index = index_checkpoint(str(tmp_path))
    assert set(index) == {"a", "b", "c", "d", "e", "scalar"}
    assert index["c"].dtype == "BF16" and index["c"].shape == (4, 2, 3)
    with safe_open(str(tmp_path / "model-00001-of-00002.safetensors"), "pt") as f:
        for name in tensors:
            ours = load_tensor(index[name], np.float64)
            assert np.array_equal(ours, f.get_tensor(name).double().numpy()), name
    assert load_tensor(index["e"]).dtype == np.float32


def _raw_file(path, header: dict, data: bytes = b"", length: int | None = None):
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head) if length is None else length) + head + data)


@pytest.mark.parametrize("case", ["missing_dir", "no_files", "truncated", "huge_header", "duplicate",
                                  "bad_dtype", "short_data"])
def test_reader_errors(tmp_path, case):
    d = tmp_path / "ckpt"
    d.mkdir()
    if case == "missing_dir":
        d = tmp_path / "nope"
    elif case == "truncated":
        (d / "m.safetensors").write_bytes(b"\x01\x02")
    elif case == "huge_header":
        _raw_file(d / "m.safetensors", {}, length=1 << 40)
    elif case == "duplicate":
        save_file({"x": torch.ones(1)}, str(d / "a.safetensors"))
        save_file({"x": torch.ones(1)}, str(d / "b.safetensors"))
    elif case == "bad_dtype":
        meta = {"x": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}
        _raw_file(d / "m.safetensors", meta, b"\0" * 8)
    elif case == "short_data":
        meta = {"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}
        _raw_file(d / "m.safetensors", meta, b"\0" * 4)
    with pytest.raises(CheckpointError):
        index = index_checkpoint(str(d))
        load_tensor(index["x"])
