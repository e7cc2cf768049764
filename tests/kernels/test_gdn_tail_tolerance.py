"""The correlated-keys state check's tail allowance (gdn_problem.assert_close_but_tail) still fails what it must."""

from __future__ import annotations

import pytest
import torch

from modeld.kernels._testing import tolerance
from gdn_problem import TAIL_ELEMENTS, TAIL_SLACK, assert_close_but_tail

ROW = tolerance(torch.float32, tf32=True)


def _off(n_elements: int, factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(actual, expected) with `n_elements` off by `factor` x the row's limit, the rest exact."""
    expected = torch.linspace(-1, 1, 4096)
    actual = expected.clone()
    idx = torch.arange(n_elements) * 17
    actual[idx] += factor * (ROW.atol + ROW.rtol * expected[idx].abs())
    return actual, expected


@pytest.mark.parametrize("n", range(1, TAIL_ELEMENTS + 1))
def test_a_short_tail_just_past_the_row_passes(n):
    assert_close_but_tail(*_off(n, 0.9 * TAIL_SLACK), tol=ROW, what="state")


@pytest.mark.parametrize("n, factor", [(TAIL_ELEMENTS + 1, 1.1), (1, 1.1 * TAIL_SLACK), (181, 2.0)],
                         ids=["one-too-many", "one-too-far", "v1-prep-like"])
def test_more_or_farther_misses_fail(n, factor):
    with pytest.raises(AssertionError, match="state"):
        assert_close_but_tail(*_off(n, factor), tol=ROW, what="state")


def test_non_finite_values_fail():
    actual, expected = _off(0, 0.0)
    actual[3] = float("nan")
    with pytest.raises(AssertionError, match="non-finite"):
        assert_close_but_tail(actual, expected, tol=ROW, what="state")
