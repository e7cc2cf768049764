"""Bounded fuzz run in CI: 0 hangs, 0 uncaught non-MspecError exceptions; the count is printed."""

from __future__ import annotations

import subprocess
import sys

from modeld.mspec.fuzz import run_fuzz

CI_CASES = 4000


def test_fuzz_bounded_run_has_no_failures(capsys):
    report = run_fuzz(CI_CASES, seed=20261129)
    with capsys.disabled():
        print(f"\n[{report.summary()}; errors {dict(sorted(report.errors.items()))}]")
    assert report.cases == CI_CASES
    assert not report.uncaught, report.uncaught[:3]
    assert report.hangs == 0
    # The mutations must actually reach deep checks, not only the hash check.
    for name in ("MspecSchemaError", "MspecTruncated", "MspecTrailingBytes", "MspecDirectoryHashMismatch",
                 "MspecChecksumMismatch", "MspecBadJSON"):
        assert report.errors[name] > 0, name


def test_fuzz_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "modeld.mspec.fuzz", "--count", "50", "--seed", "3"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "mspec fuzz: 50 cases" in out.stdout and "uncaught 0" in out.stdout
