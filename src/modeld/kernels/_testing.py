"""Shared helpers for kernel tests (used by tests/kernels/*): tolerances, poison, comparison.

One tolerance table for every op, keyed by the dtype of the compared tensor. A comparison never
lets NaN or Inf through (poisoned outputs that a kernel failed to write stay NaN and fail), and
there is no retry or warn-only mode.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import torch

from modeld.kernels._checks import interpreting

__all__ = [
    "Tolerance",
    "TOLERANCES",
    "tolerance",
    "assert_close",
    "poison",
    "poisoned_empty",
    "interpreting",
    "cuda_available",
    "test_device",
    "seeded_generator",
    "pytest_in_child",
]


@dataclass(frozen=True)
class Tolerance:
    """`|actual - expected| <= atol + rtol * |expected|` elementwise."""

    atol: float
    rtol: float


# Why these numbers: bf16 has an 8-bit mantissa (1 ulp = 2^-8 relative = 0.0039), and two correct
# implementations that round intermediates at different points may differ by ~2 ulp. fp16 has 11
# bits. fp32 results differ only by summation order (reductions over <= 17408 terms).
# "tf32" is for fp32 results of tl.dot chains on the GPU, where Triton multiplies in tf32 (10-bit
# mantissa) unless told otherwise.
TOLERANCES: dict[str, Tolerance] = {
    "bfloat16": Tolerance(atol=1.6e-2, rtol=1.6e-2),
    "float16": Tolerance(atol=2e-3, rtol=2e-3),
    "float32": Tolerance(atol=1e-4, rtol=1e-4),
    "tf32": Tolerance(atol=5e-3, rtol=5e-3),
}


def tolerance(dtype: torch.dtype, *, tf32: bool = False) -> Tolerance:
    """The table row for `dtype` (`tf32=True` picks the tf32 row for float32)."""
    if tf32 and dtype == torch.float32:
        return TOLERANCES["tf32"]
    key = str(dtype).removeprefix("torch.")
    if key not in TOLERANCES:
        raise KeyError(f"no tolerance for dtype {dtype}; add a row to TOLERANCES")
    return TOLERANCES[key]


def assert_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    tol: Tolerance | None = None,
    what: str = "output",
) -> None:
    """Fail unless shapes and dtypes match, `actual` is all finite, and values agree within `tol`.

    `tol` defaults to the table row for `expected.dtype`. NaN/Inf in `actual` always fail (even
    where `expected` is NaN: references in these tests produce finite values).
    """
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    bad = ~torch.isfinite(a)
    assert not bool(bad.any()), f"{what}: {int(bad.sum())} non-finite values in actual (poison left unwritten?)"
    assert bool(torch.isfinite(e).all()), f"{what}: the reference produced non-finite values"
    t = tol if tol is not None else tolerance(expected.dtype)
    err = (a - e).abs()
    limit = t.atol + t.rtol * e.abs()
    over = err > limit
    if bool(over.any()):
        idx = int(torch.argmax((err - limit).flatten()))
        pos = tuple(int(i) for i in torch.unravel_index(torch.tensor(idx), a.shape))
        raise AssertionError(
            f"{what}: {int(over.sum())}/{a.numel()} elements beyond atol={t.atol} rtol={t.rtol}; "
            f"worst at {pos}: actual {a[pos].item():.6g} expected {e[pos].item():.6g} "
            f"(max abs err {err.max().item():.3g})"
        )


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill `t` in place with NaN (float) or an extreme value (int); return it."""
    if t.dtype.is_floating_point:
        t.fill_(float("nan"))
    else:
        t.fill_(torch.iinfo(t.dtype).min)
    return t


def poisoned_empty(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """A fresh buffer full of poison, for kernels that write into a caller's buffer."""
    return poison(torch.empty(shape, dtype=dtype, device=device))


def cuda_available() -> bool:
    """A CUDA device is present (GPU tests run; the interpreter is not used)."""
    return torch.cuda.is_available()


def test_device() -> torch.device:
    """Where kernel tests allocate: CUDA when present, else CPU (requires TRITON_INTERPRET=1)."""
    if cuda_available():
        return torch.device("cuda")
    if not interpreting():
        raise RuntimeError("no CUDA device and TRITON_INTERPRET is not set (tests/kernels/conftest.py sets it)")
    return torch.device("cpu")


test_device.__test__ = False  # not a pytest test despite the name


def seeded_generator(request_node_name: str, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator seeded from the test id plus `MODELD_TEST_SEED` (default: fresh per process).

    Inputs are fresh random per test; the seed is printed on failure by conftest so a failing draw
    can be reproduced with `MODELD_TEST_SEED=<n>`.
    """
    base = int(os.environ.get("MODELD_TEST_SEED", str(_PROCESS_SEED)))
    g = torch.Generator(device=device)
    g.manual_seed((base * 1_000_003 + _stable_hash(request_node_name)) % (2**63))
    return g


def _stable_hash(text: str) -> int:
    h = 1469598103934665603
    for ch in text.encode():
        h = ((h ^ ch) * 1099511628211) % (2**64)
    return h


_PROCESS_SEED = int.from_bytes(os.urandom(4), "little")


def pytest_in_child(nodeid: str, flag_env: str, timeout_s: float, flag_value: str = "1") -> tuple[str, str]:
    """Run one test (pytest node id, relative to the working directory) in a child pytest under a watchdog, with
    $flag_env = flag_value so that the test runs there (it skips elsewhere). For a kernel that may never finish on
    the GPU (KNOWLEDGE/pitfalls/gemm-warp-specialized-never-finished-h200.md): a hang in the suite's own process
    would hold its worker until the suite's timeout and cost every test queued behind it. Returns ("passed" |
    "failed" | "timeout", the child's last 3000 characters of output); the child is killed at the timeout."""
    env = {**os.environ, flag_env: flag_value}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-m", "gpu or not gpu",
           nodeid]
    try:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return "timeout", out[-3000:]
    out = (r.stdout + r.stderr)[-3000:]
    # a child that skipped (the flag not honoured, no GPU) ran nothing: not a pass
    ran = " passed" in r.stdout and " skipped" not in r.stdout and " deselected" not in r.stdout
    return ("passed" if r.returncode == 0 and ran else "failed"), out


def offline_compile_rows(code: str, tag: str, root) -> list[dict[str, str]]:
    """Run `code` (a script that compiles kernels offline for sm_90 and prints one "TAG key=value ..." line per
    launch) in a child Python without the Triton interpreter, the repo's src/ and root on its path; returns each
    tagged line as {key: value}. Asserts the child succeeded (its output in the message otherwise)."""
    env = {**os.environ, "PYTHONPATH": f"{os.path.join(str(root), 'src')}{os.pathsep}{root}", "OMP_NUM_THREADS": "1"}
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return [dict(kv.split("=") for kv in ln.split()[1:]) for ln in r.stdout.splitlines() if ln.startswith(tag + " ")]
