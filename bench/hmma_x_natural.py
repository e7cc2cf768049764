"""What would an int4 nibble order matched to x's natural pairs buy the int4 M = 1 mma.sync GEMV (`gemv_hmma`)?

Every thread of `_gemv_int4_hmma_kernel` re-pairs x with 4 PRMT per word (`_hmma_fragments._x_pairs`: the decode's
A quad holds nibbles (0, 2), (4, 6), then (1, 3), (5, 7), so B needs (x0, x2), (x4, x6), (x1, x3), (x5, x7)). That
is 32 of the loop's 245 SASS instructions per iteration. If the converter stored k = 8w + (0, 4, 1, 5, 2, 6, 3, 7)
in nibbles 0..7 of word w (so nibbles 0, 2, 4, 6 hold k 0-3 and 1, 3, 5, 7 hold k 4-7), the natural pairs of x's
16-byte load would already be the B fragment. The kernel for that layout is this module's `natural_kernel()`: the
default kernel with `_x_pairs` replaced by the identity, nothing else changed.

This bench measures that kernel's speed without changing the layout. The timing is exact, since the instructions
and bytes are those of the real kernel. The results are not: the weights are still in today's order.
* `--offline` (CPU): SASS per loop iteration of both kernels at the 27B shapes;
* `--kernels` (H200): both kernels at the five 27B int4 shapes, interleaved, p50 of graph replays, weights
  rotated past L2 (`bench/kernels.py` rows, in $OUT/kernels.json);
* `--engine ...` (H200): `bench/engine_ab.py` with the switch MODELD_WHATIF_X_NATURAL (0 / 1) installed in
  `linear.triton`, e.g. `--engine --profiles int4 --rounds 3 --variant base:MODELD_WHATIF_X_NATURAL=0
  --variant natural:MODELD_WHATIF_X_NATURAL=1`. The natural variant's logits are wrong by construction, so its
  max |Δ| is large and means nothing; only its tok/s count.

    PYTHONPATH=src:. python3 bench/hmma_x_natural.py --offline                     # CPU, ~15 s
    TRITON_INTERPRET=1 PYTHONPATH=src:. python3 bench/hmma_x_natural.py --check cpu   # CPU, the layout claim
    PYTHONPATH=src:. python3 bench/hmma_x_natural.py --check cuda                  # H200, the same with the PTX
    PYTHONPATH=src:. python3 bench/hmma_x_natural.py --kernels --out $OUT          # H200, ~1 min
    PYTHONPATH=src:. python3 bench/hmma_x_natural.py --engine --out $OUT --profiles int4 --rounds 3 \\
        --variant base:MODELD_WHATIF_X_NATURAL=0 --variant natural:MODELD_WHATIF_X_NATURAL=1
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import types

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(_HERE, "..", "src"), _HERE, os.path.join(_HERE, "..")]

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

SWITCH_ENV = "MODELD_WHATIF_X_NATURAL"


@triton.jit
def _x_pairs_natural(x01, x23, x45, x67, ASM: tl.constexpr):
    """The B fragment for the natural-pair nibble order: x's own pairs, no PRMT."""
    return x01, x23, x45, x67


def natural_kernel():
    """`_gemv_int4_hmma_kernel` whose `_pair_load` takes x's natural pairs (`_x_pairs_natural`): the same source,
    re-jitted over a copy of gemv_hmma's globals in which `_x_pairs` (and hence `_pair_load`) is replaced."""
    from modeld.kernels.linear import gemv_hmma as gh
    g = dict(vars(gh))
    g["_x_pairs"] = _x_pairs_natural
    for name in ("_pair_load", "_gemv_int4_hmma_kernel"):
        fn = getattr(gh, name).fn
        copy = types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)
        copy.__annotations__ = dict(fn.__annotations__)  # the tl.constexpr marks live here, not in __code__
        copy.__kwdefaults__ = fn.__kwdefaults__
        g[name] = triton.jit(copy)
    return g["_gemv_int4_hmma_kernel"]


class _Switch:
    """Stands in for `linear.triton._gemv_int4_hmma_kernel`: `kernel[grid]` picks the natural kernel when
    $MODELD_WHATIF_X_NATURAL is "1" at launch (or capture) time, else the default one."""

    def __init__(self, default, natural):
        self.default, self.natural = default, natural

    def __getitem__(self, grid):
        return (self.natural if os.environ.get(SWITCH_ENV) == "1" else self.default)[grid]


def install_switch():
    from modeld.kernels.linear import triton as tt
    tt._gemv_int4_hmma_kernel = _Switch(tt._gemv_int4_hmma_kernel, natural_kernel())


NATURAL_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # nibble i of a word holds k = 8 w + NATURAL_ORDER[i]


def to_natural_order(q):
    """Packed int4 weights [rows, K / 2] (uint8, nibble i of int32 word w = k 8w + i, low nibble first) re-packed so
    that nibble i holds k = 8w + NATURAL_ORDER[i]."""
    import torch
    nib = torch.stack([q & 15, q >> 4], dim=-1).reshape(q.shape[0], -1, 8)  # [rows, K / 8, 8] in k order
    nib = nib[:, :, list(NATURAL_ORDER)].reshape(q.shape[0], -1, 2)
    return (nib[..., 0] | (nib[..., 1] << 4)).to(torch.uint8)


def check(device: str) -> int:
    """The natural kernel on weights re-packed in NATURAL_ORDER equals the spec on the original packing (CPU: the
    interpreter's emulated mma; GPU: the PTX), at awkward and 27B shapes: the layout claim, before any converter
    change."""
    import torch

    from modeld.kernels._testing import assert_close
    from modeld.kernels.linear import gemv_hmma as gh
    from modeld.kernels.linear import quant
    from modeld.kernels.linear import reference as ref
    nat = natural_kernel()
    gen = torch.Generator(device=device).manual_seed(0)
    cases = [(37, 640, True, 2), (70, 2048, False, 4)] if device == "cpu" else \
        [(17408, 5120, True, None), (5120, 17408, False, None), (5120, 6144, False, None), (333, 640, True, None)]
    for n, k, sw, split in cases:
        w = torch.randn(2 * n if sw else n, k, generator=gen, device=device) / k**0.5
        x = (torch.randn(1, k, generator=gen, device=device) * 2).bfloat16()
        q, s, m = quant.quantize_int4(w, 128)
        cfg = gh.HmmaGemvConfig(2, 4, split) if split else gh.pick(90, sw, n, k, 132, False)
        got = gh.launch_int4_hmma(x, to_natural_order(q), s, m, torch.empty(1, n, dtype=torch.bfloat16, device=device),
                                  sw, 128, cfg, kernel=nat)
        want = (ref.swiglu_linear_int4 if sw else ref.linear_int4)(x, q, s, m)
        assert_close(got, want, what=f"natural-order hmma {n}x{k} swiglu={sw}")
        print(f"natural order ok: N {n} K {k} swiglu {sw} cfg {cfg}", flush=True)
    return 0


def offline() -> int:
    import gemv_hmma_sass as hs
    from bench import feasibility as feas

    nat = natural_kernel()
    print("| shape | kernel | regs | spill B | iteration instr | PRMT | loads / HMMA order |")
    print("|---|---|---|---|---|---|---|")
    for label, jit, _, a, kw in hs.pick_launches():
        for tag, kern in (("default", jit), ("natural x pairs", nat)):
            compiled, regs, spill = feas._compile_offline(kern, a, kw)
            ins, _ = hs.iteration(compiled.asm["sass"])
            prmt = sum(re.match(r"(?:@!?U?P\w+ )?PRMT\b", i) is not None for i in ins)
            print(f"| {label} | {tag} | {regs} | {spill} | {len(ins)} | {prmt} | {hs.load_order(ins)} |", flush=True)
    return 0


def kernels(out: str, reps: int) -> int:
    import torch

    from bench import kernels as K
    install_switch()
    K.start_run(out, os.environ.get("MODELD_COMMIT"))  # as bench/kernels.py: PDL off unless the caller sets it
    K.ceilings(reps)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for label, n, k, sw in K.LINEAR_SHAPES:
        for rnd in range(2):
            for val, tag in (("0", "default"), ("1", "natural x pairs (wrong results)")):
                os.environ[SWITCH_ENV] = val
                K.bench_linear(1, "int4g128", label, n, k, sw, reps, gen, variant="hmma", baseline=False,
                               tag=f" [x-natural what-if: {tag}, round {rnd}]")
    os.environ.pop(SWITCH_ENV, None)  # every row went to $OUT/kernels.json as it was added
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--offline", action="store_true", help="CPU: SASS of both kernels (no GPU)")
    mode.add_argument("--check", choices=("cpu", "cuda"),
                      help="the natural kernel on weights re-packed in NATURAL_ORDER against the spec (cpu: run under "
                      "TRITON_INTERPRET=1)")
    mode.add_argument("--kernels", action="store_true", help="H200: both kernels at the 27B int4 shapes")
    mode.add_argument("--engine", action="store_true",
                      help="H200: bench/engine_ab.py with the switch installed; the remaining arguments go to it")
    ap.add_argument("--out", default=".", help="output folder (--kernels)")
    ap.add_argument("--reps", type=int, default=10, help="graph replays per timing (--kernels)")
    args, rest = ap.parse_known_args(argv)
    if args.offline:
        return offline()
    if args.check:
        return check(args.check)
    if args.kernels:
        return kernels(args.out, args.reps)
    import engine_ab
    install_switch()
    return engine_ab.main(["--out", args.out, *rest])


if __name__ == "__main__":
    raise SystemExit(main())
