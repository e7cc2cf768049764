"""execution.sampler.SlotSampler: the unfiltered draw (no vocabulary sort) is taken exactly when no slot filters,
the top-k draw (MODELD_SAMPLER_TOPK=1) exactly when every filtering slot has 1 <= top_k <= TOPK_MAX; each gives
the ids `sample` gives; the step counters advance either way."""

from __future__ import annotations

import pytest
import torch

from modeld.execution import sampler as sampler_mod
from modeld.execution.sampler import SlotSampler
from modeld.kernels.sampling import reference as ref


class _Counting:
    """The reference sampling module, counting which entry point each pick used."""

    def __init__(self):
        self.calls = []

    def sample(self, *a):
        self.calls.append("sample")
        return ref.sample(*a)

    def sample_unfiltered(self, *a):
        self.calls.append("unfiltered")
        return ref.sample_unfiltered(*a)

    def sample_top_k(self, *a):
        self.calls.append(f"top_k {a[-1]}")
        return ref.sample_top_k(*a)


# (temperature, top_k, top_p) of two slots -> whether the sort is needed
CASES = [
    (((0.0, 0, 1.0), (0.0, 0, 1.0)), False),  # greedy
    (((0.0, 40, 0.9), (0.0, 0, 1.0)), False),  # greedy rows ignore their filters
    (((0.8, 0, 1.0), (1.0, 0, 1.0)), False),  # temperature only
    (((0.8, 0, 1.0), (0.7, 40, 1.0)), True),  # one slot's top-k
    (((0.8, 0, 0.95), (0.0, 0, 1.0)), True),  # one slot's top-p
]


@pytest.mark.parametrize("params,filters", CASES)
def test_unfiltered_exactly_when_no_slot_filters(params, filters, monkeypatch):
    monkeypatch.setenv(sampler_mod.TOPK_ENV, "0")  # the sort for filtered picks (the top-k route: tests below)
    op = _Counting()
    s = SlotSampler(op, 2, torch.device("cpu"))
    for slot, (t, k, p) in enumerate(params):
        s.configure(slot, temperature=t, top_k=k, top_p=p, seed=1234 + slot)
    assert s.filters is filters
    logits = torch.randn(2, 1000, generator=torch.Generator().manual_seed(7)) * 3
    got = [s.pick(logits) for _ in range(4)]
    assert op.calls == ["sample" if filters else "unfiltered"] * 4
    assert s.step.tolist() == [4, 4]
    # the same draws through the full spec (its threshold sort included)
    for step, ids in enumerate(got):
        want = ref.sample(logits, s.temperature, s.top_k, s.top_p, s.seed, torch.full((2,), step, dtype=torch.int64))
        assert ids.tolist() == want.tolist()


def test_reconfiguring_a_slot_updates_the_choice():
    op = _Counting()
    s = SlotSampler(op, 1, torch.device("cpu"))
    s.configure(0, temperature=0.8, top_k=40, top_p=0.95, seed=0)
    assert s.filters
    s.configure(0, temperature=0.0, top_k=0, top_p=1.0, seed=0)
    assert not s.filters


# (temperature, top_k, top_p) of two slots -> the entry point with MODELD_SAMPLER_TOPK=1
TOPK_CASES = [
    (((0.8, 20, 0.8), (0.0, 0, 1.0)), "top_k 32"),  # Qwen's recommended settings beside a greedy slot
    (((0.8, 20, 0.8), (0.7, 3, 1.0)), "top_k 32"),  # the largest top_k sets k_max
    (((0.8, 64, 1.0), (0.7, 0, 1.0)), "top_k 64"),  # a power of two is its own bound; filters off ride along
    (((0.8, 20, 0.8), (0.7, 0, 0.9)), "sample"),  # top-p alone needs the sort
    (((0.8, 2000, 0.9), (0.0, 0, 1.0)), "sample"),  # top_k above TOPK_MAX
    (((0.8, 0, 1.0), (0.0, 5, 0.5)), "unfiltered"),  # nothing filters
]


@pytest.mark.parametrize("params,want_call", TOPK_CASES)
def test_top_k_path_when_every_filtering_slot_has_a_bounded_top_k(params, want_call, monkeypatch):
    monkeypatch.setenv(sampler_mod.TOPK_ENV, "1")
    op = _Counting()
    s = SlotSampler(op, 2, torch.device("cpu"))
    for slot, (t, k, p) in enumerate(params):
        s.configure(slot, temperature=t, top_k=k, top_p=p, seed=99 + slot)
    logits = torch.randn(2, 3000, generator=torch.Generator().manual_seed(3)) * 3
    got = [s.pick(logits) for _ in range(3)]
    assert op.calls == [want_call] * 3
    for step, ids in enumerate(got):
        want = ref.sample(logits, s.temperature, s.top_k, s.top_p, s.seed, torch.full((2,), step, dtype=torch.int64))
        assert ids.tolist() == want.tolist()


def test_top_k_path_follows_the_switch(monkeypatch):
    """Unset: TOPK_PATH (on since session 13); "0" sorts; anything but 0 / 1 is an error."""
    op = _Counting()
    s = SlotSampler(op, 1, torch.device("cpu"))
    s.configure(0, temperature=0.8, top_k=20, top_p=0.8, seed=0)
    logits = torch.randn(1, 100)
    monkeypatch.delenv(sampler_mod.TOPK_ENV, raising=False)
    s.pick(logits)
    monkeypatch.setenv(sampler_mod.TOPK_ENV, "0")
    s.pick(logits)
    assert op.calls == (["top_k 32"] if sampler_mod.TOPK_PATH else ["sample"]) + ["sample"]
    assert s.top_k_bound(16) == 16  # never above the vocabulary
    monkeypatch.setenv(sampler_mod.TOPK_ENV, "yes")
    with pytest.raises(ValueError, match="MODELD_SAMPLER_TOPK"):
        s.pick(logits)
