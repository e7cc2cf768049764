"""bench/gdn_overlap.py on the CPU interpreter: every schedule of one layer-piece's GDN launches (segmented, the
preps on a side stream, preps first, one call) leaves the same output and state bit for bit — the claim the H200
timing rests on — and bad arguments are refused."""

from __future__ import annotations

import json

import pytest

from bench import gdn_overlap


@pytest.mark.parametrize("heads, segment", [("1,2,32,32", 64), ("1,3,64,48", 128)], ids=["plain-state", "kpre"])
def test_every_schedule_gives_the_segmented_bits(heads, segment, tmp_path):
    rc = gdn_overlap.main(["--out", str(tmp_path), "--device", "cpu", "--check-only", "--tokens", "256",
                           "--segment", str(segment), "--heads", heads])
    doc = json.loads((tmp_path / "gdn_overlap.json").read_text())
    assert rc == 0 and doc["same_bits"] == {"segmented": True, "overlap": True, "preps-first": True, "one-call": True}
    assert doc["kernels"]["kpre"] == (heads == "1,3,64,48")


@pytest.mark.parametrize("args", [["--segment", "100"], ["--tokens", "300", "--segment", "64"],
                                  ["--heads", "2,3,32,32"], ["--heads", "1,2"], ["--device", "cpu"]],
                         ids=["segment-not-64", "segment-not-dividing", "hv-not-multiple", "heads-short",
                              "cpu-timing"])
def test_bad_arguments_are_refused(args, tmp_path):
    with pytest.raises(SystemExit) as exc:
        gdn_overlap.main(["--out", str(tmp_path), *args])
    assert exc.value.code == 2
