"""bench/bisect_engine_logits.py and bench/trace_engine_ops.py on the CPU (tiny preset, reference kernels): each
tree's modeld is imported afresh, so two copies of today's code give the same digests and a copy with one changed
number does not — and the tracer names the op that changed; env specs are checked before anything loads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench" / "bisect_engine_logits.py"
TRACE = ROOT / "bench" / "trace_engine_ops.py"
NORM = "src/modeld/kernels/rmsnorm/reference.py"
LINE = "return (n * (1.0 + weight.float())).to(h.dtype)"


def _run(tmp_path, trees: str, trace: bool = False):
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    env.pop("TRITON_INTERPRET", None)
    args = ["--sides", trees] if trace else ["--trees", trees, "--flip-cases", "2"]
    return subprocess.run([sys.executable, str(TRACE if trace else BENCH), "--out", str(tmp_path / "out"), *args,
                           "--device", "cpu", "--config", "tiny", "--workers", "2", "--profile", "fp8"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _tree(tmp_path, name: str, mutate: bool) -> Path:
    tree = tmp_path / name
    for d in ("src", "bench"):
        shutil.copytree(ROOT / d, tree / d, ignore=shutil.ignore_patterns("__pycache__"))
    (tree / "COMMIT").write_text(f"{name}\n")
    if mutate:   # one number changed: the zero-centred norm's output 1 % larger
        f = tree / NORM
        src = f.read_text()
        assert LINE in src
        f.write_text(src.replace(LINE, "return (n * (1.0 + weight.float()) * 1.01).to(h.dtype)"))
    return tree


def test_same_code_same_digests_changed_code_caught(tmp_path):
    same, changed = _tree(tmp_path, "same", False), _tree(tmp_path, "changed", True)
    r = _run(tmp_path, f".,{same}|MODELD_ROUND_BITS=1,{changed}")
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((tmp_path / "out" / "bisect_engine_logits.json").read_text())
    here, copy, mutant = doc["trees"]
    assert [t.get("error") for t in doc["trees"]] == [None] * 3, doc["trees"]
    assert copy["commit"] == "same" and mutant["commit"] == "changed" and copy["env"] == {"MODELD_ROUND_BITS": "1"}
    assert copy["digests"] == here["digests"] and copy["vs_first_max_abs"] == 0
    assert mutant["digests"]["fixture"] != here["digests"]["fixture"] and mutant["vs_first_max_abs"] > 0
    assert here["positions"] == copy["positions"] > 0 and doc["reference"]["digests"]["fixture"]
    assert r.stdout.count("TREE ") == 3


def test_bad_env_spec_and_missing_tree_are_refused(tmp_path):
    r = _run(tmp_path, ".|ROUND_BITS=1")
    assert r.returncode != 0 and "MODELD_NAME=VALUE" in r.stderr
    r = _run(tmp_path, str(tmp_path / "nowhere"))
    assert r.returncode != 0 and "no src/modeld" in r.stderr


def test_trace_names_the_changed_op(tmp_path):
    same, changed = _tree(tmp_path, "same", False), _tree(tmp_path, "changed", True)
    r = _run(tmp_path, f".,{same}|MODELD_ROUND_BITS=1,{changed}", trace=True)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((tmp_path / "out" / "trace_engine_ops.json").read_text())
    here, copy, mutant = doc["sides"]
    assert here["calls"] == copy["calls"] == mutant["calls"] > 100, doc["sides"]
    assert copy["first_difference"] is None and copy["differing_calls"] == 0
    assert copy["logits_digest"] == here["logits_digest"] != mutant["logits_digest"]
    fd = mutant["first_difference"]
    # the first rmsnorm call is the first that changed; its inputs were equal, its output 1 % larger
    assert fd["kind"] == "kernel" and fd["op"].startswith("rmsnorm.") and fd["nth_call_of_op"] == 0, fd
    (out,) = fd["outputs"].values()
    assert out["differing"] > 0 and out["first"][0]["other"] != out["first"][0]["base"]
    assert mutant["differing_calls"] > 10


def test_trace_needs_two_sides(tmp_path):
    r = _run(tmp_path, ".", trace=True)
    assert r.returncode != 0 and "at least two specs" in r.stderr
