"""bench/ncu_gemv_m1.py --summarize on recorded Nsight Compute pages (certs/): one row per GEMV launch, labelled by
the format of its kernel, so a profile of a subset of formats (--formats) is labelled right too."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import ncu_gemv_m1 as N  # noqa: E402

SHAPES = ["gate+up", "down", "in_proj", "qkv", "o_proj"]


def _tags(csv_path: Path) -> list[str]:
    rows = N.summarize(str(csv_path)).splitlines()[2:]
    return [r.split(" | ")[0].lstrip("| ") for r in rows]


def test_all_three_formats_in_order():
    tags = _tags(ROOT / "certs" / "ncu-gemv-m1-s13-4ea1332" / "gemv_m1_raw.csv")
    assert tags == [f"{fmt} / {s}" for fmt in N.FORMATS for s in SHAPES]


def test_an_int4_only_profile():
    tags = _tags(ROOT / "certs" / "ncu-gemv-m1-bcast-s14-04a0ef3" / "ncu_onehot_raw.csv")
    assert tags == [f"int4g128 / {s}" for s in SHAPES]
