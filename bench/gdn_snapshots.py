"""One GDN prefill piece with an engine's checkpoints inside it: in one pass or in segments (H200).

    python bench/gdn_snapshots.py --out DIR [--tokens 8192] [--segment 2048] [--reps 20]
    TRITON_INTERPRET=1 python bench/gdn_snapshots.py --out DIR --device cpu --check-only --tokens 256 --segment 64 \
      --heads 1,2,32,32                      # the schemes' bits on the CPU interpreter, no timing

The engine prefills a 27B GDN layer in pieces of 8192 tokens and checkpoints the recurrent state every 2048
(`gdn_prefill_checkpointed`). This bench times one layer-piece (27B heads, the default kernels) three ways, in one
process:

* `segments`: $MODELD_GDN_SNAPSHOTS=segments, one gdn_prefill per 2048-token segment (the engine before session 31);
* `in-pass`: $MODELD_GDN_SNAPSHOTS=in-pass, one prefill whose state pass also stores the snapshots;
* `no-snapshots`: plain gdn_prefill over the piece (the bound: what the snapshots cost on top).

Session 31 (bench/gdn_overlap.py, its predecessor) found one call over the piece 0.76x the segments and the
segments' two-stream overlap 2.3x slower (KNOWLEDGE/dead-ends/gdn-segment-overlap-two-streams.md). p50 / p90 over
--reps (CUDA events), each scheme's ratio to `segments`, and whether each scheme's output, final state and
snapshots equal `segments`' bit for bit. Each scheme is timed twice: `eager` (the CPU issues the launches as the
GPU runs them: launch overhead counts) and `gpu-bound` (the launches queued behind a ~10 ms device-side sleep
first, so the GPU runs them back to back, as in the engine's prefill, whose CPU runs ahead of the long GEMMs).
Session 31: in-pass 0.733x eager but 1.001x in the engine's cold 32k — the eager row alone misleads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _inputs(tokens: int, heads: tuple[int, int, int, int], device: str):
    """Model-shaped GDN inputs (q / k / v as column slices of one conv output, as the engine passes them)."""
    Hk, Hv, Dk, Dv = heads
    g = torch.Generator().manual_seed(0)
    mixed = torch.randn(tokens, 2 * Hk * Dk + Hv * Dv, generator=g).bfloat16().to(device)
    q = mixed[:, : Hk * Dk].view(tokens, Hk, Dk)
    k = mixed[:, Hk * Dk : 2 * Hk * Dk].view(tokens, Hk, Dk)
    v = mixed[:, 2 * Hk * Dk :].view(tokens, Hv, Dv)
    a, b = ((torch.randn(tokens, Hv, generator=g) * 2).bfloat16().to(device) for _ in range(2))
    A_log = torch.log(torch.rand(Hv, generator=g) * 15 + 1).to(device)
    dt_bias = (torch.randn(Hv, generator=g) * 0.5).bfloat16().to(device)
    state = (torch.randn(Hv, Dk, Dv, generator=g) * 0.3).to(device)
    return (q, k, v, a, b, A_log, dt_bias), state


def schemes(args: tuple, ends: tuple[int, ...]) -> dict:
    """name -> run(state, out, snaps): each leaves the piece's output in out, its final state in state and (but
    `no-snapshots`) the checkpoints in snaps."""
    from bench._env import env_set
    from modeld.kernels.gdn import triton as tt

    def mode(name: str):
        def run(state, out, snaps):
            with env_set(tt.SNAPSHOTS_ENV, name):
                tt.gdn_prefill_checkpointed(*args, state, ends, snaps, out=out)
        return run

    def plain(state, out, snaps):
        tt.gdn_prefill(*args, state, out=out)

    return {"segments": mode("segments"), "in-pass": mode("in-pass"), "no-snapshots": plain}


def _buffers(args: tuple, state0: torch.Tensor, ends: tuple[int, ...]):
    v = args[2]
    return (state0.clone(), torch.empty(v.shape, dtype=v.dtype, device=v.device),
            torch.empty((len(ends), *state0.shape), device=v.device))


# device cycles of the sleep queued before a gpu-bound repetition (~10 ms at the H200's ~1.98 GHz): longer than the
# CPU needs to issue one layer-piece's launches, so they all wait in the queue when the timed region starts
QUEUE_CYCLES = 20_000_000


def timed(run, args: tuple, state0: torch.Tensor, ends: tuple[int, ...], reps: int,
          gpu_bound: bool = False) -> tuple[float, float]:
    """(p50, p90) seconds of one layer-piece, the state reset (outside the timed region) before each; gpu_bound:
    with the launches queued behind a device-side sleep (the sleep ends before the start event)."""
    state, out, snaps = _buffers(args, state0, ends)
    for _ in range(2):
        run(state, out, snaps)
    per = []
    for _ in range(reps):
        state.copy_(state0)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        if gpu_bound:
            torch.cuda._sleep(QUEUE_CYCLES)
        s.record()
        run(state, out, snaps)
        e.record()
        e.synchronize()
        per.append(s.elapsed_time(e) / 1e3)
    per.sort()
    return per[len(per) // 2], per[min(len(per) - 1, int(0.9 * len(per)))]


def same_bits(args: tuple, state0: torch.Tensor, ends: tuple[int, ...]) -> dict[str, bool]:
    """Each scheme's output, final state and snapshots (but no-snapshots') against `segments`', bit for bit."""
    runs = schemes(args, ends)
    want = _buffers(args, state0, ends)
    runs["segments"](*want)
    result = {}
    for name, run in runs.items():
        got = _buffers(args, state0, ends)
        run(*got)
        checked = got[:2] if name == "no-snapshots" else got
        result[name] = all(torch.equal(g, w) for g, w in zip(checked, want))
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for gdn_snapshots.json")
    ap.add_argument("--tokens", type=int, default=8192, help="layer-piece length (the engine's prefill chunk)")
    ap.add_argument("--segment", type=int, default=2048, help="checkpoint interval (the engine's checkpoint_every)")
    ap.add_argument("--heads", default="16,48,128,128", help="Hk,Hv,Dk,Dv (default: the 27B's GDN layers)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--check-only", action="store_true", help="only the schemes' bits against `segments` (no timing)")
    a = ap.parse_args(argv)
    try:
        heads = tuple(int(x) for x in a.heads.split(","))
    except ValueError:
        heads = ()
    if len(heads) != 4 or min(heads) < 1 or heads[1] % heads[0]:
        ap.error("--heads must be Hk,Hv,Dk,Dv with Hv a multiple of Hk")
    if a.segment < 64 or a.segment % 64 or a.tokens % a.segment or a.tokens == a.segment or a.reps < 3:
        ap.error("--segment must be a multiple of 64 dividing --tokens (at least two segments), --reps >= 3")
    if a.device == "cuda" and not torch.cuda.is_available():
        print("needs a CUDA GPU (or --device cpu --check-only under TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    if a.device == "cpu" and not a.check_only:
        ap.error("--device cpu times nothing: add --check-only")
    from modeld.kernels.gdn import triton as tt

    args, state0 = _inputs(a.tokens, heads, a.device)
    ends = tuple(range(a.segment, a.tokens, a.segment))
    bits = same_bits(args, state0, ends)
    for name, same in bits.items():
        print(f"gdn_snapshots {name:12s} same bits as segments: {same}", flush=True)
    kind = tt.prep_kind()
    res = dict(bench="gdn_snapshots", args=vars(a), same_bits=bits,
               kernels=dict(prep=kind, precision=tt.pass_precision(), kpre=tt.kpre_applies(kind, heads[2]),
                            heads=heads))
    if not a.check_only:
        from bench.kernels_recurrent import environment

        res["env"] = environment()
        rows = {}
        for timing in ("eager", "gpu-bound"):
            for name, run in schemes(args, ends).items():
                rows[f"{name}/{timing}"] = dict(zip(("p50_s", "p90_s"),
                                                    timed(run, args, state0, ends, a.reps, timing == "gpu-bound")))
        for key, r in rows.items():
            r["ratio_p50"] = r["p50_s"] / rows[f"segments/{key.split('/')[1]}"]["p50_s"]
            print(f"gdn_snapshots {key:22s} p50 {r['p50_s'] * 1e6:8.1f} us  p90 {r['p90_s'] * 1e6:8.1f} us  "
                  f"{r['ratio_p50']:.3f}x segments", flush=True)
        res["schemes"] = rows
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "gdn_snapshots.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0 if all(bits.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
