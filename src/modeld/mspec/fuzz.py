"""Mutation fuzzer for the .mspec reader: `python -m modeld.mspec.fuzz --count N --seed S`.

Each case mutates a valid sample file (raw byte flips, truncation, extension, header-field
rewrites, or structure-aware directory edits re-sealed with a correct hash so they reach the
schema/tiling/identity checks), then opens it with verify=True and reads every object. Outcomes:
rejected with an MspecError (fine), accepted (fine only if every object then reads), or a failure:
any other exception (uncaught) or a case over the time limit (hang). Exit status 1 on any failure.
Deterministic for a given seed. Writes only temporary files it removes.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from modeld.mspec import format as F
from modeld.mspec.crafting import SAMPLE_IDENTITY, reseal, sample_objects, split
from modeld.mspec.errors import MspecError
from modeld.mspec.reader import open_mspec
from modeld.mspec.writer import write_mspec


class _Hang(Exception):
    pass


@dataclass
class FuzzReport:
    cases: int = 0
    rejected: int = 0
    accepted: int = 0
    hangs: int = 0
    uncaught: list[str] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not self.uncaught and not self.hangs

    def summary(self) -> str:
        return (f"mspec fuzz: {self.cases} cases, {self.rejected} rejected with named errors, "
                f"{self.accepted} accepted, crashes 0 (process survived), hangs {self.hangs}, "
                f"uncaught {len(self.uncaught)}")


_JUNK = [None, True, False, -1, 0, 1, 255, 256, 257, 2**31, 2**63, 2**70, -(2**63), 1.5, float("nan"),
         "", "x", "\u0000", "\ud800", "plain", "tensor", "blob", "bfloat16", "uint8", "../etc/passwd",
         [], [0], [-1], [2**40, 2**40], [1] * 9, {}, {"a": 1}, "0" * 64, "sha256:" + "0" * 64]


def _mutate_tree(node, rng: random.Random, depth: int = 0):
    """Return a copy of a JSON tree with one random edit somewhere inside."""
    if isinstance(node, dict) and node and depth < 6 and rng.random() < 0.8:
        key = rng.choice(sorted(node, key=str))
        out = dict(node)
        roll = rng.random()
        if roll < 0.1:
            del out[key]
        elif roll < 0.2:
            out[f"extra{rng.randrange(9)}"] = rng.choice(_JUNK)
        else:
            out[key] = _mutate_tree(node[key], rng, depth + 1)
        return out
    if isinstance(node, list) and node and depth < 6 and rng.random() < 0.8:
        out = list(node)
        i = rng.randrange(len(out))
        roll = rng.random()
        if roll < 0.15:
            del out[i]
        elif roll < 0.3:
            out.insert(rng.randrange(len(out) + 1), out[i])
        elif roll < 0.4:
            j = rng.randrange(len(out))
            out[i], out[j] = out[j], out[i]
        else:
            out[i] = _mutate_tree(out[i], rng, depth + 1)
        return out
    if isinstance(node, int) and not isinstance(node, bool) and rng.random() < 0.6:
        return node + rng.choice([-256, -1, 1, 2, 255, 256, 4096, -node, node])
    return rng.choice(_JUNK)


def mutate(base: bytes, rng: random.Random) -> bytes:
    """One random mutation of `base` (deterministic for the rng state)."""
    kind = rng.randrange(6)
    data = bytearray(base)
    if kind == 0:                                   # raw byte flips anywhere
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] ^= rng.randint(1, 255)
    elif kind == 1:                                 # truncation
        del data[rng.randrange(len(data)):]
    elif kind == 2:                                 # extension
        data += bytes(rng.randint(0, 255) for _ in range(rng.randint(1, 600)))
    elif kind == 3:                                 # header field rewrite
        field_at = rng.choice([9, 12, 16, 24])
        width = {9: 3, 12: 4, 16: 8, 24: 8}[field_at]
        value = rng.choice([0, 1, 2, 64, 255, 256, len(base), 2**32 - 1, 2**63, rng.getrandbits(64)])
        data[field_at:field_at + width] = (value % (1 << (8 * width))).to_bytes(width, "little")
    else:                                           # structure-aware, re-sealed
        directory, payload = split(base)
        edited = _mutate_tree(directory, rng)
        if not isinstance(edited, dict):
            edited = {"format": edited}
        data = bytearray(reseal(edited, payload, fix_identities=kind == 4))
    return bytes(data)


def _exercise(path: Path) -> None:
    with open_mspec(path, verify=True) as m:
        for entry in m.objects:
            (m.blob if entry.kind == "blob" else m.tensor)(entry.name)


def _alarm(signum, frame):
    raise _Hang()


def run_fuzz(count: int, seed: int, time_limit_s: float = 5.0) -> FuzzReport:
    """Run `count` cases; returns the report (never raises for a failing case)."""
    rng = random.Random(seed)
    report = FuzzReport()
    with tempfile.TemporaryDirectory(prefix="mspec-fuzz-") as tmp:
        base_path = Path(tmp) / "base.mspec"
        write_mspec(base_path, objects=sample_objects(), **SAMPLE_IDENTITY)
        base = base_path.read_bytes()
        case_path = Path(tmp) / "case.mspec"
        previous = signal.signal(signal.SIGALRM, _alarm)
        try:
            for i in range(count):
                case_path.write_bytes(mutate(base, rng))
                report.cases += 1
                signal.setitimer(signal.ITIMER_REAL, time_limit_s)
                try:
                    _exercise(case_path)
                    report.accepted += 1
                except MspecError as err:
                    report.rejected += 1
                    report.errors[type(err).__name__] += 1
                except _Hang:
                    report.hangs += 1
                except Exception:   # noqa: BLE001 - the point is to catch everything else
                    report.uncaught.append(f"case {i}: {traceback.format_exc(limit=3)}")
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
        finally:
            signal.signal(signal.SIGALRM, previous)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m modeld.mspec.fuzz",
                                description="Fuzz the .mspec reader with random mutations of a valid "
                                            "file; exit 1 on any uncaught exception or hang.")
    p.add_argument("--count", type=int, default=2000, help="number of mutated files (default 2000)")
    p.add_argument("--seed", type=int, default=0, help="RNG seed (default 0)")
    p.add_argument("--time-limit", type=float, default=5.0, help="seconds per case before it counts as a hang")
    p.add_argument("--json", action="store_true", help="also print the report as JSON")
    args = p.parse_args(argv)
    start = time.perf_counter()
    report = run_fuzz(args.count, args.seed, args.time_limit)
    print(f"{report.summary()} (seed {args.seed}, {time.perf_counter() - start:.1f} s)")
    for line in report.uncaught[:5]:
        print(line, file=sys.stderr)
    if args.json:
        print(json.dumps({"cases": report.cases, "rejected": report.rejected, "accepted": report.accepted,
                          "hangs": report.hangs, "uncaught": len(report.uncaught),
                          "errors": dict(sorted(report.errors.items()))}))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
