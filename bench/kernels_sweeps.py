"""Tile sweeps and A/B sections of bench/kernels.py (split out to keep that file readable).

Every function here times cases through `bench.kernels.bench_linear` / `bench.kernels_attention`, so the
rows land in the same table and JSON; `bench/kernels.py --sections ...` calls them. Winners go into
the config tables (`kernels/linear/configs.py`, `kernels/attention/configs.py`) with their provenance.
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import torch

import bench.kernels as K
import bench.kernels_attention as A
from bench._env import env_set as _env


@contextmanager
def _v2_configs(change, tuned: bool = False):
    """Every v2 GEMV config as change(config) makes it inside the block: the default heuristic
    (configs._gemv_default) and, with tuned, the configs.GEMV_TUNED entries; both restored on exit."""
    from modeld.kernels.linear import configs
    saved_tuned, saved_default = dict(configs.GEMV_TUNED), configs._gemv_default
    configs._gemv_default = lambda *a: change(saved_default(*a))
    if tuned:
        configs.GEMV_TUNED.update({key: change(c) for key, c in saved_tuned.items()})
    try:
        yield
    finally:
        configs._gemv_default = saved_default
        configs.GEMV_TUNED.update(saved_tuned)


def sweep_gemv(reps, gen):
    """M = 1 tile candidates (no baselines), incl. the 16-row tl.dot path (cp.async pipelined),
    which reached 4.03 TB/s at M = 8 in the 2026-11-29 run."""
    from modeld.kernels.linear.configs import TileConfig as C
    dot = [C(16, 32, 128, 4, 4), C(16, 64, 128, 4, 4), C(16, 32, 256, 4, 3)]
    cands = {
        "bf16": [C(1, 16, 1024, 4, 1, reduce_each_step=True), C(1, 8, 1024, 4, 1, reduce_each_step=True),
                 C(1, 4, 512, 4, 1), C(1, 8, 512, 4, 1), C(1, 16, 256, 4, 1)] + dot,
        "int4g128": [C(1, 16, 1024, 4, 1, reduce_each_step=True), C(1, 8, 512, 4, 1)] + dot,
        "fp8": [C(1, 8, 2048, 4, 1, reduce_each_step=True), C(1, 16, 1024, 4, 1, reduce_each_step=True)] + dot,
    }
    for fmt in ("bf16", "int4g128", "fp8"):
        for label, n, k, sw in K.LINEAR_SHAPES:
            for cfg in cands[fmt]:
                K.bench_linear(1, fmt, label, n, k, sw, reps, gen, config=cfg, tag=" [sweep]", baseline=False)


def sweep_attention(reps, gen):
    """Decode: tiles and split counts (num_splits patched); prefill Dh 256 tiles."""
    from modeld.kernels.attention import configs as acfg
    from modeld.kernels.attention import triton as att
    default_decode, default_splits = acfg.DECODE[256], att.num_splits
    for cfg in (acfg.AttentionConfig(16, 64, 8, 3), acfg.AttentionConfig(16, 32, 4, 3), acfg.AttentionConfig(16, 64, 4, 4)):
        acfg.DECODE[256] = cfg
        for splits in (32, 64, 128):
            att.num_splits = lambda *a, _s=splits: _s
            for length in (8191, 32767):
                A.bench_attention_decode(1, length, 24, 4, 256, reps, gen, tag=f" [sweep splits={splits}]")
    acfg.DECODE[256], att.num_splits = default_decode, default_splits
    # prefill Dh 256 (BM, BN, warps, stages), at T 8192 from 0 and as a cold 32k prompt's last 8192-token piece.
    # Offline sm_90 (session 23, split loop): (128, 64, 8, 2) 255 regs + 52 B spill, 192 KB shared, 1 CTA / SM;
    # (64, 64, 4, 1) 255 regs + 60 B spill, 64 KB: 2 CTAs / SM (one's softmax beside the other's wgmma) at 1.08x the
    # loop instructions per FLOP, no cp.async (one stage); (64, 32, 4, 2) 255 regs, no spill, 96 KB: 2 CTAs / SM at
    # 1.7x (the acc rescale is per tile); (64, 64, 8, 2) 206 regs, no spill, 160 KB; (128, 64, 4, 2) spills 6.7 KB
    # (not swept). `bench/attention_prefill_sass.py --tiles` prints these.
    default_prefill = acfg.PREFILL[256]
    for cfg in ((128, 64, 8, 2), (128, 32, 8, 3), (64, 64, 4, 1), (64, 32, 4, 2), (64, 32, 4, 3), (64, 64, 8, 2)):
        acfg.PREFILL[256] = acfg.AttentionConfig(*cfg)
        for start in (0, 24576):
            A.bench_attention_prefill(8192, 24, 4, 256, reps, gen, tag=" [sweep]", start=start)
    acfg.PREFILL[256] = default_prefill


def sweep_gemm(reps, gen):
    """bf16 prefill GEMM tiles at M = 8192 (the 8k TTFT) for every plain engine shape, incl. the opt-in
    TMA-descriptor kernel, each beside cuBLAS; the SwiGLU gate+up through the TMA kernel and unfused; then the
    in-tile fp8/int4 candidates for gate+up."""
    from modeld.kernels.linear.configs import TileConfig as C
    tma = dict(tma=True)
    # No warp-specialized TMA tiles here: in session 24 nothing that launched them finished on the H200
    # (pitfalls/gemm-warp-specialized-never-finished-h200.md), and a hang would take every row of this sweep with it.
    # bench/gemm_variants.py times them in a child process under a watchdog.
    pers = dict(tma=True, persistent=True)  # one program per SM, tile and K loops flattened (linear/gemm_persistent.py)
    cands = (C(128, 256, 64, 8, 3), C(128, 256, 64, 8, 4), C(256, 128, 64, 8, 3), C(128, 128, 64, 8, 4),
             C(128, 128, 64, 4, 4), C(128, 256, 64, 8, 3, **tma), C(128, 128, 64, 8, 4, **tma),
             C(128, 256, 64, 8, 3, **pers), C(128, 128, 64, 8, 4, **pers))
    for label, n, k, sw in K.LINEAR_SHAPES[1:]:
        K.bench_linear(8192, "bf16", label, n, k, sw, reps, gen)  # default tile + cuBLAS baseline
        for cfg in cands:
            K.bench_linear(8192, "bf16", label, n, k, sw, reps, gen, config=cfg, tag=" [sweep]", baseline=False)
    # gate+up: its "0.98 of cuBLAS" is against cuBLAS + silu*mul at ~586 TFLOP/s, below what the TMA kernel reaches
    # on the plain shapes in the engine (~685), and the TMA kernel with SWIGLU was never timed (offline sm_90: 168
    # registers, no spill, against the pointer kernel's 255). So: the fused TMA tiles, and the unfused plain GEMM
    # over all 2F rows (the activation would then cost one elementwise pass, ~50 us at M 2048)
    label, n, k, sw = K.LINEAR_SHAPES[0]
    K.bench_linear(8192, "bf16", label, n, k, sw, reps, gen)
    for cfg in (C(128, 128, 64, 8, 4, **tma), C(128, 128, 64, 8, 3, **tma), C(128, 64, 64, 8, 4, **tma),
                C(64, 128, 64, 4, 4, **tma), C(128, 128, 64, 8, 4, **pers)):
        K.bench_linear(8192, "bf16", label, n, k, sw, reps, gen, config=cfg, tag=" [sweep]", baseline=False)
    K.bench_linear(8192, "bf16", "mlp gate+up unfused (no activation)", 2 * n, k, False, reps, gen, baseline=False)
    for fmt in ("fp8", "int4g128"):
        for cfg in (C(128, 64, 64, 8, 3), C(128, 128, 64, 8, 3), C(64, 128, 64, 4, 4)):
            K.bench_linear(4096, fmt, *K.LINEAR_SHAPES[0], reps, gen, config=cfg, tag=" [sweep]", baseline=False)
    # the swapped kernels convert / dequantise each weight tile in registers as wgmma's A operand, once per token
    # block: against the default route (dequantise the whole weight to bf16 once per call, then the bf16 GEMM)
    swaps = (C(128, 128, 64, 8, 3, tma=True, swap_ab=True), C(256, 128, 64, 8, 3, tma=True, swap_ab=True),
             C(128, 64, 64, 4, 4, tma=True, swap_ab=True))
    for label, n, k, sw in (K.LINEAR_SHAPES[0], K.LINEAR_SHAPES[1]):
        for fmt in ("fp8", "int4g128"):
            K.bench_linear(2048, fmt, label, n, k, sw, reps, gen, baseline=False)  # default: the dequant route
            for cfg in swaps:
                if sw and cfg.block_m > 128:  # two [128 x 256] fp32 accumulators spill (offline sm_90: ~2 KB)
                    continue
                K.bench_linear(2048, fmt, label, n, k, sw, reps, gen, config=cfg, tag=" [sweep swap]",
                               baseline=False)


# Tiles for the suffix of an agent turn (M ~ 100 tokens: one M block, memory bound on the weights, which the
# prefill bucket's 128 x 128 tiles stream through only 40 programs at N = 5120). (block_m, block_n, block_k, warps,
# stages[, tma[, swap_ab]]). swap_ab (linear/gemm_swap.py): the weight tile as wgmma's register A operand, so an
# fp8 tile is converted in registers and never stored back to shared memory (offline sm_90: no STS in the loop)
SUFFIX_GEMM_SWEEP = ((128, 32, 128, 4, 4), (128, 64, 128, 4, 3), (128, 64, 64, 4, 4), (128, 32, 64, 4, 6),
                     (64, 64, 128, 4, 4), (128, 128, 64, 8, 3), (128, 64, 64, 4, 4, True), (128, 32, 128, 4, 4, True),
                     (128, 64, 64, 4, 4, True, True), (128, 64, 128, 4, 3, True, True),
                     (128, 128, 64, 8, 3, True, True))
# the swapped TMA tile for 17..64 tokens (decode above 16 slots): the tokens are the MMA's N side (32 / 64)
MID_SWAP_SWEEP = ((64, 64, 128, 4, 4, True, True), (64, 64, 64, 4, 6, True, True), (64, 128, 64, 8, 4, True, True))


def sweep_suffix_gemm(reps, gen, m=100):
    """Every 27B linear at M = m (the warm prefix hit's 100-token suffix) in each format: the default route (with
    cuBLAS bf16 beside it) and SUFFIX_GEMM_SWEEP's tiles forced through `_matmul_kernel` / the TMA kernel (TMA
    tiles only for bf16 / fp8: the TMA kernel has no int4)."""
    from modeld.kernels.linear.configs import TileConfig as C
    for label, n, k, sw in K.LINEAR_SHAPES:
        for fmt in ("bf16", "fp8", "int4g128"):
            K.bench_linear(m, fmt, label, n, k, sw, reps, gen)
            for c in SUFFIX_GEMM_SWEEP:
                tma, swap = len(c) > 5 and c[5], len(c) > 6 and c[6]
                if tma and not swap and fmt.startswith("int4"):  # int4 has no TMA kernel, but a swapped one
                    continue
                K.bench_linear(m, fmt, label, n, k, sw, reps, gen, config=C(*c[:5], tma=tma, swap_ab=swap),
                               tag=" [sweep swap]" if swap else " [sweep]", baseline=False)


def sweep_mid_swap(reps, gen):
    """bf16 / fp8 / int4 at M = 32 and 64 (decode above 16 slots): the default route (cuBLAS bf16 beside it) against
    the swapped tiles of MID_SWAP_SWEEP, block_m cut to the M bucket (32 or 64)."""
    from modeld.kernels.linear.configs import TileConfig as C
    for m in (32, 64):
        for label, n, k, sw in K.LINEAR_SHAPES:
            for fmt in ("bf16", "fp8", "int4g128"):
                K.bench_linear(m, fmt, label, n, k, sw, reps, gen)
                for c in MID_SWAP_SWEEP:
                    K.bench_linear(m, fmt, label, n, k, sw, reps, gen, config=C(min(m, c[0]), *c[1:5], tma=True,
                                                                             swap_ab=True),
                                   tag=" [sweep swap]", baseline=False)


def gemv_ab(reps, gen, sweep=False, ab=True):
    """ab: old (v1, `_matmul_kernel` M == 1) vs new (v2, linear/gemv.py) int4 / fp8 GEMV at every
    27B shape, interleaved per shape so both see the same clocks (cuBLAS bf16 beside v2).
    sweep: v2 tile candidates per format (no baselines); the winner goes to configs.GEMV_TUNED."""
    from modeld.kernels.linear import configs
    for label, n, k, sw in K.LINEAR_SHAPES if ab else ():
        for fmt in ("int4g128", "fp8", "bf16") + (("int4g32",) if sw else ()):
            for variant in ("v1", "v2"):
                K.bench_linear(1, fmt, label, n, k, sw, reps, gen, variant=variant, baseline=variant == "v2")
    if not sweep:
        return
    # (block_n, block_k, num_warps, split_k); split-K candidates matter most for N = 5120 (down, o_proj)
    # Kept small so gemv-ab + this sweep + the GPU tests fit one ~3-minute device call.
    # The 2026-11-29 sweep's winners (gate+up int4 8x1024; down int4 16x512 split 4; fp8 16x256 split
    # 2 / 32x256 split 4) are re-timed beside their neighbours at all five engine shapes.
    cands = {"int4g128": ((16, 512, 4, 1), (8, 1024, 4, 1), (8, 512, 4, 1), (16, 512, 4, 2), (16, 512, 4, 4),
                          (8, 1024, 4, 2), (8, 512, 4, 4)),
             "fp8": ((16, 256, 4, 1), (32, 256, 4, 1), (16, 256, 4, 2), (32, 256, 4, 2), (16, 256, 4, 4),
                     (32, 256, 4, 4), (8, 256, 4, 2)),
             "bf16": ((16, 256, 4, 1), (32, 256, 4, 1), (16, 512, 4, 1), (16, 256, 4, 2), (16, 256, 4, 4),
                      (8, 256, 4, 2), (32, 128, 4, 2))}
    for fmt, shapes in cands.items():
        for bn, bk, nw, split in shapes:
            cand = configs.GemvConfig(bn, bk, nw, split_k=split, source="sweep candidate")
            with _v2_configs(lambda c, _c=cand: _c):
                for label, n, k, sw in K.LINEAR_SHAPES:
                    K.bench_linear(1, fmt, label, n, k, sw, reps, gen, tag=f" [sweep v2 {bn}x{bk}w{nw}s{split}]",
                                   variant="v2", baseline=False)


def _sweep_int4_kernel(mod, variant, cands, tag, reps, gen):
    """v2 (with cuBLAS bf16 beside it), then `variant`'s default pick, then each candidate (installed as
    `mod.pick`: a config, or a function of the default pick's config), at every 27B shape, interleaved per
    shape; `tag(cand)` names a candidate's row."""
    saved = mod.pick
    try:
        for label, n, k, sw in K.LINEAR_SHAPES:
            K.bench_linear(1, "int4g128", label, n, k, sw, reps, gen, variant="v2")
            K.bench_linear(1, "int4g128", label, n, k, sw, reps, gen, variant=variant, baseline=False)
            for cand in cands:
                mod.pick = (lambda *a, _c=cand: _c(saved(*a))) if callable(cand) else (lambda *a, _c=cand: _c)
                K.bench_linear(1, "int4g128", label, n, k, sw, reps, gen, variant=variant, baseline=False,
                               tag=f" [sweep {variant} {tag(cand)}]")
                mod.pick = saved
    finally:
        mod.pick = saved


def sweep_gemv_mma(reps, gen, dry=False):
    """int4 g128 M == 1: v2 (its GEMV_TUNED entry, the default) beside the tensor-core GEMV
    (linear/gemv_mma.py) with its default pick and tile candidates (block_n, warps, stages, split_k), at
    every 27B shape, interleaved per shape; cuBLAS bf16 beside v2. Winners go to gemv_mma.MMA_TUNED."""
    from modeld.kernels.linear import gemv_mma
    tiles = ((64, 4, 3, 3), (64, 4, 3, 4), (64, 4, 3, 8), (64, 4, 2, 4), (64, 4, 4, 4), (128, 4, 3, 3),
             (128, 4, 3, 4), (128, 4, 3, 8), (128, 4, 4, 4))
    if dry:
        tiles = ((64, 4, 1, 1), (64, 4, 1, 2))
    cands = [gemv_mma.MmaGemvConfig(*t, source="sweep candidate") for t in tiles]
    _sweep_int4_kernel(gemv_mma, "mma", cands, lambda c: f"{c.block_n}w{c.num_warps}s{c.num_stages}k{c.split_k}",
                       reps, gen)


def sweep_gemv_hmma(reps, gen, dry=False):
    """int4 g128 M == 1: v2 beside the mma.sync GEMV (linear/gemv_hmma.py, the default) with its default pick,
    (16-row blocks, warps, split_k) candidates that keep the pick's cache policy and gate/up split, and the pick
    without each of those two (session 6: evict_first and gate/up apart), at every 27B shape, interleaved."""
    from modeld.kernels.linear import gemv_hmma
    # (2, 2, 3/4/6): 32-row programs with more chunks each, for o_proj / qkv, where the ~430 SASS instructions
    # outside the loop (x sums, scales, finish) are a third of a 3-iteration program's work (offline SASS)
    tiles = ((4, 4, 4), (8, 4, 3), (4, 4, 6), (2, 2, 8), (2, 2, 3), (2, 2, 4), (2, 2, 6))
    if dry:
        tiles = ((1, 4, 1), (2, 4, 2))
    variants = {f"{b}b w{w} k{k}": dict(blocks=b, num_warps=w, split_k=k) for b, w, k in tiles}
    variants.update({"pick, no cache policy": dict(weight_policy=""), "pick, gate/up together": dict(gate_up_apart=False)})
    cands = []
    for name, kw in variants.items():
        cand = lambda c, _kw=kw: dataclasses.replace(c, **_kw)
        cand.tag = name
        cands.append(cand)
    _sweep_int4_kernel(gemv_hmma, "hmma", cands, lambda c: c.tag, reps, gen)


def sweep_gemv_evict(reps, gen, dry=False):
    """v2 GEMV (its GEMV_TUNED entry) with the weight loads' default cache policy (evict_first), then with
    none, for bf16 / fp8 / int4 g128 at every 27B shape, interleaved per shape (cuBLAS bf16 beside the first)."""
    for label, n, k, sw in K.LINEAR_SHAPES:
        for fmt in ("bf16", "fp8", "int4g128"):
            K.bench_linear(1, fmt, label, n, k, sw, reps, gen, variant="v2")
            with _v2_configs(lambda c: dataclasses.replace(c, weight_policy=""), tuned=True):
                K.bench_linear(1, fmt, label, n, k, sw, reps, gen, variant="v2", baseline=False,
                               tag=" [sweep v2 no cache policy]")


def sweep_gemv_pdl(reps, gen, dry=False):
    """Each default M == 1 GEMV (bf16, fp8, int4 g128 = hmma) without, then with programmatic dependent launch
    (MODELD_PDL=1: trigger first thing; late: after the K loop; kernels/_pdl.py), interleaved per shape. The timed graph replays the same GEMV
    back to back, so with PDL each call prefetches its first weight tile and launches during the previous
    call's tail: an upper bound on what PDL saves between two GEMVs in the engine."""
    for label, n, k, sw in K.LINEAR_SHAPES:
        for fmt in ("bf16", "fp8", "int4g128"):
            v = "hmma" if fmt == "int4g128" else "v2"
            with _env("MODELD_PDL", "0"):
                K.bench_linear(1, fmt, label, n, k, sw, reps, gen, variant=v)
            for mode in ("1", "late"):
                with _env("MODELD_PDL", mode):
                    K.bench_linear(1, fmt, label, n, k, sw, reps, gen, variant=v, baseline=False,
                                   tag=f" [sweep pdl {mode}]")


def gemv_equal_bytes(reps, gen, dry=False):
    """What one streaming launch reaches at a quantized GEMV's byte count: each fp8 / int4 g128 default GEMV beside
    the bf16 v2 GEMV (0.98-1.03 of copy at the big shapes) over the same K and as many rows as make the same weight
    bytes, interleaved per shape. The small quantized GEMVs read 2-4x fewer bytes in one launch, and a launch's fixed
    costs (ramp-up, last wave, split-K finish) weigh more at that size: the bf16 row is their same-bytes reference."""
    for label, n, k, sw in K.LINEAR_SHAPES:
        rows = 2 * n if sw else n
        for fmt, bytes_per_weight in (("fp8", 1 + 4 / k), ("int4g128", 0.5 + 4 / 128)):
            K.bench_linear(1, fmt, label, n, k, sw, reps, gen, baseline=False)
            n_eq = max(16, round(rows * bytes_per_weight / 2 / 16) * 16)
            # the bf16 default tile has no split-K at these untuned shapes (~1 program per SM): also split 2 / 4 / 8
            for split in (1, 2, 4, 8):
                with _v2_configs(lambda c, _s=split: dataclasses.replace(c, split_k=_s)):
                    K.bench_linear(1, "bf16", f"{label} [bf16, the bytes of {fmt}, split {split}]", n_eq, k, False,
                                   reps, gen, baseline=False)


def gemv_size_ceiling(reps, gen):
    """The roofline of one launch at each decode GEMV's own byte count: beside every default M == 1 GEMV (bf16, fp8,
    int4 g128, the 27B shapes), torch's own streaming kernels over the same bytes, in the same run
    (`kernels.same_bytes_ceiling`: a copy and a read, rotated past 3x L2). The row "[vs same-bytes ceiling]" gives
    the GEMV's fraction of the faster (ceiling p50 / GEMV p50). The 2 GiB copy of `ceilings()` is the other roofline,
    the one TARGETS.md's fractions use."""
    for label, n, k, sw in K.LINEAR_SHAPES:
        for fmt in ("bf16", "fp8", "int4g128"):
            K.bench_linear(1, fmt, label, n, k, sw, reps, gen, baseline=False)
            row = K.ROWS[-1]
            if "p50_ms" in row:
                K.same_bytes_ceiling(f"linear [vs same-bytes ceiling] {label}", f"{label} {fmt}", row, reps, gen)


def sweep_gemv_ba(reps, gen):
    """gdn.ba (the GDN gates, 2 x 48 rows, bf16 in every profile): 48 of these per 27B token. v1 runs
    24 programs; v2 with split-K spreads K over many more (below V2_MIN_WEIGHTS, so in the engine v2
    serves it only through a GEMV_TUNED entry)."""
    from modeld.kernels.linear import configs
    for bn, bk, nw, split in ((16, 256, 4, 1), (8, 256, 4, 8), (8, 256, 4, 16), (16, 256, 4, 16), (8, 128, 4, 32)):
        cand = configs.GemvConfig(bn, bk, nw, split_k=split, source="sweep candidate")
        with _v2_configs(lambda c, _c=cand: _c):
            K.bench_linear(1, "bf16", "gdn ba", 96, 5120, False, reps, gen, tag=f" [sweep v2 {bn}x{bk}w{nw}s{split}]",
                           variant="v2", baseline=False)
    K.bench_linear(1, "bf16", "gdn ba", 96, 5120, False, reps, gen, variant="v1", baseline=True)


def gemv_split_finish(reps, gen):
    """Split-K finish A/B: at every configs.GEMV_TUNED entry with split_k > 1 (v2) and every
    gemv_mma.MMA_TUNED entry with split_k > 1 (tensor-core int4), the two-launch finish
    (`_gemv_finish_kernel`, rows [finish kernel]) beside the last-arriver finish inside the GEMV launch
    (rows [finish fused]), interleaved per shape so both see the same clocks; cuBLAS bf16 beside the
    kernel row. MODELD_GEMV_SPLIT_FINISH is set per case and restored. Under --dry-run the tuned
    config is forced onto the tiny CPU shapes (the interpreter's own config has no split)."""
    from modeld.kernels.linear import configs, gemv, gemv_mma
    from modeld.kernels.linear import triton as lin
    labels = {(17408, 5120, True): "mlp gate+up swiglu", (5120, 17408, False): "mlp down",
              (16384, 5120, False): "gdn in_proj qkv+z", (14336, 5120, False): "attn q+gate,k,v",
              (5120, 6144, False): "o_proj/out_proj", (96, 5120, False): "gdn ba"}  # K.LINEAR_SHAPES + gdn.ba
    cases = [(fmt, sw, n, k, cfg, "v2") for (sm, fmt, sw, n, k), cfg in configs.GEMV_TUNED.items()
             if sm == 90 and cfg.split_k > 1]
    cases += [("int4", sw, n, k, cfg, "mma") for (sm, sw, n, k), cfg in gemv_mma.MMA_TUNED.items()
              if sm == 90 and cfg.split_k > 1]
    saved_pick, saved_mma_pick = lin.pick_gemv, gemv_mma.pick
    try:
        for fmt, sw, n, k, cfg, variant in cases:
            label = labels.get((n, k, sw), f"N{n} K{k}")
            if K.DEV == "cpu":  # --dry-run: a tiny shape of the same kind, the tuned tile forced on it
                n, k = (24, 256) if sw else (20, 384)
            lin.pick_gemv = lambda *a, _c=cfg: _c
            if variant == "mma":
                gemv_mma.pick = lambda *a, _c=cfg: _c
            for mode in ("kernel", "fused"):
                with _env(gemv.SPLIT_FINISH_ENV, mode):
                    K.bench_linear(1, "int4g128" if fmt == "int4" else fmt, label, n, k, sw, reps, gen,
                                   tag=f" [finish {mode}] [split {cfg.split_k}]", variant=variant,
                                   baseline=mode == "kernel")
            gemv_mma.pick = saved_mma_pick
    finally:
        lin.pick_gemv, gemv_mma.pick = saved_pick, saved_mma_pick


def _sweep_batch(mod, fmt, old_env, new_env, name, cands, reps, gen, dry):
    """A batched mma.sync GEMV module at M = --batch-m (default 2 / 4 / 8) and every 27B shape, interleaved per
    shape: the skinny tl.dot tile (forced by old_env = (variable, value)) with cuBLAS bf16 beside it, then, under
    new_env (the policy that routes every M to the module), the module's pick, each candidate (config fields replaced
    in the pick) and the pick's split halved and doubled."""
    saved = mod.pick
    shapes = K.LINEAR_SHAPES[:2] if dry else K.LINEAR_SHAPES
    try:
        for m in ((2,) if dry else K.BATCH_M):
            for label, n, k, sw in shapes:
                with _env(*old_env):
                    K.bench_linear(m, fmt, label, n, k, sw, reps, gen, tag=" [skinny]")
                with _env(*new_env):
                    K.bench_linear(m, fmt, label, n, k, sw, reps, gen, baseline=False, tag=f" [{name}]")
                    pick = saved(90, sw, n, k, 132, dry, m)
                    variants = dict(cands)
                    variants.update({f"split {max(1, pick.split_k // 2)}": dict(split_k=max(1, pick.split_k // 2)),
                                     f"split {2 * pick.split_k}": dict(split_k=2 * pick.split_k)})
                    for cand, kw in variants.items():
                        mod.pick = lambda *a, _kw=kw: dataclasses.replace(saved(*a), **_kw)
                        K.bench_linear(m, fmt, label, n, k, sw, reps, gen, baseline=False,
                                       tag=f" [sweep {name} {cand}]")
                        mod.pick = saved
    finally:
        mod.pick = saved


def sweep_gemv_hmma_batch(reps, gen, dry=False):
    """int4 g128 at M = --batch-m: the skinny tile (MODELD_GEMV_INT4=v2) beside the batched mma.sync GEMV
    (linear/gemv_hmma_batch.py): its pick, 2 blocks over 2 warps, 4 / 8 / 16 blocks, no cache policy, split / 2 and x 2."""
    from modeld.kernels.linear import gemv_hmma_batch as hb
    cands = {"2b w2": dict(blocks=2, num_warps=2), "4b w4": dict(blocks=4), "8b w4": dict(blocks=8),
             "16b w4": dict(blocks=16), "no cache policy": dict(weight_policy="")}
    _sweep_batch(hb, "int4g128", ("MODELD_GEMV_INT4", "v2"), ("MODELD_GEMV_INT4", "hmma"), "hmma batch",
                 {"1b w4": dict(blocks=1)} if dry else cands, reps, gen, dry)


def sweep_gemv_fp8_batch(reps, gen, dry=False):
    """fp8 at M = --batch-m: the skinny tile (MODELD_GEMV_FP8_BATCH=tile) beside the batched mma.sync GEMV (=mma16)
    (linear/gemv_fp8_batch.py): its pick, 2 blocks over 2 warps, 4 / 8 / 16 blocks over 4 warps, 16 over 8, no cache
    policy, split / 2 and x 2."""
    from modeld.kernels.linear import gemv_fp8_batch as fb
    cands = {"2b w2": dict(blocks=2, num_warps=2), "4b w4": dict(blocks=4), "8b w4": dict(blocks=8),
             "16b w4": dict(blocks=16), "16b w8": dict(blocks=16, num_warps=8), "no cache policy": dict(weight_policy="")}
    _sweep_batch(fb, "fp8", (fb.FP8_BATCH_ENV, "tile"), (fb.FP8_BATCH_ENV, "mma16"), "fp8 batch",
                 {"1b w4": dict(blocks=1)} if dry else cands, reps, gen, dry)


def mid_m(reps, gen, dry=False):
    """16 < M <= 64 (decode at more than 16 slots) at M = --batch-m values above 16 (default 32) and every 27B shape,
    bf16 / fp8 / int4 g128, interleaved per shape under each MODELD_MID_M policy (linear/triton.py): "gemm" (the
    prefill tile, cuBLAS bf16 beside it), "chunk" (16-token slices through the M <= 16 paths), "tile" (the skinny
    tile with 32 / 64 rows of M)."""
    from modeld.kernels.linear import triton as lin
    ms = [17] if dry else ([m for m in K.BATCH_M if lin.CHUNK_M < m <= lin.MID_MAX_M] or [32])
    for m in ms:
        for label, n, k, sw in (K.LINEAR_SHAPES[:2] if dry else K.LINEAR_SHAPES):
            for fmt in ("bf16", "fp8", "int4g128"):
                for policy in ("gemm", "chunk", "tile"):
                    with _env(lin.MID_M_ENV, policy):
                        K.bench_linear(m, fmt, label, n, k, sw, reps, gen, baseline=policy == "gemm",
                                       tag=f" [mid {policy}]")


def gemv_sections(sections, reps, gen, dry=False):
    """The M == 1 linear sections, shared by the GPU run and --dry-run (tiny shapes, fewer candidates)."""
    if "gemv" in sections:
        for label, n, k, sw in K.LINEAR_SHAPES:
            for fmt in ("bf16", "fp8", "int4g128"):
                K.bench_linear(1, fmt, label, n, k, sw, reps, gen)
        if not dry:
            K.bench_linear(1, "int4g32", *K.LINEAR_SHAPES[0], reps, gen)
    if "gemv-ab" in sections or "sweep-gemv-v2" in sections:
        gemv_ab(reps, gen, sweep="sweep-gemv-v2" in sections, ab="gemv-ab" in sections)
    if "sweep-gemv-ba" in sections:
        sweep_gemv_ba(reps, gen)
    for name, fn in (("sweep-gemv-mma", sweep_gemv_mma), ("sweep-gemv-hmma", sweep_gemv_hmma),
                     ("sweep-gemv-evict", sweep_gemv_evict), ("sweep-gemv-pdl", sweep_gemv_pdl),
                     ("sweep-gemv-hmma-batch", sweep_gemv_hmma_batch), ("sweep-gemv-fp8-batch", sweep_gemv_fp8_batch)):
        if name in sections:
            fn(reps, gen, dry=dry)
    if "gemv-split-finish" in sections:
        gemv_split_finish(reps, gen)
    if "gemv-equal-bytes" in sections:
        gemv_equal_bytes(reps, gen, dry=dry)
    if "size-ceiling" in sections:
        gemv_size_ceiling(reps, gen)
    if "mid-m" in sections:
        mid_m(reps, gen, dry=dry)
    if "sweep-suffix-gemm" in sections:
        sweep_suffix_gemm(reps, gen)
    if "sweep-mid-swap" in sections:
        sweep_mid_swap(reps, gen)
