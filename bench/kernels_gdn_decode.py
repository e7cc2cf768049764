"""GDN one-token decode rows of bench/kernels_recurrent.py: v1 and its tiles, v2 at its default tile
and alternatives, volatile vs plain loads, programmatic dependent launch, and the launch floor (an
empty Triton kernel on v2's grid in the same graph-replay harness). Rows go through
`bench.kernels_recurrent.case`, so they land in that run's table and JSON.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

import bench.kernels_recurrent as R


@triton.jit
def _launch_floor_kernel(out_ptr):
    """Stores one value per program: times a launch (graph node + program dispatch) and nothing else."""
    tl.store(out_ptr + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0), 1.0)


# v2 decode tiles (BLOCK_V, num_warps) timed beside each B's default (gdn.triton V2_DECODE_TILE / V2_BATCH_TILE)
GDN_V2_ALTERNATIVES = {1: ((8, 1), (4, 1), (16, 2), (16, 4)), 8: ((16, 1), (16, 2), (64, 4), (64, 2)),
                       32: ((16, 1), (16, 2), (32, 2), (64, 2), (64, 4))}  # 64-wide: session 15


def _copy_set(nbytes: int):
    """bf16 source and destination of nbytes / 4 elements each: a copy reads half the bytes and writes half."""
    half = max(1, nbytes // 4)
    return torch.randn(half, device="cuda").bfloat16(), torch.empty(half, device="cuda", dtype=torch.bfloat16)


def _copy(src, dst):
    torch.mul(src, 1.0, out=dst)


def bench_gdn_decode(B, Hk, Hv, Dk, Dv, tt, ref, reps):
    """GDN decode rows for batch B: v1 (the plain "gdn_decode" row, beside the reference, and v1's tile
    alternatives), then v2 at its default tile and GDN_V2_ALTERNATIVES, all in this process
    ($MODELD_GDN_DECODE is read per call, so each row's graphs capture that row's kernel). At B = 1 and
    32 also v2 without volatile loads; at B = 1 also v2 with programmatic dependent launch (V2_PDL 1
    and 2) and the launch floor: an empty Triton kernel on v2's grid in the same graph-replay harness;
    its row records what fraction of the byte floor floor + launch would give."""
    import modeld.kernels.gdn.triton as gt

    shape, n_sets = f"B{B} Hk{Hk} Hv{Hv} Dk{Dk} Dv{Dv}", (48 if B == 1 else None)
    io = B * (2 * Hk * Dk + 2 * Hv * Dv) * 2 + B * Hv * 4
    nbytes = io + B * Hv * Dk * Dv * 4 * 2  # + the fp32 state read and written

    def make():
        return R._gdn_set(B, True, Hk, Hv, Dk, Dv)

    os.environ[gt.DECODE_ENV] = "v1"
    R.case("gdn_decode", shape, make, nbytes, tt.gdn_decode, ref.gdn_decode, reps, n_sets=n_sets)
    name = "DECODE_TILE" if B == 1 else "BATCH_TILE"
    default = getattr(gt, name)
    for tile in ((8, 1), (16, 1), (16, 2), (16, 4), (32, 2), (32, 4)):  # alternatives to re-pick the tile from
        if tile == default:
            continue
        setattr(gt, name, tile)
        R.case(f"gdn_decode(bv{tile[0]},w{tile[1]})", shape, make, nbytes, tt.gdn_decode, None, reps, n_sets=n_sets)
    setattr(gt, name, default)
    os.environ[gt.DECODE_ENV] = "v2"
    name = "V2_DECODE_TILE" if B == 1 else "V2_BATCH_TILE"
    default, volatile, pdl_default = getattr(gt, name), gt.V2_VOLATILE_LOADS, gt.V2_PDL
    try:
        for tile in (default,) + tuple(t for t in GDN_V2_ALTERNATIVES[B] if t != default):
            setattr(gt, name, tile)
            R.case(f"gdn_decode(v2,bv{tile[0]},w{tile[1]})", shape, make, nbytes, tt.gdn_decode, None, reps,
                 n_sets=n_sets)
        setattr(gt, name, default)
        # the size-matched roofline: one torch copy launch over the same bytes (its fraction_of_floor is what a
        # single launch of this size reaches; v2's fraction over it is v2's share of the size-matched ceiling)
        R.case("copy of the same bytes (torch.mul)", shape, lambda: _copy_set(nbytes), nbytes, _copy, None, reps,
               n_sets=n_sets)
        if B in (1, 32):  # volatile loads: the latency case and the throughput case
            gt.V2_VOLATILE_LOADS = not volatile
            R.case(f"gdn_decode(v2,bv{default[0]},w{default[1]},{'plain' if volatile else 'volatile'} loads)", shape,
                 make, nbytes, tt.gdn_decode, None, reps, n_sets=n_sets)
            gt.V2_VOLATILE_LOADS = volatile
        if B == 1:
            _launch_floor_row(shape, (triton.cdiv(Dv, default[0]), Hv), default[1], reps, n_sets)
            # programmatic dependent launch (last: a new launch mode): consecutive calls of the graph
            # overlap; each set has its own state, so pdl2's state loads before the wait are correct here
            for pdl in (1, 2):
                gt.V2_PDL = pdl
                R.case(f"gdn_decode(v2,bv{default[0]},w{default[1]},pdl{pdl})", shape, make, nbytes, tt.gdn_decode,
                     None, reps, n_sets=n_sets)
    finally:
        setattr(gt, name, default)
        gt.V2_VOLATILE_LOADS, gt.V2_PDL = volatile, pdl_default


def _launch_floor_row(shape, grid, warps, reps, n_sets):
    """The empty kernel on `grid` with `warps` warps, timed like the GDN rows; annotates its row with the
    fraction of the byte floor that floor + launch would give for the GDN decode row of `shape`."""
    R.case("launch_floor(empty triton)", f"grid {grid[0]}x{grid[1]} w{warps}",
         lambda: (torch.empty(grid[0] * grid[1], device="cuda"),), grid[0] * grid[1] * 4,
         lambda out: _launch_floor_kernel[grid](out, num_warps=warps), None, reps, n_sets=n_sets)
    gdn = next((r for r in R.ROWS if r.get("op") == "gdn_decode" and r.get("shape") == shape
                and r.get("impl") == "triton" and "floor_us" in r), None)
    launch = R.ROWS[-1]
    if gdn and "p50_us" in launch:
        launch["gdn_b1_floor_us"] = gdn["floor_us"]
        launch["gdn_b1_floor_plus_launch_fraction"] = gdn["floor_us"] / (gdn["floor_us"] + launch["p50_us"])
        print(f"  GDN decode B1: byte floor {gdn['floor_us']:.2f} us + launch floor {launch['p50_us']:.2f} us "
              f"-> at best {launch['gdn_b1_floor_plus_launch_fraction']:.2f} of the byte floor", flush=True)
