"""attention: Triton vs reference (the spec) for causal GQA prefill with a prefix and split-KV decode.

Checks the output (poisoned torch.empty, so unwritten elements and unwritten split partials are
NaN) and the cache: the rows the call owns hold exactly k/v, every other row is unchanged.
"""

from __future__ import annotations

import pytest
import torch

from modeld.kernels._testing import assert_close, poison
from modeld.kernels.attention import reference as ref
from modeld.kernels.attention import triton as tt
from modeld.kernels.errors import KernelDtypeError, KernelShapeError, KernelStrideError, KernelValueError


@pytest.fixture
def poisoned_outputs(monkeypatch):
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: poison(real_empty(*a, **k)))


def _rand(shape, gen, device, scale=1.0):
    """Fresh normal values drawn ON `device` (GPU caches are large), seeded from the test's generator."""
    g = torch.Generator(device=device)
    g.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    return (torch.randn(*shape, generator=g, device=device) * scale).bfloat16()


def _check_prefill(t, start, hq, hkv, dh, s_cap, gated, gen, device):
    # q and gate as head-strided halves of one [T, Hq, 2*Dh] projection, as qwen3_5's q_proj gives them.
    qg = _rand((t, hq, 2 * dh), gen, device)
    q, gate = qg[..., :dh], (qg[..., dh:] if gated else None)
    k, v = _rand((t, hkv, dh), gen, device), _rand((t, hkv, dh), gen, device)
    kc, vc = _rand((s_cap, hkv, dh), gen, device), _rand((s_cap, hkv, dh), gen, device)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    got = tt.attention_prefill(q, k, v, kc, vc, start, dh**-0.5, gate)
    want = ref.attention_prefill(q, k, v, kc_ref, vc_ref, start, dh**-0.5, gate)
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref), "cache rows differ"
    assert_close(got, want, what=f"prefill T={t} start={start}")


def _check_decode(bsz, hq, hkv, dh, s_cap, lens, gated, gen, device):
    q, k, v = _rand((bsz, hq, dh), gen, device), _rand((bsz, hkv, dh), gen, device), _rand((bsz, hkv, dh), gen, device)
    gate = _rand((bsz, hq, dh), gen, device) if gated else None
    kc, vc = _rand((bsz, s_cap, hkv, dh), gen, device), _rand((bsz, s_cap, hkv, dh), gen, device)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    cache_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    got = tt.attention_decode(q, k, v, kc, vc, cache_lens, dh**-0.5, gate)
    want = ref.attention_decode(q, k, v, kc_ref, vc_ref, cache_lens, dh**-0.5, gate)
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref), "cache rows differ"
    assert cache_lens.tolist() == list(lens), "cache_lens must not be mutated"
    assert_close(got, want, what=f"decode B={bsz} lens={list(lens)[:4]}")


# (T, start, Hq, Hkv, Dh, S, gated)
PREFILL_CASES = [
    (1, 0, 4, 1, 64, 8, False),
    (63, 0, 6, 2, 64, 63, True),
    (37, 20, 6, 1, 64, 100, True),  # prefix of 20 cached tokens, GQA 6 (qwen3_5 ratio)
    (500, 0, 2, 1, 32, 512, False),
    (5, 3, 4, 2, 256, 8, True),  # Dh 256 (qwen3_5)
]


@pytest.mark.parametrize("t,start,hq,hkv,dh,s_cap,gated", PREFILL_CASES,
                         ids=[f"T{c[0]}-start{c[1]}-Hq{c[2]}-Hkv{c[3]}-Dh{c[4]}{'-gate' if c[6] else ''}" for c in PREFILL_CASES])
def test_prefill_matches_reference(t, start, hq, hkv, dh, s_cap, gated, gen, device, poisoned_outputs):
    _check_prefill(t, start, hq, hkv, dh, s_cap, gated, gen, device)


# (B, Hq, Hkv, Dh, S, cache_lens, gated)
DECODE_CASES = [
    (1, 6, 1, 64, 100, (63,), True),
    (3, 4, 2, 64, 500, (0, 499, 250), False),  # empty-prefix, full cache, middle: some splits empty
    (2, 24, 4, 256, 40, (17, 39), True),  # qwen3_5 heads
    (4, 3, 3, 32, 33, (1, 32, 16, 15), False),  # MHA (GQA 1)
]


@pytest.mark.parametrize("bsz,hq,hkv,dh,s_cap,lens,gated", DECODE_CASES,
                         ids=[f"B{c[0]}-Hq{c[1]}-Hkv{c[2]}-Dh{c[3]}-S{c[4]}{'-gate' if c[6] else ''}" for c in DECODE_CASES])
def test_decode_matches_reference(bsz, hq, hkv, dh, s_cap, lens, gated, gen, device, poisoned_outputs):
    _check_decode(bsz, hq, hkv, dh, s_cap, lens, gated, gen, device)


def test_reference_decode_equals_last_prefill_row(gen):
    """The spec is consistent: decoding token p equals the last row of prefilling 0..p."""
    t, hq, hkv, dh = 9, 4, 2, 32
    q, k, v = _rand((t, hq, dh), gen, "cpu"), _rand((t, hkv, dh), gen, "cpu"), _rand((t, hkv, dh), gen, "cpu")
    kc, vc = torch.zeros(16, hkv, dh, dtype=torch.bfloat16), torch.zeros(16, hkv, dh, dtype=torch.bfloat16)
    full = ref.attention_prefill(q, k, v, kc, vc, 0, 0.2)
    kc2, vc2 = torch.zeros(1, 16, hkv, dh, dtype=torch.bfloat16), torch.zeros(1, 16, hkv, dh, dtype=torch.bfloat16)
    kc2[0, : t - 1], vc2[0, : t - 1] = k[:-1], v[:-1]
    last = ref.attention_decode(q[-1:], k[-1:], v[-1:], kc2, vc2, torch.tensor([t - 1], dtype=torch.int32), 0.2)
    assert torch.equal(last[0], full[-1])


def test_num_splits_depends_on_capacity_not_length():
    assert tt.num_splits(1, 4, 32768, 32, 132) == 32
    assert tt.num_splits(16, 4, 32768, 32, 132) == 2
    assert tt.num_splits(1, 4, 20, 32, 132) == 1


def test_bad_inputs_raise(device):
    q, k = torch.zeros(2, 4, 64, dtype=torch.bfloat16, device=device), torch.zeros(2, 2, 64, dtype=torch.bfloat16, device=device)
    kc = torch.zeros(8, 2, 64, dtype=torch.bfloat16, device=device)
    with pytest.raises(KernelValueError):
        tt.attention_prefill(q, k, k, kc, kc.clone(), 7, 0.1)  # 7 + 2 > 8
    with pytest.raises(KernelValueError):
        tt.attention_prefill(q, k, k, kc, kc.clone(), 0, 0.0)
    with pytest.raises(KernelDtypeError):
        tt.attention_prefill(q.float(), k, k, kc, kc.clone(), 0, 0.1)
    with pytest.raises(KernelShapeError):
        tt.attention_prefill(q[:, :3], k, k, kc, kc.clone(), 0, 0.1)  # Hq 3 not a multiple of Hkv 2
    with pytest.raises(KernelStrideError):
        tt.attention_prefill(torch.zeros(2, 4, 128, dtype=torch.bfloat16, device=device)[..., ::2], k, k, kc, kc.clone(), 0, 0.1)
    kc4 = torch.zeros(2, 8, 2, 64, dtype=torch.bfloat16, device=device)
    with pytest.raises(KernelDtypeError):
        tt.attention_decode(q, k, k, kc4, kc4.clone(), torch.zeros(2, dtype=torch.int64, device=device), 0.1)
    with pytest.raises(KernelShapeError):
        tt.attention_decode(q, k, k, kc4, kc4.clone(), torch.zeros(3, dtype=torch.int32, device=device), 0.1)


# ---------------------------------------------------------------- GPU: qwen3_5 27B and llama shapes
@pytest.mark.gpu
@pytest.mark.parametrize("t,start", [(1, 0), (500, 0), (2048, 0), (300, 1000), (4096, 4096)])
@pytest.mark.parametrize("hq,hkv,dh,gated", [(24, 4, 256, True), (9, 3, 64, False)], ids=["qwen3_5", "smollm2"])
def test_gpu_prefill(t, start, hq, hkv, dh, gated, gen, device, poisoned_outputs):
    _check_prefill(t, start, hq, hkv, dh, start + t + 17, gated, gen, device)


@pytest.mark.gpu
@pytest.mark.parametrize("bsz,s_cap", [(1, 8192), (1, 32768), (4, 16384), (16, 4096)])
@pytest.mark.parametrize("hq,hkv,dh,gated", [(24, 4, 256, True), (9, 3, 64, False)], ids=["qwen3_5", "smollm2"])
def test_gpu_decode(bsz, s_cap, hq, hkv, dh, gated, gen, device, poisoned_outputs):
    lens = [int(torch.randint(0, s_cap, (1,), generator=gen)) for _ in range(bsz)]
    lens[0] = s_cap - 1
    _check_decode(bsz, hq, hkv, dh, s_cap, lens, gated, gen, device)


@pytest.mark.gpu
def test_gpu_random_shapes(gen, device, poisoned_outputs):
    for _ in range(8):
        hkv = int(torch.randint(1, 5, (1,), generator=gen))
        hq = hkv * int(torch.randint(1, 7, (1,), generator=gen))
        dh = [64, 128, 256][int(torch.randint(0, 3, (1,), generator=gen))]
        t = int(torch.randint(1, 1500, (1,), generator=gen))
        start = int(torch.randint(0, 700, (1,), generator=gen))
        _check_prefill(t, start, hq, hkv, dh, start + t, bool(t % 2), gen, device)
        bsz = int(torch.randint(1, 9, (1,), generator=gen))
        s_cap = int(torch.randint(1, 20000, (1,), generator=gen))
        lens = [int(torch.randint(0, s_cap, (1,), generator=gen)) for _ in range(bsz)]
        _check_decode(bsz, hq, hkv, dh, s_cap, lens, bool(bsz % 2), gen, device)
