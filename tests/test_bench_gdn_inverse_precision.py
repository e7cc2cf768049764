"""bench/gdn_inverse_precision.py: the CPU emulation behind the product prep's INV_PRECISION ("tf32x3")."""

from __future__ import annotations

import json

from bench import gdn_inverse_precision as gip


def test_tf32_series_loses_the_inverse_for_correlated_keys_and_tf32x3_does_not(tmp_path):
    out = tmp_path / "prec.json"
    assert gip.main(["--seeds", "1", "--out", str(out)]) == 0
    rows = {(r["keys"], r["scheme"]): r for r in json.loads(out.read_text())["rows"]}
    near = "near-parallel (spread 0.05)"
    kernel = "product, series tf32x3, rest tf32 (the kernel)"
    blocked = "blocked (fp32 substitution, tf32 products)"
    assert rows[(near, "product, all tf32")]["max_abs_err_X"] > 0.1  # why the series is not plain tf32
    assert rows[(near, kernel)]["max_abs_err_X"] < 5e-3
    assert rows[(near, kernel)]["max_rel_err_U"] < 2 * rows[(near, blocked)]["max_rel_err_U"]
    assert rows[("random", kernel)]["max_abs_err_X"] < 1e-3
    assert rows[(near, kernel)]["max_abs_Ld8"] > 100  # the inputs do make the series' terms large
    # the whole chunked prefill: the kernel's scheme stays inside the GPU tests' rows, plain tf32 does not
    pipe = {(r["keys"], r["scheme"]): r for r in json.loads(out.read_text())["pipeline"]}
    assert pipe[(near, "product, series tf32x3 (the kernel)")]["state_err_over_tf32_tol"] < 0.8
    assert pipe[(near, "product, all tf32")]["state_err_over_tf32_tol"] > 1


def test_tf32_rounding_keeps_ten_mantissa_bits():
    import torch

    x = torch.tensor([1.0 + 2**-10, 1.0 + 2**-12, 1.0 + 2**-11 + 2**-13])
    assert gip.to_tf32(x).tolist() == [1.0 + 2**-10, 1.0, 1.0 + 2**-10]
