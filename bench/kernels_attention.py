"""Attention cases of bench/kernels.py (prefill; a suffix over a long prefix, one pass vs split-KV, and the split
sweep; split-KV decode: split3 vs fused and the fused sweep). Rows go through `bench.kernels.add_row`, so they land
in the same table and kernels.json; `bench/kernels.py --sections decode,prefill,suffix` calls them.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

import bench.kernels as K
from bench._env import env_set


@K.guarded
def bench_attention_prefill(t, hq, hkv, dh, reps, gen, tag="", start=0, loop=None, variant="flash"):
    """The one-pass causal prefill of t new tokens after `start` cached ones, with the key loop `loop`
    ($MODELD_ATTN_CAUSAL_LOOP; None: the default) in `variant` ($MODELD_ATTN_PREFILL: "flash" the Triton kernel,
    "gluon" / "gluon-overlap" the warp-specialized ones; "gluon-untrimmed" the one-pass Gluon kernel masking every
    tile, prefill_gluon.CAUSAL_TRIM off). The SDPA baseline runs only at start 0 (its is_causal is aligned to the top
    left, so it has no prefix form)."""
    from modeld.kernels.attention import prefill_gluon
    from modeld.kernels.attention import triton as att
    q = torch.randn(t, hq, dh, device="cuda", generator=gen).bfloat16()
    gate = torch.randn(t, hq, dh, device="cuda", generator=gen).bfloat16()
    k = torch.randn(t, hkv, dh, device="cuda", generator=gen).bfloat16()
    kc = torch.randn(start + t, hkv, dh, device="cuda", generator=gen).bfloat16()
    vc = torch.randn(start + t, hkv, dh, device="cuda", generator=gen).bfloat16()
    trim = prefill_gluon.CAUSAL_TRIM
    prefill_gluon.CAUSAL_TRIM = variant != "gluon-untrimmed"
    try:
        with env_set(att.CAUSAL_LOOP_ENV, loop), env_set(att.PREFILL_ENV, variant.removesuffix("-untrimmed")):
            p50, p90 = K.time_calls(lambda i: att.attention_prefill(q, k, k, kc, vc, start, dh**-0.5, gate), 1,
                                    reps)
            used = att.causal_loop()
    finally:
        prefill_gluon.CAUSAL_TRIM = trim
    b50 = None
    if start == 0:
        qs, ks = q.transpose(0, 1)[None], k.transpose(0, 1)[None]  # [1, H, T, Dh]

        def base(i):
            o = torch.nn.functional.scaled_dot_product_attention(qs, ks, ks, is_causal=True, scale=dh**-0.5,
                                                                 enable_gqa=True)
            return o * torch.sigmoid(gate.transpose(0, 1)[None])
        b50, _ = K.time_calls(base, 1, reps)
    flops = 4 * hq * dh * t * (start + (t + 1) / 2)
    tf = flops / (p50 * 1e-3) / 1e12
    kind = variant if variant.startswith("gluon") else f"{used} loop"
    K.add_row(f"attention prefill{tag} ({kind})", f"T{t} start{start} Hq{hq} Hkv{hkv} Dh{dh} gated", "TFLOP/s",
              p50, p90, tf, "TFLOP/s", tf / K.CEIL["cublas_TFLOPs"], "cuBLAS 8192^3 rate",
              "torch SDPA causal GQA + gate" if b50 else None, b50, dict(att.prefill_config(dh, False).__dict__))


# split-KV prefill candidates (attention/configs.PREFILL_SPLIT[Dh] / PREFILL_SPLIT_FEW[Dh] as (BM rows, BN, warps,
# stages, waves)): swept at the warm-hit shape and at one token beside the default
SPLIT_PREFILL_SWEEP = ((64, 64, 4, 2, 2), (128, 64, 8, 2, 2), (64, 64, 4, 3, 2), (64, 32, 4, 3, 2), (64, 64, 4, 2, 1),
                       (64, 64, 4, 2, 4), (32, 64, 4, 3, 2), (16, 64, 4, 3, 4), (128, 64, 8, 2, 1))


@K.guarded
def bench_attention_suffix(t, start, hq, hkv, dh, reps, gen, variant="auto", cfg=None, baseline=True):
    """T new tokens over a cached prefix of `start` (an agent turn's suffix): the KV write + attention, in the
    given $MODELD_ATTN_PREFILL variant (and split tile, forced into both split tables), against its roofline: the
    larger of reading the cache's K and V once at copy bandwidth and its FLOPs at the cuBLAS rate (100 tokens x 6
    heads per KV head make it compute-bound); baseline torch SDPA over the cache with the offset causal mask."""
    from modeld.kernels.attention import configs as acfg
    from modeld.kernels.attention import triton as att
    s_cap = start + t
    q = torch.randn(t, hq, dh, device="cuda", generator=gen).bfloat16()
    gate = torch.randn(t, hq, dh, device="cuda", generator=gen).bfloat16()
    k = torch.randn(t, hkv, dh, device="cuda", generator=gen).bfloat16()
    kc = torch.randn(s_cap, hkv, dh, device="cuda", generator=gen).bfloat16()
    vc = torch.randn(s_cap, hkv, dh, device="cuda", generator=gen).bfloat16()
    saved = acfg.PREFILL_SPLIT.get(dh), acfg.PREFILL_SPLIT_FEW.get(dh)
    if cfg is not None:
        acfg.PREFILL_SPLIT[dh] = acfg.PREFILL_SPLIT_FEW[dh] = acfg.AttentionConfig(*cfg, source="sweep")
    try:
        with env_set(att.PREFILL_ENV, variant):
            p50, p90 = K.time_calls(lambda i: att.attention_prefill(q, k, k, kc, vc, start, dh**-0.5, gate), 1, reps)
            scfg, splits = att.prefill_split_choice(t, hq, hkv, dh, start, q.device)
        meta = {"variant": variant, "splits": splits, **dict(scfg.__dict__)}
    finally:
        acfg.PREFILL_SPLIT[dh], acfg.PREFILL_SPLIT_FEW[dh] = saved
    b50 = float("nan")
    if baseline:
        qs, kcs, vcs = q.transpose(0, 1)[None], kc.transpose(0, 1)[None], vc.transpose(0, 1)[None]
        mask = torch.arange(s_cap, device="cuda")[None, :] <= (start + torch.arange(t, device="cuda"))[:, None]

        def base(i):
            o = torch.nn.functional.scaled_dot_product_attention(qs, kcs, vcs, attn_mask=mask, scale=dh**-0.5,
                                                                 enable_gqa=True)
            return o * torch.sigmoid(gate.transpose(0, 1)[None])
        b50, _ = K.time_calls(base, 1, reps)
    floor_bytes = 2 * s_cap * hkv * dh * 2
    flops = 4 * hq * dh * t * (start + (t + 1) / 2)
    floor_ms = max(floor_bytes / K.CEIL["copy_TBps"], flops / K.CEIL["cublas_TFLOPs"]) / 1e9
    tag = variant if cfg is None else f"sweep {'x'.join(map(str, cfg))}"
    K.add_row(f"attention suffix {tag}", f"T{t} start{start} Hq{hq} Hkv{hkv} Dh{dh} gated", "TFLOP/s", p50, p90,
              flops / (p50 * 1e-3) / 1e12, "TFLOP/s", floor_ms / p50,
              "max(K+V once at copy bandwidth, FLOPs at the cuBLAS rate)", "torch SDPA, offset causal mask", b50, meta,
              bytes=floor_bytes)


def suffix_section(reps, gen, sweep=False):
    """The warm prefix hit's attention (100 tokens over 32k) and a trim's one token, both variants; sweep=True
    adds SPLIT_PREFILL_SWEEP at the 100-token shape."""
    for t, start in ((100, 32768), (1, 32767), (100, 8192)):
        for variant in ("flash", "auto"):
            bench_attention_suffix(t, start, 24, 4, 256, reps, gen, variant, baseline=variant == "flash")
    if sweep:
        for cfg in SPLIT_PREFILL_SWEEP:
            bench_attention_suffix(100, 32768, 24, 4, 256, reps, gen, "split", cfg, baseline=False)
            bench_attention_suffix(1, 32767, 24, 4, 256, reps, gen, "split", cfg, baseline=False)


# fused decode candidates (attention/configs.FusedDecodeConfig: BN, warps, stages, waves, group) swept
# at B=1 8k and 32k beside the default. Shared memory (offline sm_90): BN 64 / 8 warps / 3 stages is
# 141 KB (one program per SM, so waves > 1 run as extra waves); BN 32 / 4 w / 3 st and BN 64 / 4 w /
# 2 st are ~75 KB (three per SM).
FUSED_DECODE_SWEEP = (  # (BN, warps, stages, waves, group[, fill])
    (64, 8, 3, 1, 32), (64, 8, 2, 2, 8), (32, 4, 3, 2, 8), (32, 4, 3, 4, 16),
    (64, 4, 2, 2, 8), (64, 4, 2, 4, 16), (32, 8, 3, 2, 8), (32, 4, 2, 4, 8),
    # fill: every SM gets a split program (33 splits at B = 1 instead of 32, merged 3 x 11 or 11 x 3)
    (64, 8, 3, 1, 8, True), (64, 8, 3, 1, 32, True),
    # deeper pipelines (session 15): 4 stages of BN 64 (207 KB of shared memory) and 6 of BN 32 (173 KB)
    (64, 8, 4, 1, 8), (32, 8, 6, 1, 8),
)


@contextmanager
def _decode_variant(variant, fused_cfg, dh):
    """Select the attention decode variant ($MODELD_ATTN_DECODE) and, for "fused", its config."""
    from modeld.kernels.attention import configs as acfg
    from modeld.kernels.attention import triton as att
    saved_cfg = acfg.DECODE_FUSED.get(dh)
    if fused_cfg is not None:
        acfg.DECODE_FUSED[dh] = fused_cfg
    try:
        with env_set(att.DECODE_ENV, variant):
            yield
    finally:
        if saved_cfg is not None:
            acfg.DECODE_FUSED[dh] = saved_cfg


@K.guarded
def bench_attention_decode(bsz, length, hq, hkv, dh, reps, gen, tag="", variant=None, fused=None, baseline=True,
                           cap=None):
    """One decode-attention row: `variant` "split3" | "fused" | None (the module default / env);
    `fused` = (BN, warps, stages, waves, group[, fill]) for the fused kernel; baseline = also time torch SDPA;
    `cap` = the cache capacity S (default length + 64; the split plan depends on it, not on the length)."""
    from modeld.kernels.attention import configs as acfg
    from modeld.kernels.attention import triton as att
    fused_cfg = acfg.FusedDecodeConfig(*fused, source="sweep") if fused is not None else None
    s_cap = cap or length + 64
    per_set = 2 * bsz * s_cap * hkv * dh * 2
    sets = K.n_sets_for(per_set)
    caches = [(torch.randn(bsz, s_cap, hkv, dh, device=K.DEV, generator=gen).bfloat16(),
               torch.randn(bsz, s_cap, hkv, dh, device=K.DEV, generator=gen).bfloat16()) for _ in range(sets)]
    q = torch.randn(bsz, hq, dh, device=K.DEV, generator=gen).bfloat16()
    gate = torch.randn(bsz, hq, dh, device=K.DEV, generator=gen).bfloat16()
    kn = torch.randn(bsz, hkv, dh, device=K.DEV, generator=gen).bfloat16()
    lens = torch.full((bsz,), length, dtype=torch.int32, device=K.DEV)
    with _decode_variant(variant, fused_cfg, dh):
        used = att.decode_variant()
        p50, p90 = K.time_calls(lambda i: att.attention_decode(q, kn, kn, caches[i][0], caches[i][1], lens, dh**-0.5,
                                                             gate), sets, reps)
        sm = att._sm_count(torch.device(K.DEV))
        if used == "fused":
            fc = acfg.fused_decode_config(dh, K.DEV == "cpu")
            splits, group = att.fused_split_plan(bsz, hkv, s_cap, fc.block_n, sm * fc.waves, fc.group, fc.fill)
            config = dict(variant=used, block_n=fc.block_n, num_warps=fc.num_warps, num_stages=fc.num_stages,
                          waves=fc.waves, group=group, fill=fc.fill, splits=splits, launches=1)
        else:
            dc = acfg.decode_config(dh, K.DEV == "cpu")
            config = dict(dc.__dict__, variant=used, splits=att.num_splits(bsz, hkv, s_cap, dc.block_n, sm), launches=3)

    def base(i):
        kc, vc = caches[i]
        ks = kc[:, : length + 1].transpose(1, 2)  # [B, Hkv, L, Dh] (a strided view, as a cache would be)
        vs = vc[:, : length + 1].transpose(1, 2)
        o = torch.nn.functional.scaled_dot_product_attention(q[:, :, None], ks, vs, scale=dh**-0.5, enable_gqa=True)
        return o[:, :, 0] * torch.sigmoid(gate)
    b50 = K.time_calls(base, sets, reps)[0] if baseline else None
    nbytes = 2 * bsz * (length + 1) * hkv * dh * 2
    tbps = nbytes / (p50 * 1e-3) / 1e12
    cfg_tag = "" if used == "split3" else (" [fused]" if fused is None else
                                           " [fused BN{} w{} st{} x{} g{}]".format(*fused[:5]))
    if fused is not None and len(fused) > 5 and fused[5]:
        cfg_tag = cfg_tag[:-1] + " fill]"
    cap_tag = f" cap{s_cap}" if cap else ""
    K.add_row(f"attention decode{cfg_tag}{tag}", f"B{bsz} len{length + 1}{cap_tag} Hq{hq} Hkv{hkv} Dh{dh}", "TB/s",
              p50, p90, tbps, "TB/s", tbps / K.CEIL["copy_TBps"], "KV bytes / copy bandwidth",
              "torch SDPA over the cache + gate" if baseline else None, b50, config, bytes=nbytes)


def decode_fixed_section(reps, gen):
    """The default decode attention (fused) at B = 1 over growing lengths at a FIXED capacity (8k + 64, 32k + 64):
    the grid and the split plan stay those of the capacity, so p50 = fixed cost (launch, prologue, pipeline fill,
    merge) + streamed bytes / rate, and the shortest length measures the fixed part directly. Read against the
    streaming slope of the same rows (KNOWLEDGE/findings/decode-attention-b1-fixed-cost-h200.md)."""
    for cap_len in (8191, 32767):
        for length in (63, 1023, 2047, 4095, 8191, 16383, 32767):
            if length <= cap_len:
                bench_attention_decode(1, length, 24, 4, 256, reps, gen, tag=" [fixed cap]", variant="fused",
                                       baseline=False, cap=cap_len + 64)


def decode_section(reps, gen):
    """Decode attention: split3 (three launches) and fused (one launch) A/B at four shapes (8 rows),
    then the fused sweep at B=1, 8k and 32k (24 rows). SDPA baseline only on the split3 rows."""
    for bsz, length in ((1, 8191), (1, 32767), (4, 8191), (16, 4095)):
        for variant in ("split3", "fused"):
            bench_attention_decode(bsz, length, 24, 4, 256, reps, gen, variant=variant, baseline=variant == "split3")
        # the size-matched roofline beside the second (fused, the default) row: a copy of the KV bytes in one launch
        if "p50_ms" in K.ROWS[-1]:
            K.same_bytes_ceiling("attention decode [fused] [vs same-bytes ceiling]", f"attention decode B{bsz} "
                                 f"len{length + 1}", K.ROWS[-1], reps, gen)
    for length in (8191, 32767):
        for cand in FUSED_DECODE_SWEEP:
            bench_attention_decode(1, length, 24, 4, 256, reps, gen, tag=" [sweep]", variant="fused", fused=cand,
                                   baseline=False)
