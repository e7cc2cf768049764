"""Engine state handling on the tiny preset: chunked prefill, capacity, trims without
checkpoints, slot-state bytes (format errors are named, nothing is written on failure)."""

from __future__ import annotations

import pytest
import torch

from engine_support import make_engine, random_prompt
from modeld.execution.errors import StateCapacityError
from modeld.models.qwen3_5.engine import StateFormatError


@pytest.fixture(scope="module")
def eng(ckpt_dir):
    return make_engine(ckpt_dir("tiny"), capacity=96, prefill_chunk=7, checkpoint_every=32, checkpoints=0)


def test_chunked_prefill_matches_one_shot(eng, ckpt_dir):
    one = make_engine(ckpt_dir("tiny"), capacity=96)
    prompt = random_prompt(1024, 70, 21)
    a = one.prefill(0, prompt).clone()
    b = eng.prefill(0, prompt).clone()  # 7-token chunks, split again at position 32 and 64
    assert eng.lengths[0] == 70
    assert int(a.argmax()) == int(b.argmax()) and float((a - b).abs().max()) < 0.1
    eng.reset_slot(0)


def test_capacity_and_empty_prefill(eng):
    eng.reset_slot(0)
    with pytest.raises(StateCapacityError):
        eng.prefill(0, [1] * 97)
    assert eng.lengths[0] == 0
    with pytest.raises(StateCapacityError):
        eng.prefill(0, [])
    eng.prefill(0, [1] * 96)
    with pytest.raises(StateCapacityError):
        eng.decode([2])
    eng.reset_slot(0)


def test_trim_without_checkpoints_reprefills_from_zero(eng):
    prompt = random_prompt(1024, 40, 22)
    eng.reset_slot(0)
    eng.prefill(0, prompt)
    assert eng.truncate(0, 25, prompt) == 25  # no checkpoint: all 25 re-evaluated
    eng.decode([prompt[25]])
    trimmed = eng.logits[0].clone()
    eng.reset_slot(0)
    eng.prefill(0, prompt[:25])
    eng.decode([prompt[25]])
    assert torch.equal(eng.logits[0], trimmed)  # same chunking (7-token chunks from 0): identical


def test_slot_bytes_roundtrip_and_errors(eng):
    eng.reset_slot(0)
    eng.prefill(0, random_prompt(1024, 12, 23))
    data = eng.save_slot(0)
    logits = eng.logits[0].clone()
    eng.reset_slot(0)
    assert eng.load_slot(0, data) == 12 and torch.equal(eng.logits[0], logits)
    assert eng.save_slot(0) == data
    for bad in (data[:10], b"X" + data[1:], data + b"\0", data[:-1]):
        with pytest.raises(StateFormatError):
            eng.load_slot(0, bad)
    assert eng.save_slot(0) == data  # failed loads wrote nothing
    digest_off = 16
    other = data[:digest_off] + bytes(32) + data[digest_off + 32:]
    with pytest.raises(StateFormatError):
        eng.load_slot(0, other)


def test_two_slots_decode_together_like_one_slot_each(ckpt_dir):
    """Slots are independent: prefilling each slot alone and decoding both in one step gives each
    sequence what a one-slot engine gives it."""
    two = make_engine(ckpt_dir("tiny"), slots=2, capacity=64)
    one = make_engine(ckpt_dir("tiny"), slots=1, capacity=64)
    prompts = [random_prompt(1024, 9, 24), random_prompt(1024, 13, 25)]
    for b, p in enumerate(prompts):
        two.prefill(b, p)
    assert two.lengths == [9, 13]
    for _ in range(3):
        nxt = [int(two.logits[b].argmax()) for b in range(2)]
        two.decode(nxt)
    for b, p in enumerate(prompts):
        one.reset_slot(0)
        logit = one.prefill(0, p)
        for _ in range(3):
            logit = one.decode([int(logit.argmax())])[0]
        assert int(logit.argmax()) == int(two.logits[b].argmax())
        assert float((logit - two.logits[b]).abs().max()) < 0.05
    with pytest.raises(StateCapacityError):
        two.decode([1])  # one token per slot


def test_a_slot_does_not_see_its_neighbours(ckpt_dir):
    """Slot 0's logits over 12 teacher-forced decode steps are bitwise the same whatever the other slots hold: the
    batched decode (M = slots) mixes nothing across slots. (Against a one-slot engine only float summation order
    differs, which bf16 rounding can lift to ~0.1 after a few steps; the test above bounds that.)"""
    prompts = [random_prompt(1024, 16, s) for s in (31, 32, 33)]
    forced = [random_prompt(1024, 12, s) for s in (41, 42, 43)]
    runs = []
    for neighbours in ((0, 0, 0), (0, 1, 2)):
        eng = make_engine(ckpt_dir("tiny"), slots=3, capacity=64)
        for b, case in enumerate(neighbours):
            eng.prefill(b, prompts[case])
        rows = [eng.decode([forced[case][i] for case in neighbours])[0].clone() for i in range(12)]
        runs.append(torch.stack(rows))
    assert torch.equal(runs[0], runs[1])
