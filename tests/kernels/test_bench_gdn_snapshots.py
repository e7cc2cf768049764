"""bench/gdn_snapshots.py on the CPU interpreter: one layer-piece's checkpoints in segments, in one pass, and the
piece without them leave the same output and state (and the same snapshots) bit for bit — the claim the H200 timing
rests on — and bad arguments are refused."""

from __future__ import annotations

import json

import pytest

from bench import gdn_snapshots


@pytest.mark.parametrize("heads, segment", [("1,2,32,32", 64), ("1,3,64,48", 128)], ids=["plain-state", "kpre"])
def test_every_scheme_gives_the_segments_bits(heads, segment, tmp_path):
    rc = gdn_snapshots.main(["--out", str(tmp_path), "--device", "cpu", "--check-only", "--tokens", "256",
                             "--segment", str(segment), "--heads", heads])
    doc = json.loads((tmp_path / "gdn_snapshots.json").read_text())
    assert rc == 0 and doc["same_bits"] == {"segments": True, "in-pass": True, "no-snapshots": True}
    assert doc["kernels"]["kpre"] == (heads == "1,3,64,48")


@pytest.mark.parametrize("args", [["--segment", "100"], ["--tokens", "300", "--segment", "64"],
                                  ["--tokens", "256", "--segment", "256"], ["--heads", "2,3,32,32"],
                                  ["--heads", "1,2"], ["--device", "cpu"]],
                         ids=["segment-not-64", "segment-not-dividing", "one-segment", "hv-not-multiple",
                              "heads-short", "cpu-timing"])
def test_bad_arguments_are_refused(args, tmp_path):
    with pytest.raises(SystemExit) as exc:
        gdn_snapshots.main(["--out", str(tmp_path), *args])
    assert exc.value.code == 2
