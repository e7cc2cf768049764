"""attention: Triton vs reference (the spec) for causal GQA prefill with a prefix and split-KV decode.

Checks the output (poisoned torch.empty, so unwritten elements and unwritten split partials are
NaN) and the cache: the rows the call owns hold exactly k/v, every other row is unchanged. Every
decode case runs for both decode variants ("split3": three launches; "fused": one launch with
arrival counters, whose buffer must be all zero again after each call). Under the interpreter the
programs run one after another, so the fused merge always runs in the highest split; the GPU tests
see real arrival orders.
"""

from __future__ import annotations

import pytest
import torch

from modeld.kernels._testing import assert_close
from modeld.kernels.attention import configs as acfg
from modeld.kernels.attention import reference as ref
from modeld.kernels import _arrival as ar
from modeld.kernels.attention import triton as tt
from modeld.kernels.errors import KernelDtypeError, KernelShapeError, KernelStrideError, KernelValueError


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


@pytest.fixture(params=tt.DECODE_VARIANTS)
def variant(request, monkeypatch):
    """Runs the test once per decode variant (through $MODELD_ATTN_DECODE, as the bench selects it)."""
    monkeypatch.setenv(tt.DECODE_ENV, request.param)
    return request.param


def _ref_decode(q, k, v, kc, vc, lens, scale, gate):
    """The spec, extended to cache_lens >= S the way the kernels define it (write dropped, all S cached
    positions attended): that equals decoding position S-1 with the row already there as k/v."""
    s_cap = kc.shape[1]
    over = [b for b, n in enumerate(lens) if n >= s_cap]
    k, v = k.clone(), v.clone()
    for b in over:
        k[b], v[b] = kc[b, s_cap - 1], vc[b, s_cap - 1]
    clamped = torch.tensor([min(n, s_cap - 1) for n in lens], dtype=torch.int32, device=q.device)
    return ref.attention_decode(q, k, v, kc, vc, clamped, scale, gate)


def _counters_zero(device) -> None:
    buf = tt.decode_counter_buffer(torch.device(device))
    if tt.decode_variant() == "fused":
        assert buf is not None and int(buf.count_nonzero()) == 0, "fused decode left an arrival counter non-zero"


def _check_decode(bsz, hq, hkv, dh, s_cap, lens, gated, gen, device, calls=1):
    """`calls` > 1: the same buffers decoded again with every length one larger (graph-replay style:
    same tensors, new cache_lens values), each call checked against the spec."""
    q, k, v = _rand((bsz, hq, dh), gen, device), _rand((bsz, hkv, dh), gen, device), _rand((bsz, hkv, dh), gen, device)
    gate = _rand((bsz, hq, dh), gen, device) if gated else None
    kc, vc = _rand((bsz, s_cap, hkv, dh), gen, device), _rand((bsz, s_cap, hkv, dh), gen, device)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    cache_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    for call in range(calls):
        now = [n + call for n in lens]
        cache_lens.copy_(torch.tensor(now, dtype=torch.int32))
        got = tt.attention_decode(q, k, v, kc, vc, cache_lens, dh**-0.5, gate)
        want = _ref_decode(q, k, v, kc_ref, vc_ref, now, dh**-0.5, gate)
        assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref), f"cache rows differ (call {call})"
        assert cache_lens.tolist() == now, "cache_lens must not be mutated"
        _counters_zero(device)
        assert_close(got, want, what=f"decode {tt.decode_variant()} B={bsz} lens={now[:4]} call {call}")


# (T, start, Hq, Hkv, Dh, S, gated)
PREFILL_CASES = [
    (1, 0, 4, 1, 64, 8, False),
    (63, 0, 6, 2, 64, 63, True),
    (37, 20, 6, 1, 64, 100, True),  # prefix of 20 cached tokens, GQA 6 (qwen3_5 ratio)
    (500, 0, 2, 1, 32, 512, False),
    (5, 3, 4, 2, 256, 8, True),  # Dh 256 (qwen3_5)
]


@pytest.fixture(params=tt.CAUSAL_LOOPS)
def causal_loop(request, monkeypatch):
    """Runs the test once per key loop of the one-pass prefill ($MODELD_ATTN_CAUSAL_LOOP, as benches select it)."""
    monkeypatch.setenv(tt.CAUSAL_LOOP_ENV, request.param)
    return request.param


@pytest.mark.parametrize("t,start,hq,hkv,dh,s_cap,gated", PREFILL_CASES,
                         ids=[f"T{c[0]}-start{c[1]}-Hq{c[2]}-Hkv{c[3]}-Dh{c[4]}{'-gate' if c[6] else ''}" for c in PREFILL_CASES])
def test_prefill_matches_reference(t, start, hq, hkv, dh, s_cap, gated, causal_loop, gen, device, poisoned_outputs):
    _check_prefill(t, start, hq, hkv, dh, s_cap, gated, gen, device)


def test_split_causal_loop_skips_masks_only_where_every_row_sees_the_keys(gen, device, poisoned_outputs,
                                                                          monkeypatch):
    """The unmasked loop must stop at the block's first position rounded DOWN to a key tile: starts that are not a
    multiple of the interpreter's 16-key tile, so a block's first tile holds keys some rows must not see."""
    monkeypatch.setenv(tt.CAUSAL_LOOP_ENV, "split")
    monkeypatch.setenv(tt.PREFILL_ENV, "flash")
    for start in (7, 16, 33):
        _check_prefill(40, start, 4, 2, 32, start + 45, True, gen, device)


@pytest.mark.parametrize("loop", tt.CAUSAL_LOOPS)
def test_prefill_score_spike_after_the_first_tile(loop, gen, device, poisoned_outputs, monkeypatch):
    """A cached key far along the prefix scores ~2^200 times the others (every query leans towards it): each row's
    running max jumps far past "split-lazy"'s threshold (8 in log2 units) well after its first tile. Without that
    rescale its p values would overflow fp32; the small jumps before it leave a stale max and p values above 1."""
    monkeypatch.setenv(tt.CAUSAL_LOOP_ENV, loop)
    monkeypatch.setenv(tt.PREFILL_ENV, "flash")
    t, start, hq, hkv, dh = 40, 70, 4, 2, 32
    u = torch.zeros(dh, device=device)
    u[3] = 1.0
    qg = _rand((t, hq, 2 * dh), gen, device)
    q, gate = (qg[..., :dh].float() + 3.0 * u).bfloat16(), qg[..., dh:]  # q . u = 3 +- 1 for every row
    k, v = _rand((t, hkv, dh), gen, device), _rand((t, hkv, dh), gen, device)
    kc, vc = _rand((start + t, hkv, dh), gen, device), _rand((start + t, hkv, dh), gen, device)
    kc[50] = (300.0 * u).bfloat16()  # score ~ 300 * 3 / sqrt(32) = 160 nats, ~230 in log2 units
    kc_ref, vc_ref = kc.clone(), vc.clone()
    got = tt.attention_prefill(q, k, v, kc, vc, start, dh**-0.5, gate)
    want = ref.attention_prefill(q, k, v, kc_ref, vc_ref, start, dh**-0.5, gate)
    assert_close(got, want, what=f"prefill with a score spike ({loop})")


def test_causal_loop_switch_raises_before_touching_the_cache(gen, device, monkeypatch):
    monkeypatch.setenv(tt.CAUSAL_LOOP_ENV, "diagonal")
    q, k = _rand((3, 2, 32), gen, device), _rand((3, 1, 32), gen, device)
    kc = torch.zeros(8, 1, 32, dtype=torch.bfloat16, device=device)
    with pytest.raises(KernelValueError, match="MODELD_ATTN_CAUSAL_LOOP"):
        tt.attention_prefill(q, k, k, kc, kc.clone(), 0, 0.1)
    assert int(kc.count_nonzero()) == 0
    monkeypatch.delenv(tt.CAUSAL_LOOP_ENV)
    assert tt.causal_loop() == tt.CAUSAL_LOOP


@pytest.mark.parametrize("tile", ["32:16:4:1", "16,32,8,2"])
def test_prefill_tile_switch_reaches_the_kernel(tile, gen, device, poisoned_outputs, monkeypatch):
    """$MODELD_ATTN_PREFILL_TILE replaces the one-pass tile for an A/B: tiles other than the interpreter's 16 x 16
    give the same attention, incl. starts inside a key tile (the split loop's rounding) and a partial last block."""
    monkeypatch.setenv(tt.PREFILL_TILE_ENV, tile)
    monkeypatch.setenv(tt.PREFILL_ENV, "flash")
    bm, bn, warps, stages = (int(p) for p in tile.replace(":", ",").split(","))
    cfg = tt.prefill_tile(32)
    assert (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages) == (bm, bn, warps, stages)
    for start in (0, 7, 33):
        _check_prefill(45, start, 4, 2, 32, start + 50, True, gen, device)


@pytest.mark.parametrize("tile", ["64:32:4", "48:32:4:2", "64:32:2:2", "64:32:4:5", "a:b:c:d"])
def test_prefill_tile_switch_raises_before_touching_the_cache(tile, gen, device, monkeypatch):
    monkeypatch.setenv(tt.PREFILL_TILE_ENV, tile)
    q, k = _rand((3, 2, 32), gen, device), _rand((3, 1, 32), gen, device)
    kc = torch.zeros(8, 1, 32, dtype=torch.bfloat16, device=device)
    with pytest.raises(KernelValueError, match="MODELD_ATTN_PREFILL_TILE"):
        tt.attention_prefill(q, k, k, kc, kc.clone(), 0, 0.1)
    assert int(kc.count_nonzero()) == 0


# Split-KV prefill (few new tokens over a long prefix). Under the interpreter: 16-row / 16-key tiles and 8
# pretend SMs x 2 waves, so these plans have 2-8 splits. (T, start, Hq, Hkv, Dh, S, gated)
SPLIT_CASES = [
    (5, 90, 6, 1, 64, 100, True),  # GQA 6 rows packed: 30 rows in 2 blocks, 4 splits, the last one empty
    (40, 60, 2, 2, 32, 100, False),  # split 1 starts past the first rows' positions: those rows get weight 0 there
    (1, 299, 24, 4, 256, 300, True),  # one token (a trim's re-evaluation) with qwen3_5 heads: 4 rows per KV head
    (20, 0, 4, 2, 32, 20, False),  # no prefix: every key is one of the new tokens
    (17, 200, 3, 3, 64, 217, True),  # MHA, a block boundary inside the new tokens
]


@pytest.fixture(params=["flash", "split", "auto"])
def prefill_variant(request, monkeypatch):
    """Runs the test once per prefill variant (through $MODELD_ATTN_PREFILL, as benches select it) and counts
    the split passes taken."""
    monkeypatch.setenv(tt.PREFILL_ENV, request.param)
    calls = []
    real = tt._prefill_split
    monkeypatch.setattr(tt, "_prefill_split", lambda *a: calls.append(a[-1]) or real(*a))
    return request.param, calls


@pytest.mark.parametrize("t,start,hq,hkv,dh,s_cap,gated", SPLIT_CASES,
                         ids=[f"T{c[0]}-start{c[1]}-Hq{c[2]}-Hkv{c[3]}-Dh{c[4]}" for c in SPLIT_CASES])
def test_split_prefill_matches_reference(t, start, hq, hkv, dh, s_cap, gated, prefill_variant, gen, device,
                                         poisoned_outputs):
    variant, calls = prefill_variant
    _check_prefill(t, start, hq, hkv, dh, s_cap, gated, gen, device)
    _, splits = tt.prefill_split_choice(t, hq, hkv, dh, start, torch.device(device))
    assert calls == ([splits] if splits else [])
    if variant == "split":
        assert splits >= 2, "the case must exercise the split pass"


@pytest.mark.parametrize("variant,t,hq,want", [
    ("split", 5, 6, 4), ("auto", 5, 6, 4),  # 30 rows, 2 blocks x 1 KV head, 16 slots: 4 splits; one pass: 6 programs
    ("flash", 5, 6, 0),
    # 40 rows in 3 blocks x 2 KV heads = 6 programs -> 2 splits; one pass: 2 blocks x 4 heads = a wave of 8 SMs
    ("auto", 20, 4, 0), ("split", 20, 4, 2),
])
def test_prefill_split_choice(variant, t, hq, want, monkeypatch):
    """Under the interpreter (8 pretend SMs, 16-row tiles, 2 waves): "flash" never splits, "split" whenever the
    plan has >= 2 splits, "auto" only where the one-pass grid is under one wave."""
    monkeypatch.setenv(tt.PREFILL_ENV, variant)
    hkv = 1 if hq == 6 else 2
    assert tt.prefill_split_choice(t, hq, hkv, 64, 90, torch.device("cpu"))[1] == want


def test_split_prefill_kernels_compile_once_for_every_length():
    """T, start and the split count are not specialised on (a compile per suffix length, prefix length or split count
    would stall serving); checked on the JIT objects, which exist only outside the interpreter (a subprocess)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2] / "src")
    code = ("from modeld.kernels.attention import _prefill_split as p, triton as t\n"
            "for k in (p._prefill_split_kernel, t._decode_combine_kernel):\n"
            "    print(sorted(x.name for x in k.params if x.do_not_specialize))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == ["['T', 'n_splits', 'start']", "['n_splits']"], out


@pytest.mark.parametrize("t,start,hq,hkv,dh,s_cap,gated", SPLIT_CASES + [(7, 0, 4, 2, 64, 7, True)],
                         ids=[f"T{c[0]}-start{c[1]}-Hq{c[2]}-Hkv{c[3]}-Dh{c[4]}" for c in SPLIT_CASES] + ["full-cache"])
def test_prefill_at_matches_reference(t, start, hq, hkv, dh, s_cap, gated, gen, device, poisoned_outputs):
    """attention_prefill_at: the positions on the device (start read there, splits planned by capacity) give the same
    cache rows and, within tolerance, the same output as the spec at that start."""
    qg = _rand((t, hq, 2 * dh), gen, device)
    q, gate = qg[..., :dh], (qg[..., dh:] if gated else None)
    k, v = _rand((t, hkv, dh), gen, device), _rand((t, hkv, dh), gen, device)
    kc, vc = _rand((s_cap, hkv, dh), gen, device), _rand((s_cap, hkv, dh), gen, device)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    pos = torch.arange(start, start + t, device=device)
    got = tt.attention_prefill_at(q, k, v, kc, vc, pos, dh**-0.5, gate)
    want = ref.attention_prefill_at(q, k, v, kc_ref, vc_ref, pos, dh**-0.5, gate)
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref), "cache rows differ"
    assert_close(got, want, what=f"prefill_at T={t} start={start}")


def test_prefill_at_same_call_any_start(gen, device, poisoned_outputs):
    """One set of buffers replayed at several starts (what a captured graph does): each call matches the spec."""
    t, hq, hkv, dh, s_cap = 6, 4, 2, 32, 120
    q, k, v = _rand((t, hq, dh), gen, device), _rand((t, hkv, dh), gen, device), _rand((t, hkv, dh), gen, device)
    kc, vc = _rand((s_cap, hkv, dh), gen, device), _rand((s_cap, hkv, dh), gen, device)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    pos = torch.zeros(t, dtype=torch.int64, device=device)
    for start in (0, 17, 114):
        pos.copy_(torch.arange(start, start + t))
        got = tt.attention_prefill_at(q, k, v, kc, vc, pos, 0.2)
        want = ref.attention_prefill_at(q, k, v, kc_ref, vc_ref, pos, 0.2)
        assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)
        assert_close(got, want, what=f"start {start}")


def test_prefill_at_refuses_bad_positions(device):
    q = torch.zeros(3, 4, 32, dtype=torch.bfloat16, device=device)
    k = torch.zeros(3, 2, 32, dtype=torch.bfloat16, device=device)
    kc = torch.zeros(10, 2, 32, dtype=torch.bfloat16, device=device)
    with pytest.raises(KernelDtypeError):
        tt.attention_prefill_at(q, k, k, kc, kc.clone(), torch.arange(3, dtype=torch.int32, device=device), 0.1)
    with pytest.raises(KernelShapeError):
        tt.attention_prefill_at(q, k, k, kc, kc.clone(), torch.arange(4, device=device), 0.1)
    with pytest.raises(ValueError):
        ref.attention_prefill_at(q, k, k, kc, kc.clone(), torch.tensor([0, 2, 3], device=device), 0.1)


def test_prefill_split_plan():
    # 27B warm hit: 100 tokens x GQA 6 = 600 rows in 10 blocks of 64, 4 KV heads, 264 slots -> 4 splits (160 programs)
    assert tt.prefill_split_plan(100, 6, 4, 32868, 64, 64, 264) == 4
    assert tt.prefill_split_plan(1, 6, 4, 32768, 64, 64, 264) == 64  # one token: decode-like, capped at 64
    assert tt.prefill_split_plan(2048, 6, 4, 32768, 64, 64, 264) == 1  # a full chunk fills the GPU on its own
    assert tt.prefill_split_plan(1, 6, 4, 100, 64, 64, 264) == 2  # never more splits than key blocks


def test_prefill_variant_switch(monkeypatch):
    monkeypatch.setenv(tt.PREFILL_ENV, "nope")
    with pytest.raises(KernelValueError, match="MODELD_ATTN_PREFILL"):
        tt.prefill_variant()
    monkeypatch.delenv(tt.PREFILL_ENV)
    assert tt.prefill_variant() == "auto"


# (B, Hq, Hkv, Dh, S, cache_lens, gated)
DECODE_CASES = [
    (1, 6, 1, 64, 100, (63,), True),
    (3, 4, 2, 64, 500, (0, 499, 250), False),  # empty-prefix, full cache, middle: some splits empty
    (2, 24, 4, 256, 40, (17, 39), True),  # qwen3_5 heads
    (4, 3, 3, 32, 33, (1, 32, 16, 15), False),  # MHA (GQA 1)
    (2, 6, 1, 32, 300, (299, 5), True),  # S-1 (new row is the last), and 5 of 300: most splits empty
    (3, 4, 2, 32, 64, (64, 70, 63), False),  # cache_lens >= S: write dropped, all S rows read
]


@pytest.mark.parametrize("bsz,hq,hkv,dh,s_cap,lens,gated", DECODE_CASES,
                         ids=[f"B{c[0]}-Hq{c[1]}-Hkv{c[2]}-Dh{c[3]}-S{c[4]}{'-gate' if c[6] else ''}" for c in DECODE_CASES])
def test_decode_matches_reference(bsz, hq, hkv, dh, s_cap, lens, gated, variant, gen, device, poisoned_outputs):
    _check_decode(bsz, hq, hkv, dh, s_cap, lens, gated, gen, device)


def test_decode_twice_like_a_graph_replay(variant, gen, device, poisoned_outputs):
    """Same buffers, cache_lens advanced in place between calls: the counters are re-armed and the
    second call sees the first call's row (at 16 and 40 it moves into the next split)."""
    _check_decode(2, 6, 2, 64, 200, (15, 39), True, gen, device, calls=3)


@pytest.mark.parametrize("waves,group", [(4, 64), (1, 1), (8, 4)], ids=["one-level", "group1", "wide"])
def test_fused_decode_merge_shapes(waves, group, gen, device, poisoned_outputs, monkeypatch):
    """The fused merge with one level (group >= splits), groups of one split, and 64 splits."""
    monkeypatch.setenv(tt.DECODE_ENV, "fused")
    monkeypatch.setattr(acfg, "_INTERPRETER_FUSED", acfg.FusedDecodeConfig(16, 4, 1, waves, group))
    if device.type == "cuda":
        monkeypatch.setitem(acfg.DECODE_FUSED, 64, acfg.FusedDecodeConfig(16, 4, 1, waves, group))
    _check_decode(2, 6, 2, 64, 1030, (1029, 400), True, gen, device)


@pytest.mark.parametrize("sms,group", [(6, 2), (6, 8), (7, 3)], ids=["6x-g2", "6x-one-level", "7x-prime-to-6"])
def test_fused_decode_fill_splits(sms, group, gen, device, poisoned_outputs, monkeypatch):
    """fill=True: split counts that are not powers of two (6 splits merged 2 x 3 or in one level; 7, a prime
    above the group size, lowered to 6 = 3 x 2), empty splits included."""
    monkeypatch.setenv(tt.DECODE_ENV, "fused")
    cfg = acfg.FusedDecodeConfig(16, 4, 1, 4, group, fill=True)
    monkeypatch.setattr(acfg, "_INTERPRETER_FUSED", cfg)
    if device.type == "cuda":
        monkeypatch.setitem(acfg.DECODE_FUSED, 64, cfg)
    monkeypatch.setattr(tt, "_sm_count", lambda dev: sms)
    splits, g = tt.fused_split_plan(2, 2, 1030, 16, sms * 4, group, True)
    assert splits & (splits - 1) and splits % g == 0  # not a power of two, and the groups divide it
    _check_decode(2, 6, 2, 64, 1030, (1029, 40), True, gen, device, calls=2)


def test_fused_split_plan():
    """27B on 132 SMs: power-of-two splits leave 4 SMs idle at B = 1; fill uses all 132."""
    assert tt.fused_split_plan(1, 4, 8256, 64, 132, 8, False) == (32, 8)
    assert tt.fused_split_plan(1, 4, 8256, 64, 132, 8, True) == (33, 3)  # 33 = 3 x 11 merge groups
    assert tt.fused_split_plan(3, 4, 8256, 64, 132, 8, True) == (10, 5)  # 11 is prime: one fewer
    assert tt.fused_split_plan(4, 4, 8256, 64, 132, 8, True) == (8, 8)
    assert tt.fused_split_plan(1, 4, 100, 64, 132, 8, True) == (2, 2)  # at most one split per block of keys
    assert tt.fused_split_plan(1, 1, 10**6, 64, 31, 1, True) == (31, 1)  # group 1: every split is a group


def test_fused_counters_grow_and_keep_old_buffers(device, monkeypatch):
    """A larger B*Hkv grows the stream's counter buffer; the outgrown one stays alive (a captured
    graph may still address it) and a zeroed spare is left for a later capture."""
    dev = torch.device(device)
    first = tt.reserve_decode_counters(dev, 8)
    assert tt.reserve_decode_counters(dev, 8) is first
    bigger = tt.reserve_decode_counters(dev, first.numel() + 1)
    assert bigger.numel() > first.numel() and any(t is first for t in ar._RETIRED)
    assert tt.decode_counter_buffer(dev) is bigger and int(bigger.count_nonzero()) == 0
    spares = ar._SPARES[("attention-decode", str(dev))]
    assert any(t.numel() >= bigger.numel() and int(t.count_nonzero()) == 0 for t in spares)


def test_fused_counters_during_a_capture(simulated_streams, monkeypatch):
    """Logic of the capture path (simulated: stream keys and the capture flag patched): a capture
    claims the spare an eager allocation left, never allocates, and raises when no spare fits."""
    stream = simulated_streams
    dev = torch.device("cpu")
    eager = tt.reserve_decode_counters(dev, 40)  # warm-up on side stream 1: buffer + spare
    spare = ar._SPARES[("attention-decode", "cpu")][0]
    assert spare is not eager and spare.numel() >= 40
    stream.update(now=2, capturing=True)  # capture on stream 2 takes the spare
    monkeypatch.setattr(torch, "zeros", lambda *a, **k: pytest.fail("allocated during a capture"))
    assert tt.reserve_decode_counters(dev, 40) is spare and not ar._SPARES[("attention-decode", "cpu")]
    stream.update(now=3)
    with pytest.raises(tt.DecodeWorkspaceError, match="reserve_decode_counters"):
        tt.reserve_decode_counters(dev, 40)
    stream.update(now=2)
    with pytest.raises(tt.DecodeWorkspaceError):
        tt.reserve_decode_counters(dev, spare.numel() + 1)  # growing inside a capture


def test_decode_variant_switch(monkeypatch):
    monkeypatch.delenv(tt.DECODE_ENV, raising=False)
    assert tt.decode_variant() == tt.DECODE_VARIANT == "fused"  # the default since the H200 A/B (session 4)
    monkeypatch.setenv(tt.DECODE_ENV, "fused")
    assert tt.decode_variant() == "fused"
    monkeypatch.setenv(tt.DECODE_ENV, "nope")
    with pytest.raises(KernelValueError):
        tt.decode_variant()


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
    assert tt.num_splits(1, 4, 8256, 64, 4 * 132, max_splits=256) == 128  # fused, 4 waves


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
def test_gpu_prefill(t, start, hq, hkv, dh, gated, causal_loop, gen, device, poisoned_outputs):
    _check_prefill(t, start, hq, hkv, dh, start + t + 17, gated, gen, device)


@pytest.mark.gpu
@pytest.mark.parametrize("tile", ["64:64:4:1", "64:32:4:2", "64:32:4:3", "64:64:8:2"])
@pytest.mark.parametrize("t,start", [(500, 0), (2048, 0), (4096, 4096)])
def test_gpu_prefill_tile_candidates(tile, t, start, gen, device, poisoned_outputs, monkeypatch):
    """The sweep's tile candidates ($MODELD_ATTN_PREFILL_TILE) at 27B heads: the same attention as the spec."""
    monkeypatch.setenv(tt.PREFILL_TILE_ENV, tile)
    monkeypatch.setenv(tt.PREFILL_ENV, "flash")
    _check_prefill(t, start, 24, 4, 256, start + t + 17, True, gen, device)


@pytest.mark.gpu
@pytest.mark.parametrize("t,start", [(100, 32768), (1, 32767), (37, 8000), (500, 30000)])
@pytest.mark.parametrize("hq,hkv,dh,gated", [(24, 4, 256, True), (9, 3, 64, False)], ids=["qwen3_5", "smollm2"])
def test_gpu_prefill_over_a_long_prefix(t, start, hq, hkv, dh, gated, prefill_variant, gen, device, poisoned_outputs):
    """An agent turn's suffix over a long cached prefix, each variant; auto takes the split pass at 100 tokens and
    one token (a 500-token chunk fills the GPU in one pass)."""
    variant, calls = prefill_variant
    _check_prefill(t, start, hq, hkv, dh, start + t + 17, gated, gen, device)
    _, splits = tt.prefill_split_choice(t, hq, hkv, dh, start, torch.device(device))
    assert calls == ([splits] if splits else [])
    if variant != "flash" and t <= 100 and hq == 24:
        assert splits >= 2


@pytest.mark.gpu
@pytest.mark.parametrize("bsz,s_cap", [(1, 8192), (1, 32768), (4, 16384), (16, 4096)])
@pytest.mark.parametrize("hq,hkv,dh,gated", [(24, 4, 256, True), (9, 3, 64, False)], ids=["qwen3_5", "smollm2"])
def test_gpu_decode(bsz, s_cap, hq, hkv, dh, gated, variant, gen, device, poisoned_outputs):
    lens = [int(torch.randint(0, s_cap, (1,), generator=gen)) for _ in range(bsz)]
    lens[0] = s_cap - 1
    _check_decode(bsz, hq, hkv, dh, s_cap, lens, gated, gen, device)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [acfg.FusedDecodeConfig(64, 8, 3, 1, 8), acfg.FusedDecodeConfig(64, 8, 3, 1, 32),
                                 acfg.FusedDecodeConfig(32, 4, 3, 4, 16), acfg.FusedDecodeConfig(64, 4, 2, 2, 8)],
                         ids=["32x-g8", "32x-one-level", "128x-g16", "64x-g8"])
@pytest.mark.parametrize("s_cap", [8192, 32768])
def test_gpu_fused_decode_27b_configs(cfg, s_cap, gen, device, poisoned_outputs, monkeypatch):
    """The fused kernel at 27B sizes for the configs the bench sweeps (real arrival orders), twice."""
    monkeypatch.setenv(tt.DECODE_ENV, "fused")
    monkeypatch.setitem(acfg.DECODE_FUSED, 256, cfg)
    _check_decode(2, 24, 4, 256, s_cap, (s_cap - 2, s_cap // 2 + 7), True, gen, device, calls=2)


@pytest.mark.gpu
@pytest.mark.parametrize("group", [8, 32], ids=["33x-g3", "33x-g11"])
@pytest.mark.parametrize("s_cap", [8192, 32768])
def test_gpu_fused_decode_fill(group, s_cap, gen, device, poisoned_outputs, monkeypatch):
    """fill=True at 27B sizes, B = 1: 33 splits on the H200's 132 SMs (merged 3 x 11 or 11 x 3), twice."""
    monkeypatch.setenv(tt.DECODE_ENV, "fused")
    monkeypatch.setitem(acfg.DECODE_FUSED, 256, acfg.FusedDecodeConfig(64, 8, 3, 1, group, fill=True))
    _check_decode(1, 24, 4, 256, s_cap, (s_cap - 2,), True, gen, device, calls=2)


@pytest.mark.gpu
def test_gpu_fused_decode_in_a_cuda_graph(gen, device, monkeypatch):
    """Warm up on a side stream, capture on another (as execution.graphs.StepGraph does), replay with
    cache_lens advanced in place: each replay matches the spec and leaves the counters at zero."""
    monkeypatch.setenv(tt.DECODE_ENV, "fused")
    bsz, hq, hkv, dh, s_cap = 2, 24, 4, 256, 8192
    q, k, v = _rand((bsz, hq, dh), gen, device), _rand((bsz, hkv, dh), gen, device), _rand((bsz, hkv, dh), gen, device)
    gate = _rand((bsz, hq, dh), gen, device)
    kc, vc = _rand((bsz, s_cap, hkv, dh), gen, device), _rand((bsz, s_cap, hkv, dh), gen, device)
    lens = torch.tensor([100, 5000], dtype=torch.int32, device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        tt.attention_decode(q, k, v, kc.clone(), vc.clone(), lens, dh**-0.5, gate)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tt.attention_decode(q, k, v, kc, vc, lens, dh**-0.5, gate)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    for step in range(3):
        now = [100 + 37 * step, 5000 + step]
        lens.copy_(torch.tensor(now, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        want = _ref_decode(q, k, v, kc_ref, vc_ref, now, dh**-0.5, gate)
        assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref), f"cache rows differ (replay {step})"
        assert_close(out, want, what=f"graph replay {step}")
    for buf in list(ar._COUNTERS.values()):
        assert int(buf.count_nonzero()) == 0


@pytest.mark.gpu
def test_gpu_random_shapes(variant, gen, device, poisoned_outputs):
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
