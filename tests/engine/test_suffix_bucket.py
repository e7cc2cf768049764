"""The padded suffix step (`EngineOptions.suffix_bucket`) on the tiny preset with the reference kernels (eager; on
CUDA the same step is a captured graph): the last piece of a prefill runs padded to the bucket, and the pad rows
leave no trace — the logits, the GDN/conv state and what decodes next match the plain prefill; reuse stays exact."""

from __future__ import annotations

import pytest
import torch

from engine_support import make_engine, random_prompt
from modeld.execution.errors import StateCapacityError

BUCKET = 16


@pytest.fixture(scope="module")
def pair(ckpt_dir):
    opts = dict(capacity=96, prefill_chunk=32, checkpoint_every=32, checkpoints=2)
    return (make_engine(ckpt_dir("tiny"), **opts),
            make_engine(ckpt_dir("tiny"), suffix_bucket=BUCKET, **opts))


def _count_bucket_steps(eng) -> list:
    calls = []
    g = eng._buckets[0]
    real = g.fn
    g.fn = lambda: calls.append(1) or real()
    return calls


def _fixed_state(eng):
    return {n: eng.state[n][0].clone() for n in eng.spec.fixed_names()}


@pytest.mark.parametrize("n", [1, 5, 16, 37, 48])  # short prompts, a full bucket, and suffixes after 32-token pieces
def test_bucketed_prefill_matches_plain(pair, n):
    plain, bucketed = pair
    prompt = random_prompt(1024, n, 40 + n)
    for eng in pair:
        eng.reset_slot(0)
    calls = _count_bucket_steps(bucketed)
    a = plain.prefill(0, prompt).clone()
    b = bucketed.prefill(0, prompt).clone()
    assert calls == [1], "the last piece must take the padded step"
    assert bucketed.lengths[0] == plain.lengths[0] == n
    assert int(a.argmax()) == int(b.argmax()) and float((a - b).abs().max()) < 0.05
    sa, sb = _fixed_state(plain), _fixed_state(bucketed)
    for name in sa:  # conv state = the last real inputs, recurrent state untouched by the pad rows
        assert float((sa[name].float() - sb[name].float()).abs().max()) < 0.05, name
    kv = plain.spec.kv_names()[0]
    assert float((plain.state[kv][0, :n].float() - bucketed.state[kv][0, :n].float()).abs().max()) < 0.05
    ta = [int(plain.decode([int(a.argmax())]).argmax())]
    tb = [int(bucketed.decode([int(b.argmax())]).argmax())]
    assert ta == tb


def test_bucket_reuse_is_exact(pair):
    """The warm path (trim to a checkpointed prefix, prefill a new suffix) equals a cold prefill bit for bit: both
    take the bucket for their last piece."""
    _, eng = pair
    prefix, turn, last = random_prompt(1024, 32, 1), random_prompt(1024, 9, 2), random_prompt(1024, 11, 3)
    eng.reset_slot(0)
    want = eng.prefill(0, prefix + turn).clone()
    eng.reset_slot(0)
    eng.prefill(0, prefix + last)
    eng.truncate(0, 32, prefix)
    got = eng.prefill(0, turn).clone()
    assert torch.equal(got, want)


def test_a_suffix_across_a_checkpoint_position_keeps_the_bucket(pair):
    """A last piece crossing a multiple of checkpoint_every (28..38 over 32) still takes the padded step; the
    checkpoint at 32 is dropped (the end's is saved), where the plain engine saves it from a forward snapshot."""
    plain, bucketed = pair
    prefix, turn = random_prompt(1024, 28, 11), random_prompt(1024, 10, 12)
    for eng in pair:
        eng.reset_slot(0)
        eng.prefill(0, prefix)
    calls = _count_bucket_steps(bucketed)
    a, b = plain.prefill(0, turn), bucketed.prefill(0, turn)
    assert calls == [1] and int(a.argmax()) == int(b.argmax()) and torch.allclose(a, b, atol=0.05)
    assert plain.ckpts[0].held() == [32, 38] and bucketed.ckpts[0].held() == [28, 38]


def test_bucket_near_capacity_falls_back(pair):
    """A last piece whose padded rows would pass the capacity runs unpadded (the same logits as plain)."""
    plain, bucketed = pair
    prompt = random_prompt(1024, 90, 7)  # the last piece (64..90) has 26 tokens: more than the bucket
    for eng in pair:
        eng.reset_slot(0)
    calls = _count_bucket_steps(bucketed)
    assert torch.allclose(plain.prefill(0, prompt), bucketed.prefill(0, prompt), atol=0.05)
    tail = random_prompt(1024, 3, 8)  # start 90: 90 + 16 > 96, so eager
    assert torch.allclose(plain.prefill(0, tail), bucketed.prefill(0, tail), atol=0.05)
    assert calls == []


def test_bucket_option_is_checked(ckpt_dir):
    with pytest.raises(StateCapacityError, match="suffix_bucket"):
        make_engine(ckpt_dir("tiny"), capacity=32, suffix_bucket=64)


def test_bucketed_prefill_on_the_triton_kernels(ckpt_dir):
    """The same on the Triton kernels (CPU interpreter): the pad rows' b = a = -inf go through the chunked GDN
    kernels' gate math (beta = 0, g = 0, no NaN) and attention_prefill_at reads its start on the device."""
    from modeld.execution.bindings import triton_kernels

    opts = dict(capacity=64, prefill_chunk=32, checkpoint_every=32, checkpoints=2)
    plain = make_engine(ckpt_dir("tiny"), kernels=triton_kernels(), **opts)
    bucketed = make_engine(ckpt_dir("tiny"), kernels=triton_kernels(), suffix_bucket=BUCKET, **opts)
    prompt = random_prompt(1024, 37, 5)
    a, b = plain.prefill(0, prompt).clone(), bucketed.prefill(0, prompt).clone()
    assert torch.isfinite(b).all() and int(a.argmax()) == int(b.argmax()) and float((a - b).abs().max()) < 0.05
    for name, sa in _fixed_state(plain).items():
        assert torch.isfinite(bucketed.state[name][0]).all(), name
        assert float((sa.float() - bucketed.state[name][0].float()).abs().max()) < 0.05, name
