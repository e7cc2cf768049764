"""Checkpoints inside a prefill piece (EngineOptions.prefill_chunk > checkpoint_every; tiny preset, reference
kernels): the forward's GDN snapshots fill an entry at every multiple of checkpoint_every, holding the state a
prefill that stopped there leaves; the snapshots change no logits; a trim restores them and re-evaluates fewer than
checkpoint_every tokens; a piece that fails half-way commits none of its entries."""

from __future__ import annotations

import pytest
import torch

from engine_support import make_engine, random_prompt


def _entry(eng, position: int) -> dict[str, torch.Tensor]:
    ck = eng.ckpts[0]
    j = ck.positions.index(position)
    return {n: ck.arena[f"{j}:{n}"].clone() for n in ck.names}


@pytest.fixture(scope="module")
def long_piece(ckpt_dir):
    return make_engine(ckpt_dir("tiny"), capacity=128, prefill_chunk=64, checkpoint_every=16, checkpoints=4)


def test_entries_inside_the_piece_hold_the_state_at_their_position(long_piece, ckpt_dir):
    prompt = random_prompt(1024, 100, 31)
    long_piece.reset_slot(0)
    long_piece.prefill(0, prompt)
    # pieces [0, 64) and [64, 100): 16 / 32 / 48 inside the first, 80 / 96 inside the second; the newest 4 remain
    assert long_piece.ckpts[0].held() == [64, 80, 96, 100]
    for p in (80, 96):  # a prefill that stops at p, in one piece from the checkpoint at 64 (same GEMM rows)
        short = make_engine(ckpt_dir("tiny"), capacity=128, prefill_chunk=64, checkpoint_every=64, checkpoints=2)
        short.prefill(0, prompt[:p])
        want = {n: short.state[n][0] for n in short.ckpts[0].names}
        got = _entry(long_piece, p)
        assert got.keys() == want.keys() and len(got) == 2 * 3  # conv + recurrent state of the tiny preset's GDNs
        for n in want:  # the same rows through the same kernels: bit for bit
            assert torch.equal(got[n], want[n]), (p, n, float((got[n].float() - want[n].float()).abs().max()))


def test_snapshots_leave_the_logits_alone(long_piece, ckpt_dir):
    """The GDN layers run in segments when a piece holds checkpoints; the reference kernels carry their state across
    calls exactly, so the piece's logits equal those of the same piece run whole, bit for bit."""
    prompt = random_prompt(1024, 64, 32)
    whole = make_engine(ckpt_dir("tiny"), capacity=128, prefill_chunk=64, checkpoint_every=64, checkpoints=2)
    long_piece.reset_slot(0)
    assert torch.equal(long_piece.prefill(0, prompt), whole.prefill(0, prompt))
    assert long_piece.ckpts[0].held() == [16, 32, 48, 64]


def test_trim_restores_an_entry_from_inside_a_piece(long_piece, ckpt_dir):
    prompt = random_prompt(1024, 101, 33)
    long_piece.reset_slot(0)
    long_piece.prefill(0, prompt[:100])
    assert long_piece.truncate(0, 90, prompt) == 10  # from the entry at 80, not from 64
    long_piece.decode([prompt[90]])
    fresh = make_engine(ckpt_dir("tiny"), capacity=128, prefill_chunk=64, checkpoint_every=16, checkpoints=4)
    fresh.prefill(0, prompt[:90])
    fresh.decode([prompt[90]])
    a, b = long_piece.logits[0], fresh.logits[0]
    assert int(a.argmax()) == int(b.argmax()) and float((a - b).abs().max()) < 0.1


def test_a_failed_piece_commits_no_entry(ckpt_dir, monkeypatch):
    eng = make_engine(ckpt_dir("tiny"), capacity=128, prefill_chunk=64, checkpoint_every=16, checkpoints=4)
    prompt = random_prompt(1024, 64, 34)
    eng.prefill(0, prompt[:16])
    assert eng.ckpts[0].held() == [16]
    calls = []

    def failing_write(entry, name, value):
        calls.append(name)
        if len(calls) == 3:
            raise RuntimeError("device lost")

    monkeypatch.setattr(eng.ckpts[0], "write", failing_write)
    with pytest.raises(RuntimeError, match="device lost"):
        eng.prefill(0, prompt[16:])
    assert eng.ckpts[0].held() == [16]  # the entries reserved for 32 / 48 stay uncommitted


def test_reserve_keeps_the_newest_and_never_hands_out_an_entry_twice():
    from modeld.execution.arena import Arena, BufferSpec
    from modeld.execution.checkpoints import StateCheckpoints

    state = Arena.from_specs([BufferSpec("s", (1, 2), torch.float32)], "cpu")
    ck = StateCheckpoints(state, ["s"], 2)
    ck.save(0, 4)
    got = ck.reserve([8, 12, 16])
    assert sorted(got) == [12, 16] and len(set(got.values())) == 2 and ck.held() == []
    for p, j in got.items():
        ck.write(j, "s", torch.full((2,), float(p)))
        ck.commit(j, p)
    assert ck.held() == [12, 16] and float(ck.arena[f"{got[16]}:s"][0]) == 16.0
    assert StateCheckpoints(state, ["s"], 0).reserve([8]) == {}


def test_in_pass_snapshots_are_the_segments_bit_for_bit(ckpt_dir, monkeypatch):
    """Triton kernels (interpreter on CPU): one 200-token piece checkpointed every 64 tokens fills the same entries
    and gives the same logits whether the GDN keeps the checkpoints in its state pass or runs in segments
    (kernels/gdn/triton.py SNAPSHOTS_ENV); the conv states come from the forward's input windows either way."""
    from modeld.kernels.gdn import triton as gdn_tt
    from modeld.execution.bindings import triton_kernels

    prompt = random_prompt(1024, 200, 35)
    runs = {}
    for mode in gdn_tt.SNAPSHOT_MODES:
        monkeypatch.setenv(gdn_tt.SNAPSHOTS_ENV, mode)
        eng = make_engine(ckpt_dir("tiny"), kernels=triton_kernels(), capacity=256, prefill_chunk=256,
                          checkpoint_every=64, checkpoints=4)
        logits = eng.prefill(0, prompt).clone()
        assert eng.ckpts[0].held() == [64, 128, 192, 200]
        runs[mode] = logits, [_entry(eng, p) for p in (64, 128, 192)]
    (logits_a, entries_a), (logits_b, entries_b) = runs.values()
    assert torch.equal(logits_a, logits_b)
    for got, want in zip(entries_a, entries_b):
        assert all(torch.equal(got[n], want[n]) for n in want)


@pytest.mark.parametrize("offsets", [(1,), (2,), (3,), (1, 2, 40), (5, 64)], ids=["r1", "r2", "r3", "mixed", "wide"])
def test_conv_snapshot_is_the_state_a_conv_ending_there_leaves(offsets):
    """The forward's conv snapshot at offset r (a window of [state; inputs], W - 1 = 3 rows) equals the state the
    conv kernel leaves after a call over the first r inputs — also for r < W - 1, where the window still reaches
    into the state (a piece that starts one or two tokens before a checkpoint, after a prefix hit)."""
    from modeld.execution.step import StepContext
    from modeld.kernels.conv1d import reference as conv
    from modeld.models.qwen3_5.forward import Qwen35Forward

    C, W, N = 24, 4, 70
    gen = torch.Generator().manual_seed(len(offsets) * 100 + offsets[0])
    state = torch.randn(W - 1, C, generator=gen).bfloat16()
    mixed = torch.randn(N, C + 8, generator=gen).bfloat16()[:, :C]   # a column slice, as the model passes it
    got = {}
    ctx = StepContext(decode=False, positions=torch.arange(N), slot=1, snapshots=offsets,
                      snapshot=lambda r, name, value: got.setdefault((r, name), value.clone()))
    fwd = Qwen35Forward.__new__(Qwen35Forward)   # only its state map is read
    fwd.s = {"gdn.7.conv": torch.stack([torch.zeros_like(state), state])}
    fwd._conv_with_snapshots(7, mixed, ctx)
    assert sorted(got) == [(r, "gdn.7.conv") for r in offsets]
    weight = torch.randn(C, W, generator=gen).bfloat16()
    for r in offsets:
        s = state.clone()
        conv.causal_conv1d_prefill(mixed[:r].contiguous(), weight, s)
        assert torch.equal(got[(r, "gdn.7.conv")], s), r
