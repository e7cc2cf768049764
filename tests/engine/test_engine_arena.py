"""Arena, state spec and checkpoint store (T1 building blocks)."""

from __future__ import annotations

import pytest
import torch

from modeld.convert.qwen3_5_spec import PRESETS, hf_config
from modeld.execution.arena import ALIGN, Arena, ArenaLayout, BufferSpec
from modeld.execution.checkpoints import StateCheckpoints
from modeld.execution.errors import ArenaLayoutError, ArenaLookupError, StateCapacityError
from modeld.models.qwen3_5.config import Qwen35Config
from modeld.models.qwen3_5.state import Qwen35StateSpec


def test_layout_aligns_and_views_alias():
    specs = [BufferSpec("a", (3,), torch.bfloat16), BufferSpec("b", (5, 7), torch.float32),
             BufferSpec("c", (1,), torch.uint8)]
    layout = ArenaLayout.plan(specs)
    offs = [p.offset for p in layout]
    assert offs == [0, ALIGN, ALIGN + ALIGN]  # 6 B and 140 B each round up to one ALIGN block
    assert layout.total_bytes == 3 * ALIGN
    arena = Arena(layout, "cpu")
    arena["b"][2, 3] = 1.5
    assert arena.storage.view(torch.uint8)[ALIGN:].view(torch.float32)[2 * 7 + 3] == 1.5
    assert arena.raw("a").numel() == 6
    arena.zero_()
    assert float(arena["b"].abs().sum()) == 0.0


@pytest.mark.parametrize("bad", [BufferSpec("", (1,), torch.float32), BufferSpec("x", (0,), torch.float32),
                                 BufferSpec("x", (2, -1), torch.float32)])
def test_layout_rejects_bad_specs(bad):
    with pytest.raises(ArenaLayoutError):
        ArenaLayout.plan([bad])


def test_layout_rejects_duplicates_and_unknown_names():
    with pytest.raises(ArenaLayoutError):
        ArenaLayout.plan([BufferSpec("x", (1,), torch.float32)] * 2)
    arena = Arena.from_specs([BufferSpec("x", (1,), torch.float32)], "cpu")
    with pytest.raises(ArenaLookupError):
        arena["y"]


def test_state_spec_27b_bytes_match_the_design():
    cfg = Qwen35Config.from_hf(hf_config(PRESETS["27b"]))
    spec = Qwen35StateSpec(cfg, slots=1, capacity=1024)
    assert spec.bytes_per_token == 64 * 1024  # 16 layers x 2 x 4 heads x 256 x 2 B
    rec = 48 * 48 * 128 * 128 * 4
    conv = 48 * 10240 * 3 * 2
    assert spec.fixed_bytes_per_slot == rec + conv  # ~151 MB + ~2.9 MB
    assert spec.total_bytes == 1024 * 64 * 1024 + rec + conv
    with pytest.raises(StateCapacityError):
        spec.check_fits(1025)
    with pytest.raises(StateCapacityError):
        Qwen35StateSpec(cfg, slots=0, capacity=8)


def test_checkpoints_restore_newest_at_or_before():
    state = Arena.from_specs([BufferSpec("s", (2, 3), torch.float32)], "cpu")
    ck = StateCheckpoints(state, ["s"], count=2)
    for pos in (4, 8, 12):  # the third save replaces the smallest position (4)
        state["s"][0].fill_(pos)
        ck.save(0, pos)
    assert ck.held() == [8, 12]
    state["s"][0].fill_(-1)
    assert ck.restore_at_most(0, 11) == 8
    assert torch.equal(state["s"][0], torch.full((3,), 8.0))
    assert ck.held() == [8]  # entries past the restore point are dropped
    assert ck.restore_at_most(0, 5) == 0
    assert float(state["s"][0].abs().sum()) == 0.0  # zero state
    assert state["s"][1].abs().sum() >= 0  # the other slot is untouched by design (never indexed)
