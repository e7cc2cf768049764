"""Gated DeltaNet: the recurrent and chunked forms agree, and both agree with HF's torch forms."""

from __future__ import annotations

import numpy as np
import pytest

from oracle.qwen3_5 import delta_rule_chunked, delta_rule_recurrent, l2norm


def _inputs(T, hv=3, dk=16, dv=8, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed)
    q = l2norm(rng.standard_normal((hv, T, dk))) * dk ** -0.5
    k = l2norm(rng.standard_normal((hv, T, dk)))
    v = rng.standard_normal((hv, T, dv))
    beta = 1 / (1 + np.exp(-rng.standard_normal((hv, T))))
    g = -np.exp(rng.uniform(-4, 1, (hv, T)))                     # decays from ~0.98 to ~0.07
    S0 = rng.standard_normal((hv, dk, dv)) * 0.3
    return [x.astype(dtype) for x in (q, k, v, beta, g, S0)]


@pytest.mark.parametrize("T", [1, 63, 64, 65, 130])
def test_chunked_equals_recurrent_float64(T):
    args = _inputs(T)
    o_r, s_r = delta_rule_recurrent(*args)
    o_c, s_c = delta_rule_chunked(*args)
    assert np.max(np.abs(o_r - o_c)) <= 1e-10 * max(1.0, np.max(np.abs(o_r)))
    assert np.max(np.abs(s_r - s_c)) <= 1e-10 * max(1.0, np.max(np.abs(s_r)))


@pytest.mark.parametrize("T", [1, 65, 130])
def test_chunked_equals_recurrent_float32(T):
    args = _inputs(T, dtype=np.float32, seed=1)
    o_r, s_r = delta_rule_recurrent(*args)
    o_c, s_c = delta_rule_chunked(*args)
    assert o_c.dtype == np.float32
    assert np.max(np.abs(o_r - o_c)) <= 1e-4 * np.max(np.abs(o_r))
    assert np.max(np.abs(s_r - s_c)) <= 1e-4 * np.max(np.abs(s_r))


def test_chunk_size_does_not_matter_and_state_carries_over():
    args = _inputs(100, seed=2)
    o64, s64 = delta_rule_chunked(*args)
    o7, s7 = delta_rule_chunked(*args, chunk=7)
    assert np.allclose(o64, o7, rtol=0, atol=1e-10) and np.allclose(s64, s7, rtol=0, atol=1e-10)
    q, k, v, beta, g, S0 = args                                   # split the sequence in two calls
    o_a, s_a = delta_rule_chunked(q[:, :37], k[:, :37], v[:, :37], beta[:, :37], g[:, :37], S0)
    o_b, s_b = delta_rule_chunked(q[:, 37:], k[:, 37:], v[:, 37:], beta[:, 37:], g[:, 37:], s_a)
    assert np.allclose(np.concatenate([o_a, o_b], 1), o64, atol=1e-10) and np.allclose(s_b, s64, atol=1e-10)


def test_inputs_are_not_mutated():
    args = _inputs(70, seed=3)
    copies = [a.copy() for a in args]
    delta_rule_chunked(*args)
    delta_rule_recurrent(*args)
    assert all(np.array_equal(a, c) for a, c in zip(args, copies))


@pytest.mark.parametrize("T", [1, 65, 130])
def test_both_forms_match_hf_torch_reference(T):
    torch = pytest.importorskip("torch")
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    rng = np.random.default_rng(4)
    hk, hv, dk, dv = 2, 6, 16, 8
    q = rng.standard_normal((1, T, hk, dk))
    k = rng.standard_normal((1, T, hk, dk))
    v = rng.standard_normal((1, T, hv, dv))
    beta = 1 / (1 + np.exp(-rng.standard_normal((1, T, hv))))
    g = -np.exp(rng.uniform(-4, 1, (1, T, hv)))
    S0 = rng.standard_normal((1, hv, dk, dv)) * 0.3
    t = lambda x: torch.from_numpy(x).double()                     # noqa: E731
    # 5.17's rule functions want q/k already repeated to the value heads (the layer does it)
    qr, kr = (np.repeat(x, hv // hk, axis=2) for x in (q, k))
    for fn in (hf.torch_chunk_gated_delta_rule, hf.torch_recurrent_gated_delta_rule):
        ref, ref_s = fn(t(qr), t(kr), t(v), t(g), t(beta), initial_state=t(S0), output_final_state=True,
                        use_qk_l2norm_in_kernel=True)
        # the oracle's contract: value head j reads q/k head j // (hv/hk), l2norm + scale outside
        rep = lambda x: np.repeat(x[0], hv // hk, axis=1).transpose(1, 0, 2)   # noqa: E731
        qo, ko = l2norm(rep(q)) * dk ** -0.5, l2norm(rep(k))
        for rule in (delta_rule_recurrent, delta_rule_chunked):
            o, s = rule(qo, ko, v[0].transpose(1, 0, 2), beta[0].T, g[0].T, S0[0])
            # HF casts every input to float32 inside the rule, so float32-level agreement is the bar
            ref_o = ref[0].numpy()
            assert np.max(np.abs(o.transpose(1, 0, 2) - ref_o)) < 2e-5 * np.max(np.abs(ref_o)), fn.__name__
            assert np.max(np.abs(s - ref_s[0].numpy())) < 2e-5 * np.max(np.abs(s))
