"""Probe: does the weight LAYOUT hold the M = 1 decode GEMVs under 0.90 of copy? fp8 v2 on row-major weights against
the same kernel on a pre-tiled copy of the same weights, where each program's tile of one step is one contiguous
block of memory, same call, every 27B fp8 decode shape (issue #5).

Why: under ncu every fp8 M = 1 variant, the bare TMA ring included, sits at 70-76 % of DRAM peak at in_proj
(KNOWLEDGE/dead-ends/gemv-fp8-gluon-ring-consumers.md), while a copy streams 2 GiB at ~90 %. A GEMV program reads a
[16 rows x 256 bytes] tile per step: 16 runs of 256 bytes, 5120 bytes apart (in_proj), spread over many DRAM pages;
a copy reads each page whole. In the tiled layout `[row blocks, K steps, 16 rows, 64 words]` a step's tile is 4 KB
of consecutive bytes, and one program's row block is a contiguous stream. The kernel (`_fp8_tiled_kernel`) is v2's
fp8 kernel (`gemv._gemv_fp8_kernel`, PDL off) with only the weight address changed; the tiles, split-K and epilogue
are v2's tuned ones. Results are bit-identical to v2.

    PYTHONPATH=src:. python3 bench/gemv_tiled_layout.py --out $OUT     # H200, ~30 s
    PYTHONPATH=src:. python3 bench/gemv_tiled_layout.py --offline      # CPU: sm_90 registers, spills, loop loads
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"),
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")]

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from modeld.kernels._checks import interpreting  # noqa: E402
from modeld.kernels.linear.gemv import _epilogue, _fp8_step, _word_tiles  # noqa: E402
from modeld.kernels.linear.gemv_split import _gemv_finish_kernel, finish_split, split_workspace  # noqa: E402

SHAPES = (("gate+up", 17408, 5120, True), ("down", 5120, 17408, False), ("in_proj", 16384, 5120, False),
          ("qkv", 14336, 5120, False), ("o_proj", 5120, 6144, False))


def tile_weights(w: torch.Tensor, block_n: int, step_words: int) -> torch.Tensor:
    """e4m3 [R, K] -> int32 [R / block_n, K / (4 step_words), block_n, step_words]: row block, K step, row, word."""
    r, k = w.shape
    w32 = w.view(torch.int32).view(r // block_n, block_n, k // (4 * step_words), step_words)
    return w32.permute(0, 2, 1, 3).contiguous()


@triton.jit
def _tile_ptrs(w_ptr, rows3, k0, KSTEPS, BLOCK_N: tl.constexpr, SW: tl.constexpr, cs):
    """Word addresses of rows3 (one row block) x words k0 + cs in the tiled layout."""
    rb = rows3 // BLOCK_N
    return w_ptr + ((rb * KSTEPS + k0 // SW) * BLOCK_N + rows3 % BLOCK_N) * SW + cs


@triton.jit
def _fp8_tiled_kernel(x_ptr, w_ptr, ws_ptr, y_ptr, part_ptr, cnt_ptr, N, KW, WPS, KSTEPS, up_offset,
                      SWIGLU: tl.constexpr, BLOCK_N: tl.constexpr, KS: tl.constexpr, WK: tl.constexpr,
                      SPLIT: tl.constexpr, FUSED: tl.constexpr, POLICY: tl.constexpr, ASM: tl.constexpr):
    # v2's fp8 kernel (double buffer, two row tiles sharing x) with the tiled weight address; cs spans one step
    pid_k, k_lo, k_hi, rows, up_offset, rows3, gmask_r, umask_r, cs, acc_g, acc_u = _word_tiles(
        N, KW, WPS, up_offset, SWIGLU, BLOCK_N, KS, WK)
    SW: tl.constexpr = KS * WK
    kmask = k_lo + cs < k_hi
    xa = tl.load(x_ptr + 2 * (k_lo + cs), mask=kmask, other=0)
    xb = tl.load(x_ptr + 2 * (k_lo + cs) + 1, mask=kmask, other=0)
    wg = tl.load(_tile_ptrs(w_ptr, rows3, k_lo, KSTEPS, BLOCK_N, SW, cs), mask=gmask_r & kmask, other=0,
                 eviction_policy=POLICY)
    wu = tl.load(_tile_ptrs(w_ptr, rows3 + up_offset, k_lo, KSTEPS, BLOCK_N, SW, cs), mask=umask_r & kmask, other=0,
                 eviction_policy=POLICY)
    for k0 in range(k_lo + SW, k_hi + SW, SW):
        nmask = k0 + cs < k_hi
        xa_n = tl.load(x_ptr + 2 * (k0 + cs), mask=nmask, other=0)
        xb_n = tl.load(x_ptr + 2 * (k0 + cs) + 1, mask=nmask, other=0)
        wg_n = tl.load(_tile_ptrs(w_ptr, rows3, k0, KSTEPS, BLOCK_N, SW, cs), mask=gmask_r & nmask, other=0,
                       eviction_policy=POLICY)
        wu_n = tl.load(_tile_ptrs(w_ptr, rows3 + up_offset, k0, KSTEPS, BLOCK_N, SW, cs), mask=umask_r & nmask,
                       other=0, eviction_policy=POLICY)
        acc_g, acc_u = _fp8_step(acc_g, acc_u, xa, xb, wg, wu, ASM)
        xa, xb, wg, wu = xa_n, xb_n, wg_n, wu_n
    g = tl.sum(tl.sum(acc_g, axis=2), axis=0) * tl.load(ws_ptr + rows, mask=rows < N, other=0.0)
    u_rows_ok = rows < N if SWIGLU else rows + up_offset < N
    u = tl.sum(tl.sum(acc_u, axis=2), axis=0) * tl.load(ws_ptr + rows + up_offset, mask=u_rows_ok, other=0.0)
    _epilogue(g, u, rows, N, y_ptr, part_ptr, cnt_ptr, pid_k, SWIGLU, SPLIT, BLOCK_N, FUSED)


def launch(x, w_tiled, ws, y, swiglu: bool, cfg) -> torch.Tensor:
    """y [1, N] <- x . W^T with W in `tile_weights(W, cfg.block_n, 4 * (cfg.block_k // 16))` layout; v2's split-K."""
    n, k = y.shape[1], x.shape[1]
    split = max(1, cfg.split_k)
    ks = max(1, cfg.block_k // 16)
    grid = (triton.cdiv(n, cfg.block_n if swiglu else 2 * cfg.block_n), split)
    part, fused, cnt = split_workspace(y, split, grid[0])
    kw = k // 4
    wps = triton.cdiv(triton.cdiv(kw, split), 4 * ks) * 4 * ks
    _fp8_tiled_kernel[grid](x.view(torch.int32), w_tiled, ws, y, part, cnt, n, kw, wps, kw // (4 * ks), n,
                            SWIGLU=swiglu, BLOCK_N=cfg.block_n, KS=ks, WK=4, SPLIT=split, FUSED=fused,
                            POLICY=cfg.weight_policy, ASM=not interpreting(), num_warps=cfg.num_warps,
                            num_stages=1)
    finish_split(part, y, split, swiglu, fused, _gemv_finish_kernel)
    return y


def gpu(out_dir: str, reps: int) -> int:
    from bench.gluon_stream_probe import _gpu_setup, _n_sets
    from modeld.kernels.linear import configs as C
    K, gen, ceiling = _gpu_setup(reps)
    rows = []
    for label, n, k, sw in SHAPES:
        r = 2 * n if sw else n
        nbytes = r * k + 4 * r
        ns = _n_sets(nbytes)
        cfg = C.GEMV_TUNED[(90, "fp8", sw, n, k)]
        sets = [K._make_weights("fp8", r, k, gen)[0] for _ in range(ns)]
        tiled = [tile_weights(w, cfg.block_n, 4 * (cfg.block_k // 16)) for w, _ in sets]
        x = torch.randn(1, k, device="cuda", generator=gen).bfloat16()
        fn = K._linear_fn("fp8", sw)
        want = fn(x, *sets[0])
        ys = [torch.empty(1, n, device="cuda", dtype=torch.bfloat16) for _ in range(ns)]
        launch(x, tiled[0], sets[0][1], ys[0], sw, cfg)
        torch.cuda.synchronize()
        same = bool(torch.equal(ys[0], want))
        row = {"shape": label, "MB": nbytes / 1e6, "config": str(cfg), "bit_identical": same}
        for name, call in (("v2 row-major", lambda i: fn(x, *sets[i])),
                           ("v2 tiled", lambda i: launch(x, tiled[i], sets[i][1], ys[i], sw, cfg)),
                           ("v2 row-major again", lambda i: fn(x, *sets[i])),
                           ("v2 tiled again", lambda i: launch(x, tiled[i], sets[i][1], ys[i], sw, cfg))):
            t = K.time_calls(call, ns, reps)
            row[name] = {"p50_us": t[0] * 1e3, "p90_us": t[1] * 1e3, "of_copy": nbytes / t[0] / 1e9 / ceiling}
            print(label, name, row[name], "bit-identical" if same else "DIFFERS", flush=True)
        rows.append(row)
        del sets, tiled
        torch.cuda.empty_cache()
    with open(os.path.join(out_dir, "gemv_tiled_layout.json"), "w") as f:
        json.dump({"commit": os.environ.get("MODELD_COMMIT"), "ceiling": ceiling, "rows": rows}, f, indent=1)
    return 0


def offline() -> int:
    """Compile the tiled kernel for sm_90 on this machine at the in_proj shape: registers, spills, loop loads."""
    from bench.gemv_sass import print_offline_loops
    from modeld.kernels.linear import configs as C
    cfg = C.GEMV_TUNED[(90, "fp8", False, 16384, 5120)]
    x = torch.empty(1, 5120, dtype=torch.bfloat16)
    w = torch.empty(16384 // 16, 5120 // 256, 16, 64, dtype=torch.int32)
    ws = torch.empty(16384)
    y = torch.empty(1, 16384, dtype=torch.bfloat16)
    print_offline_loops([sys.modules[__name__]], lambda: launch(x, w, ws, y, False, cfg))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".", help="where gemv_tiled_layout.json goes (GPU run)")
    ap.add_argument("--reps", type=int, default=10, help="graph replays per timing")
    ap.add_argument("--offline", action="store_true", help="CPU: compile for sm_90, no GPU")
    args = ap.parse_args(argv)
    return offline() if args.offline else gpu(args.out, args.reps)


if __name__ == "__main__":
    raise SystemExit(main())
