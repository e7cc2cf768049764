"""Shared plumbing of the NumPy oracles: checkpoint reading, bf16 bit tricks, elementwise math.

Imports nothing from modeld (tests/oracle/test_independence.py enforces it) and nothing heavier
than NumPy: the oracle must run where torch does not.

Why a safetensors reader of our own: `safetensors.safe_open(..., framework="numpy")` raises
`TypeError: data type 'bfloat16' not understood` for BF16 tensors (NumPy has no bfloat16), and every
qwen3_5 checkpoint is mostly BF16. The format is one page (8-byte little-endian header length, a
JSON header of {name: {dtype, shape, data_offsets}}, then the bytes), so the oracle reads it
directly and widens BF16 to float32 by shifting the 16 stored bits into the high half of a uint32.
tests/oracle/test_checkpoint_io.py cross-checks this reader against `safe_open` on F32/F16 tensors.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass

import numpy as np


class OracleError(Exception):
    """Root of every intentional oracle error (the oracle cannot use modeld.errors)."""


class CheckpointError(OracleError):
    """The checkpoint directory is missing, malformed, or lacks / has extra tensors."""


# ---------------------------------------------------------------------------------------------
# bf16 <-> float32 by bit manipulation
# ---------------------------------------------------------------------------------------------

def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """uint16 bf16 bit patterns -> float32 (exact: bf16 is the high half of an IEEE float32)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """Round to the nearest bf16 value (ties to even), returned in x's dtype (f32 or f64).

    This is what torch does on every `.to(torch.bfloat16)` and on the output of every bf16 op.
    NaN stays NaN (the plain add-and-mask trick could turn a NaN payload into inf).
    """
    x32 = np.asarray(x, dtype=np.float32)
    bits = x32.view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    out = bits.astype(np.uint32).view(np.float32)
    out = np.where(np.isnan(x32), x32, out)
    return out.astype(np.asarray(x).dtype, copy=False)


# ---------------------------------------------------------------------------------------------
# safetensors reading (single file or a directory of shards)
# ---------------------------------------------------------------------------------------------

_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8}
_HEADER_CAP = 100 * 1024 * 1024  # a header larger than this is corrupt, not big


@dataclass(frozen=True)
class StoredTensor:
    """One tensor as stored: its file, dtype string ("BF16", "F32", ...), shape, byte range."""

    path: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


def _read_header(path: str) -> dict[str, StoredTensor]:
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise CheckpointError(f"{path}: shorter than the 8-byte safetensors header length")
        (n,) = struct.unpack("<Q", head)
        if n > _HEADER_CAP:
            raise CheckpointError(f"{path}: header length {n} exceeds {_HEADER_CAP}")
        header = json.loads(f.read(n))
    base = 8 + n
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] not in _DTYPES:
            raise CheckpointError(f"{path}: tensor {name} has unsupported dtype {meta['dtype']}")
        lo, hi = meta["data_offsets"]
        out[name] = StoredTensor(path, meta["dtype"], tuple(meta["shape"]), base + lo, base + hi)
    return out


def index_checkpoint(directory: str) -> dict[str, StoredTensor]:
    """Map every tensor name in `directory`'s *.safetensors files to where it is stored.

    Raises CheckpointError when there is no safetensors file or a name occurs twice.
    """
    if not os.path.isdir(directory):
        raise CheckpointError(f"checkpoint directory {directory!r} does not exist")
    files = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    if not files:
        raise CheckpointError(f"{directory}: no *.safetensors files")
    index: dict[str, StoredTensor] = {}
    for f in files:
        for name, t in _read_header(os.path.join(directory, f)).items():
            if name in index:
                raise CheckpointError(f"{directory}: tensor {name} stored twice ({f})")
            index[name] = t
    return index


def load_tensor(t: StoredTensor, dtype: type = np.float32) -> np.ndarray:
    """Read one stored tensor and return it as `dtype` (BF16 widened exactly)."""
    count = int(np.prod(t.shape)) if t.shape else 1
    raw = np.fromfile(t.path, dtype=_DTYPES[t.dtype], count=count, offset=t.start)
    if raw.nbytes != t.end - t.start:
        raise CheckpointError(f"{t.path}: byte range of a {t.dtype}{list(t.shape)} tensor is wrong")
    if t.dtype == "BF16":
        raw = bf16_bits_to_f32(raw)
    return raw.reshape(t.shape).astype(dtype, copy=False)


def read_config(directory: str) -> dict:
    """config.json of a Hugging Face checkpoint directory, as a dict."""
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        raise CheckpointError(f"{directory}: no config.json")
    with open(path) as f:
        return json.load(f)


# ---------------------------------------------------------------------------------------------
# elementwise math (float32 or float64 in, same dtype out)
# ---------------------------------------------------------------------------------------------

def sigmoid(x: np.ndarray) -> np.ndarray:
    # exp(-|x|) never overflows; the two branches are the same function.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype, copy=False)


def silu(x: np.ndarray) -> np.ndarray:
    return x * sigmoid(x)


def softplus(x: np.ndarray, threshold: float = 20.0) -> np.ndarray:
    """torch.nn.functional.softplus (beta 1): x above `threshold`, else log(1 + e^x)."""
    return np.where(x > threshold, x, np.log1p(np.exp(np.minimum(x, threshold)))).astype(x.dtype)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    return e / np.sum(e, axis=axis, keepdims=True)


def rms_normalize(x: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) over the last axis (no weight)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def rope_cos_sin(positions: np.ndarray, rotary_dim: int, theta: float,
                 dtype: type = np.float32) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [T, rotary_dim] for half-split RoPE (dim i pairs with i + rotary_dim/2).

    Inverse frequencies 1/theta^(2j/rotary_dim), j < rotary_dim/2, in `dtype` (HF: float32).
    """
    inv_freq = 1.0 / (dtype(theta) ** (np.arange(0, rotary_dim, 2, dtype=dtype) / dtype(rotary_dim)))
    freqs = positions.astype(dtype)[:, None] * inv_freq.astype(dtype)[None, :]  # [T, rotary_dim/2]
    emb = np.concatenate([freqs, freqs], axis=-1)                              # [T, rotary_dim]
    return np.cos(emb).astype(dtype), np.sin(emb).astype(dtype)


def rotate_half(x: np.ndarray) -> np.ndarray:
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
