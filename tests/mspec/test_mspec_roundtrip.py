"""Round-trip properties of the writer/reader over random dtypes and shapes (0-d and zero-size)."""

from __future__ import annotations

import ctypes
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from modeld.mspec import PlannedObject, blob_object, open_mspec, write_mspec
from modeld.mspec import errors as E
from modeld.mspec import format as F

DTYPES = sorted(F.DTYPES)
names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._/-", min_size=1, max_size=24)
shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)


def _raw(t: torch.Tensor) -> bytes:
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _make(dtype: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    n = math.prod(shape) * F.DTYPES[dtype][0]
    raw = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    if dtype == "bool":
        raw = raw % 2
    torch_dtype = getattr(torch, F.DTYPES[dtype][1])
    return raw.view(torch_dtype).reshape(shape) if n else torch.empty(shape, dtype=torch_dtype)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(names, st.tuples(st.sampled_from(DTYPES), shapes, st.integers(0, 2**31)),
                       min_size=0, max_size=8),
       st.binary(max_size=300), st.randoms(use_true_random=False))
def test_round_trip_any_dtypes_and_shapes(tmp_path_factory, spec, blob, rnd):
    tensors = {name: _make(dtype, shape, seed) for name, (dtype, shape, seed) in spec.items()}
    plan = [PlannedObject(n, "tensor", spec[n][0], spec[n][1], F.PLAIN, (lambda t=t: t)) for n, t in tensors.items()]
    plan.append(blob_object("tokenizer/blob~", blob))
    rnd.shuffle(plan)                                      # write order must not matter
    tmp = tmp_path_factory.mktemp("rt")
    d1 = write_mspec(tmp / "a.mspec", model_id="m", family="f", recipe={}, metadata={}, objects=plan)
    rnd.shuffle(plan)
    d2 = write_mspec(tmp / "b.mspec", model_id="m", family="f", recipe={}, metadata={}, objects=plan)
    assert d1.weights_id == d2.weights_id and d1.tokenizer_id == d2.tokenizer_id
    assert (tmp / "a.mspec").read_bytes() == (tmp / "b.mspec").read_bytes()
    with open_mspec(tmp / "a.mspec", verify=True) as m:
        assert [o.name for o in m.objects] == sorted([*tensors, "tokenizer/blob~"])
        for name, t in tensors.items():
            got = m.tensor(name)
            assert got.dtype == t.dtype and tuple(got.shape) == tuple(t.shape)
            assert _raw(got) == _raw(t)
        assert m.blob("tokenizer/blob~") == blob
    size = (tmp / "a.mspec").stat().st_size
    assert size % F.ALIGNMENT == 0 or not spec and not blob


def test_tensors_are_zero_copy_views_of_the_mapping(tmp_path):
    t = torch.arange(4096, dtype=torch.float32).reshape(64, 64)
    write_mspec(tmp_path / "z.mspec", model_id="m", family="f", recipe={}, metadata={},
                objects=[PlannedObject("w", "tensor", "float32", (64, 64), F.PLAIN, lambda: t)])
    m = open_mspec(tmp_path / "z.mspec")
    base = ctypes.addressof(ctypes.c_char.from_buffer(m._mm))
    got = m.tensor("w")
    assert got.data_ptr() == base + m.payload_offset + m.entry("w").offset
    assert torch.equal(got, t)
    got[0, 0] = -1.0                                  # private mapping: the file is untouched
    assert open_mspec(tmp_path / "z.mspec").tensor("w")[0, 0] == 0.0


def test_weights_id_covers_tensors_only_and_matches_interfaces_formula(tmp_path):
    import hashlib
    import json

    t = torch.ones(2, 2, dtype=torch.bfloat16)
    plan = [PlannedObject("x", "tensor", "bfloat16", (2, 2), F.PLAIN, lambda: t)]
    d = write_mspec(tmp_path / "a.mspec", model_id="m", family="f", recipe={}, metadata={},
                    objects=plan + [blob_object("tokenizer/tokenizer.json", b"A")])
    e = write_mspec(tmp_path / "b.mspec", model_id="m", family="f", recipe={}, metadata={},
                    objects=plan + [blob_object("tokenizer/tokenizer.json", b"B")])
    assert d.weights_id == e.weights_id and d.tokenizer_id != e.tokenizer_id
    digest = hashlib.sha256(_raw(t)).hexdigest()
    inv = json.dumps([{"dtype": "bfloat16", "layout": "plain", "name": "x", "sha256": digest, "shape": [2, 2]}],
                     sort_keys=True, separators=(",", ":"))
    assert d.weights_id == "sha256:" + hashlib.sha256(b"modeld/weights-id/mspec-inventory/v1\x00" + inv.encode()).hexdigest()


def test_writer_rejects_inconsistent_producers(tmp_path):
    bad = PlannedObject("x", "tensor", "float32", (2,), F.PLAIN, lambda: torch.zeros(3))
    with pytest.raises(E.MspecWriteError):
        write_mspec(tmp_path / "w.mspec", model_id="m", family="f", recipe={}, metadata={}, objects=[bad])
    assert not list(tmp_path.iterdir())                # the partial file is removed
    dup = [PlannedObject("x", "tensor", "float32", (1,), F.PLAIN, lambda: torch.zeros(1))] * 2
    with pytest.raises(E.MspecWriteError):
        write_mspec(tmp_path / "w.mspec", model_id="m", family="f", recipe={}, metadata={}, objects=dup)
    wrong_dtype = PlannedObject("x", "tensor", "bfloat16", (1,), F.PLAIN, lambda: torch.zeros(1))
    with pytest.raises(E.MspecWriteError):
        write_mspec(tmp_path / "w.mspec", model_id="m", family="f", recipe={}, metadata={}, objects=[wrong_dtype])
    with pytest.raises(E.MspecBadName):
        write_mspec(tmp_path / "w.mspec", model_id="m", family="f", recipe={}, metadata={},
                    objects=[PlannedObject("a\nb", "tensor", "float32", (1,), F.PLAIN, lambda: torch.zeros(1))])
