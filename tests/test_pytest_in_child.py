"""modeld.kernels._testing.pytest_in_child: the watchdog that runs a test which may hang on the GPU (the
warp-specialized TMA GEMM, session 24) in a child pytest. Its three outcomes, with a child test that passes, fails or
sleeps past the timeout depending on the flag it is given; without the flag the child test skips."""

from __future__ import annotations

import os
import time

import pytest

from modeld.kernels._testing import pytest_in_child

FLAG = "MODELD_TEST_CHILD_MODE"
NODE = "tests/test_pytest_in_child.py::test_child_body"


@pytest.mark.skipif(FLAG not in os.environ, reason="runs only inside pytest_in_child's child")
def test_child_body():
    mode = os.environ[FLAG]
    if mode == "sleep":
        time.sleep(120)
    assert mode == "pass", f"child asked to {mode}"


@pytest.mark.parametrize("mode,want", [("pass", "passed"), ("fail", "failed"), ("sleep", "timeout")])
def test_outcomes(mode, want):
    t0 = time.perf_counter()
    status, out = pytest_in_child(NODE, FLAG, timeout_s=20, flag_value=mode)
    assert status == want, out
    assert time.perf_counter() - t0 < 60
    if want == "failed":
        assert "child asked to fail" in out


def test_a_child_that_only_skips_is_not_a_pass():
    status, out = pytest_in_child(NODE, "MODELD_TEST_CHILD_MODE_UNUSED", timeout_s=20)
    assert status == "failed" and "skipped" in out, out
