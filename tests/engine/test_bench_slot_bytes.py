"""bench/slot_bytes.py on CPU (small preset): the old and new slot-bytes paths give identical bytes and load back
identical state; the new save holds one copy of the state at its peak, not two."""

from __future__ import annotations

import json

from test_cert_dryrun import BENCH, _run


def test_slot_bytes_dry_run(tmp_path):
    r = _run([str(BENCH / "slot_bytes.py"), "--out", str(tmp_path), "--device", "cpu", "--config", "small",
              "--positions", "256", "--runs", "2"], 180)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads((tmp_path / "slot_bytes.json").read_text())
    assert doc["bytes_identical"] and doc["state_bytes"] > 0
    for mode in ("old", "new"):
        m = doc["modes"][mode]
        assert m["state_unchanged_after_load"] and m["save_best_s"] > 0 and m["load_best_s"] > 0
