"""What-if: overlap the GDN prep of the next snapshot segment with the state pass of this one (H200 only).

    python bench/gdn_overlap.py --out DIR [--tokens 8192] [--segment 2048] [--reps 20]
    TRITON_INTERPRET=1 python bench/gdn_overlap.py --out DIR --device cpu --check-only --tokens 256 --segment 64 \
      --heads 1,2,32,32                      # the schemes' bits on the CPU interpreter, no timing

The engine prefills a 27B GDN layer in snapshot segments (2048 tokens, four per 8192-token piece) and runs each
segment's prep, state pass and output pass back to back. The state pass is a serial chain over 64-token chunks
on ~192 programs (1-2 per SM, latency-bound), while the next segment's prep depends only on the inputs. This
bench times one layer-piece (27B heads, the default kernels) four ways, all in one process:

* `segmented`: `gdn_prefill_segments` as the engine calls it by default (one gdn_prefill per segment);
* `overlap`: the same op under $MODELD_GDN_OVERLAP=1 (segment s + 1's prep on a side stream beside segment s's
  state pass: the schedule the engine takes with the switch);
* `preps-first`: all four preps, then the four state + output passes (the same launches, no overlap);
* `one-call`: the piece as one segment (the bound of writing snapshots from inside the state pass).

p50 / p90 over --reps timed repetitions (CUDA events, eager: the two-stream schedule is the point), each scheme's
ratio to `segmented`, the prep / state+output split per segment, and whether each scheme's output and final state
equal `segmented`'s bit for bit. `overlap` is the engine's opt-in path; the last two are what-ifs only.
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
    return q, k, v, a, b, A_log, dt_bias, state


def _gdn_pieces(tokens: int, segment: int, heads: tuple[int, int, int, int], device: str):
    """One layer-piece's inputs, its segments, and the kernels' two halves (`_chunked_prep` / `_chunked_scan`, the
    pieces `gdn_prefill_segments` schedules) for the schemes that reorder them."""
    from modeld.kernels.gdn import triton as tt

    q, k, v, a, b, A_log, dt_bias, state0 = _inputs(tokens, heads, device)
    kind = tt.prep_kind()
    bounds = [(r0, min(r0 + segment, tokens)) for r0 in range(0, tokens, segment)]

    def prep(r0, r1):
        return tt._chunked_prep(k[r0:r1], v[r0:r1], a[r0:r1], b[r0:r1], A_log, dt_bias, "v2", kind)

    def scan(r0, r1, scratch, state, out):
        tt._chunked_scan(q[r0:r1], k[r0:r1], state, out[r0:r1], scratch)

    def segments(out):
        return [(q[r0:r1], k[r0:r1], v[r0:r1], a[r0:r1], b[r0:r1], out[r0:r1]) for r0, r1 in bounds]

    return dict(bounds=bounds, prep=prep, scan=scan, segments=segments, gates=(A_log, dt_bias), state0=state0,
                out_shape=v.shape, kind=kind, precision=tt.pass_precision(), kpre=tt.kpre_applies(kind, q.shape[2]),
                heads=heads, device=device)


def schemes(p: dict) -> dict:
    """name -> run(state, out): each scheme leaves the layer-piece's output in `out` and its final state in `state`."""
    from bench._env import env_set
    from modeld.kernels.gdn import triton as tt

    def through_the_op(overlap: str):
        def run(state, out):
            with env_set(tt.OVERLAP_ENV, overlap):
                tt.gdn_prefill_segments(p["segments"](out), *p["gates"], state)
        return run

    def preps_first(state, out):
        scratch = [p["prep"](r0, r1) for r0, r1 in p["bounds"]]
        for (r0, r1), s in zip(p["bounds"], scratch):
            p["scan"](r0, r1, s, state, out)

    def one_call(state, out):
        r1 = p["bounds"][-1][1]
        p["scan"](0, r1, p["prep"](0, r1), state, out)

    return {"segmented": through_the_op("0"), "overlap": through_the_op("1"), "preps-first": preps_first,
            "one-call": one_call}


def timed(run, p: dict, reps: int) -> tuple[float, float]:
    """(p50, p90) seconds of one layer-piece, state reset (outside the timed region) before each."""
    state, out = p["state0"].clone(), torch.empty(p["out_shape"], dtype=torch.bfloat16, device="cuda")
    for _ in range(2):
        run(state, out)
    per = []
    for _ in range(reps):
        state.copy_(p["state0"])
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        s.record()
        run(state, out)
        e.record()
        e.synchronize()
        per.append(s.elapsed_time(e) / 1e3)
    per.sort()
    return per[len(per) // 2], per[min(len(per) - 1, int(0.9 * len(per)))]


def split_times(p: dict, reps: int) -> dict:
    """p50 seconds of one segment's prep and of its state + output pass, each alone (the repeated state pass works
    on its own previous output, U -> Vn in place: the values drift, the launches and their times do not)."""
    r0, r1 = p["bounds"][0]
    scratch, state = p["prep"](r0, r1), p["state0"].clone()
    out = torch.empty(p["out_shape"], dtype=torch.bfloat16, device="cuda")
    return {"prep_s": timed(lambda st, o: p["prep"](r0, r1), p, reps)[0],
            "state_output_s": timed(lambda st, o: p["scan"](r0, r1, scratch, state, out), p, reps)[0]}


def same_bits(p: dict) -> dict[str, bool]:
    """Each scheme's output and final state against `segmented`'s, bit for bit."""
    runs = schemes(p)
    want_state = p["state0"].clone()
    want_out = torch.empty(p["out_shape"], dtype=torch.bfloat16, device=p["device"])
    runs["segmented"](want_state, want_out)
    result = {}
    for name, run in runs.items():
        state, out = p["state0"].clone(), torch.empty_like(want_out)
        run(state, out)
        result[name] = bool(torch.equal(out, want_out) and torch.equal(state, want_state))
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for gdn_overlap.json")
    ap.add_argument("--tokens", type=int, default=8192, help="layer-piece length (the engine's prefill chunk)")
    ap.add_argument("--segment", type=int, default=2048, help="snapshot segment (the engine's checkpoint_every)")
    ap.add_argument("--heads", default="16,48,128,128", help="Hk,Hv,Dk,Dv (default: the 27B's GDN layers)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--check-only", action="store_true", help="only the schemes' bits against `segmented` (no timing)")
    a = ap.parse_args(argv)
    try:
        heads = tuple(int(x) for x in a.heads.split(","))
    except ValueError:
        heads = ()
    if len(heads) != 4 or min(heads) < 1 or heads[1] % heads[0]:
        ap.error("--heads must be Hk,Hv,Dk,Dv with Hv a multiple of Hk")
    if a.segment < 64 or a.segment % 64 or a.tokens % a.segment or a.reps < 3:
        ap.error("--segment must be a multiple of 64 dividing --tokens, --reps >= 3")
    if a.device == "cuda" and not torch.cuda.is_available():
        print("needs a CUDA GPU (or --device cpu --check-only under TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    if a.device == "cpu" and not a.check_only:
        ap.error("--device cpu times nothing: add --check-only")
    p = _gdn_pieces(a.tokens, a.segment, heads, a.device)
    bits = same_bits(p)
    for name, same in bits.items():
        print(f"gdn_overlap {name:12s} same bits as segmented: {same}", flush=True)
    res = dict(bench="gdn_overlap", args=vars(a), kernels=dict(prep=p["kind"], precision=p["precision"],
                                                               kpre=p["kpre"], heads=heads), same_bits=bits)
    if not a.check_only:
        from bench.kernels_recurrent import environment

        res["env"] = environment()
        rows = {name: dict(zip(("p50_s", "p90_s"), timed(run, p, a.reps))) for name, run in schemes(p).items()}
        base = rows["segmented"]["p50_s"]
        for name, r in rows.items():
            r["ratio_p50"] = r["p50_s"] / base
            print(f"gdn_overlap {name:12s} p50 {r['p50_s'] * 1e6:8.1f} us  p90 {r['p90_s'] * 1e6:8.1f} us  "
                  f"{r['ratio_p50']:.3f}x segmented", flush=True)
        split = split_times(p, a.reps)
        n = len(p["bounds"])
        # the best an overlap can do: every prep but the first hidden behind a state + output pass
        bound = split["prep_s"] + n * split["state_output_s"] + max(
            0.0, (n - 1) * (split["prep_s"] - split["state_output_s"]))
        print(f"gdn_overlap per segment: prep {split['prep_s'] * 1e6:.1f} us, state + output "
              f"{split['state_output_s'] * 1e6:.1f} us; full-overlap bound {bound * 1e6:.1f} us "
              f"({bound / base:.3f}x segmented)", flush=True)
        res.update(schemes=rows, split=split, full_overlap_bound_s=bound)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "gdn_overlap.json"), "w") as f:
        json.dump(res, f, indent=1)
    return 0 if all(bits.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
