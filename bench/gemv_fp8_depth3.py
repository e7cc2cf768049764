"""Probe: the fp8 v2 M = 1 GEMV with a register TRIPLE buffer (tiles i + 1 and i + 2 loaded while tile i is used)
beside v2's double buffer, same call, every 27B fp8 decode shape (issue #5: GEMV >= 0.90 of copy bandwidth).

Why: under ncu, v2 fp8 at in_proj runs one wave of 512 programs (~4 per SM, achieved occupancy 24 % against 44 %
possible) and stalls on long_scoreboard; registers had room for one more tile in flight per program
(KNOWLEDGE/dead-ends/gemv-fp8-gluon-ring-consumers.md). The kernel is v2's (`gemv._gemv_fp8_kernel`, PDL off, the
same tiles, split-K and epilogue) with the loads of tile i + 2 issued before tile i is used. It lost at every shape.

    PYTHONPATH=src:. python3 bench/gemv_fp8_depth3.py --out $OUT     # H200, ~30 s
    PYTHONPATH=src:. python3 bench/gemv_fp8_depth3.py --offline      # CPU: sm_90 registers, spills, loop loads
"""
import argparse
import json
import os
import sys

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"),
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")]

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from modeld.kernels.linear.gemv import _epilogue, _fp8_step, _word_tiles  # noqa: E402
from modeld.kernels.linear.gemv_split import _gemv_finish_kernel, finish_split, split_workspace  # noqa: E402


@triton.jit
def _ld(x_ptr, w_ptr, rows3, up_offset, stride_w, c, k_hi, gmask_r, umask_r, POLICY: tl.constexpr):
    m = c < k_hi
    xa = tl.load(x_ptr + 2 * c, mask=m, other=0)
    xb = tl.load(x_ptr + 2 * c + 1, mask=m, other=0)
    wg = tl.load(w_ptr + rows3 * stride_w + c, mask=gmask_r & m, other=0, eviction_policy=POLICY)
    wu = tl.load(w_ptr + (rows3 + up_offset) * stride_w + c, mask=umask_r & m, other=0, eviction_policy=POLICY)
    return xa, xb, wg, wu


@triton.jit
def _fp8_depth3_kernel(x_ptr, w_ptr, ws_ptr, y_ptr, part_ptr, cnt_ptr, N, KW, WPS, stride_w, up_offset,
                       SWIGLU: tl.constexpr, BLOCK_N: tl.constexpr, KS: tl.constexpr, WK: tl.constexpr,
                       SPLIT: tl.constexpr, FUSED: tl.constexpr, POLICY: tl.constexpr):
    pid_k, k_lo, k_hi, rows, up_offset, rows3, gmask_r, umask_r, cs, acc_g, acc_u = _word_tiles(
        N, KW, WPS, up_offset, SWIGLU, BLOCK_N, KS, WK)
    STEP: tl.constexpr = KS * WK
    xa, xb, wg, wu = _ld(x_ptr, w_ptr, rows3, up_offset, stride_w, k_lo + cs, k_hi, gmask_r, umask_r, POLICY)
    xa1, xb1, wg1, wu1 = _ld(x_ptr, w_ptr, rows3, up_offset, stride_w, k_lo + STEP + cs, k_hi, gmask_r, umask_r, POLICY)
    for k0 in range(k_lo + 2 * STEP, k_hi + 2 * STEP, STEP):
        xa2, xb2, wg2, wu2 = _ld(x_ptr, w_ptr, rows3, up_offset, stride_w, k0 + cs, k_hi, gmask_r, umask_r, POLICY)
        acc_g, acc_u = _fp8_step(acc_g, acc_u, xa, xb, wg, wu, True)
        xa, xb, wg, wu = xa1, xb1, wg1, wu1
        xa1, xb1, wg1, wu1 = xa2, xb2, wg2, wu2
    g = tl.sum(tl.sum(acc_g, axis=2), axis=0) * tl.load(ws_ptr + rows, mask=rows < N, other=0.0)
    u_rows_ok = rows < N if SWIGLU else rows + up_offset < N
    u = tl.sum(tl.sum(acc_u, axis=2), axis=0) * tl.load(ws_ptr + rows + up_offset, mask=u_rows_ok, other=0.0)
    _epilogue(g, u, rows, N, y_ptr, part_ptr, cnt_ptr, pid_k, SWIGLU, SPLIT, BLOCK_N, FUSED)


def launch(x, w, ws, y, swiglu, block_n, block_k, split, nw=4):
    """y [1, N] <- the triple-buffered fp8 GEMV (v2's tiles: two of block_n rows x block_k weights per step)."""
    n = y.shape[1]; k = x.shape[1]
    grid = (triton.cdiv(n, block_n if swiglu else 2 * block_n), split)
    part, fused, cnt = split_workspace(y, split, grid[0])
    ks = max(1, block_k // 16); kw = k // 4
    wps = triton.cdiv(triton.cdiv(kw, split), 4 * ks) * 4 * ks
    _fp8_depth3_kernel[grid](x.view(torch.int32), w.view(torch.int32), ws, y, part, cnt, n, kw, wps,
                             w.stride(0) // 4, n, SWIGLU=swiglu, BLOCK_N=block_n, KS=ks, WK=4, SPLIT=split,
                             FUSED=fused, POLICY="evict_first",
                             num_warps=nw, num_stages=1)
    finish_split(part, y, split, swiglu, fused, _gemv_finish_kernel)
    return y


SHAPES = (("gate+up", 17408, 5120, True), ("down", 5120, 17408, False), ("in_proj", 16384, 5120, False),
          ("qkv", 14336, 5120, False), ("o_proj", 5120, 6144, False))


def gpu(out_dir: str, reps: int) -> int:
    from bench.gluon_stream_probe import _gpu_setup, _n_sets
    from modeld.kernels.linear import configs as C
    K, gen, ceiling = _gpu_setup(reps)
    out = []
    for label, n, k, sw in SHAPES:
        r = 2 * n if sw else n
        nbytes = r * k + 4 * r
        ns = _n_sets(nbytes)
        sets = [K._make_weights("fp8", r, k, gen)[0] for _ in range(ns)]
        x = torch.randn(1, k, device="cuda", generator=gen).bfloat16()
        fn = K._linear_fn("fp8", sw)
        want = fn(x, *sets[0]).float()
        t2 = K.time_calls(lambda i: fn(x, *sets[i]), ns, reps)[0]
        cfg = C.GEMV_TUNED.get((90, "fp8", sw, n, k))
        print(label, "v2 %.2f us (%.3f) cfg %s" % (t2 * 1e3, nbytes / t2 / 1e9 / ceiling, cfg), flush=True)
        row = {"shape": label, "v2_us": t2 * 1e3}
        base = (cfg.block_n, cfg.block_k, max(1, cfg.split_k), cfg.num_warps)
        cands = {base, (base[0], base[1], base[2] * 2, base[3]), (base[0], 128, base[2], base[3]),
                 (base[0], 512, base[2], base[3]),
                 (8, base[1], base[2], base[3]), (32, base[1], base[2], base[3])}
        for bn, bk, sp, nw in sorted(cands):
            ys = [torch.empty(1, n, device="cuda", dtype=torch.bfloat16) for _ in range(ns)]
            try:
                launch(x, sets[0][0], sets[0][1], ys[0], sw, bn, bk, sp, nw)
                torch.cuda.synchronize()
                err = ((ys[0].float() - want).abs().max() / want.abs().max()).item()
                t = K.time_calls(lambda i: launch(x, sets[i][0], sets[i][1], ys[i], sw, bn, bk, sp, nw), ns, reps)[0]
                print(label, "depth3", (bn, bk, sp, nw), "%.2f us (%.3f) v2/this %.3f err %.1e"
                      % (t * 1e3, nbytes / t / 1e9 / ceiling, t2 / t, err), flush=True)
                row[str((bn, bk, sp, nw))] = {"us": t * 1e3, "v2_over": t2 / t, "err_vs_v2": err}
            except Exception as e:
                print(label, (bn, bk, sp, nw), "ERR", str(e)[:200])
        out.append(row)
        del sets
    with open(os.path.join(out_dir, "gemv_fp8_depth3.json"), "w") as f:
        json.dump({"commit": os.environ.get("MODELD_COMMIT"), "ceiling": ceiling, "rows": out}, f, indent=1)
    return 0


def offline() -> int:
    """Compile the triple-buffered kernel for sm_90 on this machine at the in_proj shape: registers, spills and the
    global loads of its K loop (v2's double buffer has the same loads per iteration, one tile earlier)."""
    from bench.gemv_sass import print_offline_loops
    x = torch.empty(1, 5120, dtype=torch.bfloat16)
    w = torch.empty(16384, 5120, dtype=torch.float8_e4m3fn)
    ws = torch.empty(16384)
    y = torch.empty(1, 16384, dtype=torch.bfloat16)
    print_offline_loops([sys.modules[__name__]], lambda: launch(x, w, ws, y, False, 16, 256, 1))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=".", help="where gemv_fp8_depth3.json goes (GPU run)")
    ap.add_argument("--reps", type=int, default=10, help="graph replays per timing")
    ap.add_argument("--offline", action="store_true", help="CPU: compile for sm_90, no GPU")
    args = ap.parse_args(argv)
    return offline() if args.offline else gpu(args.out, args.reps)


if __name__ == "__main__":
    raise SystemExit(main())
