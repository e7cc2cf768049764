"""Build small .mspec files and re-seal edited ones: the raw material of tests and the fuzzer.

`sample_objects()` gives a deterministic set of objects covering every dtype, 0-d and zero-size
tensors, quantized layouts and a tokenizer blob. `reseal(directory_dict, payload)` re-serializes an
*edited* directory and recomputes what a careless or hostile writer would: the header and the
directory hash, and optionally the identities and recipe hash, so a test or the fuzzer can reach
any validation step behind the hash check. Pure functions (return bytes); no file I/O.
"""

from __future__ import annotations

import json

from modeld.mspec import format as F
from modeld.mspec.writer import PlannedObject, blob_object


def _tensor(name: str, dtype: str, shape: tuple[int, ...], seed: int, layout: str = F.PLAIN) -> PlannedObject:
    def produce():
        import torch

        torch_dtype = getattr(torch, F.DTYPES[dtype][1])
        n = 1
        for d in shape:
            n *= d
        g = torch.Generator().manual_seed(seed)
        raw = torch.randint(0, 256, (n * F.DTYPES[dtype][0],), dtype=torch.uint8, generator=g)
        if dtype == "bool":
            raw = raw % 2
        return raw.view(torch_dtype).reshape(shape) if n else torch.empty(shape, dtype=torch_dtype)

    return PlannedObject(name, "tensor", dtype, shape, layout, produce)


def sample_objects() -> list[PlannedObject]:
    objs = [_tensor(f"t.{dtype}", dtype, (3, 5) if i % 2 else (7,), i) for i, dtype in enumerate(sorted(F.DTYPES))]
    objs += [
        _tensor("scalar.f32", "float32", (), 100),
        _tensor("empty.bf16", "bfloat16", (0, 4), 101),
        _tensor("lin.qweight", "uint8", (4, 64), 102, F.int4_layout(128)),
        _tensor("lin.scales", "float16", (4, 1), 103, F.int4_layout(128)),
        _tensor("lin.mins", "float16", (4, 1), 104, F.int4_layout(128)),
        _tensor("fp8.weight", "float8_e4m3fn", (4, 8), 105, F.FP8_LAYOUT),
        _tensor("fp8.weight_scale", "float32", (4,), 106, F.FP8_LAYOUT),
        blob_object("tokenizer/tokenizer.json", b'{"version":"1.0","model":{}}'),
    ]
    return objs


SAMPLE_IDENTITY = {"model_id": "test/sample", "family": "test", "recipe": {"profile": "bf16", "source": "synthetic"},
                   "metadata": {"chat_template": "{{ messages }}", "config": {"hidden_size": 8}}}


def split(data: bytes) -> tuple[dict, bytes]:
    """(directory dict, payload bytes) of a well-formed file."""
    _, _, header = F.unpack_header(data[:F.HEADER_SIZE])
    raw = data[F.HEADER_SIZE:F.HEADER_SIZE + header.directory_length]
    return json.loads(raw), data[header.payload_offset:]


def reseal(directory: dict, payload: bytes, *, fix_identities: bool = True) -> bytes:
    """Serialize `directory`, recompute header (and identities unless told not to), append payload."""
    if fix_identities:
        try:
            objects = directory["objects"]
            chat = directory["metadata"].get("chat_template")
            directory["model"]["weights_id"] = F.weights_id(objects)
            directory["model"]["tokenizer_id"] = F.tokenizer_id(objects, chat)
            directory["recipe_hash"] = F.recipe_hash(directory["recipe"])
        except (KeyError, TypeError, AttributeError, ValueError):
            pass   # a deliberately broken directory: leave identities as they are
    raw = json.dumps(directory, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
    header = F.pack_header(raw)
    _, _, h = F.unpack_header(header)
    return header + raw + bytes(h.payload_offset - F.HEADER_SIZE - len(raw)) + payload
