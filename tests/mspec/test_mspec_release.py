"""`MspecFile.release` / `MspecSource.release`: a loader drops each tensor's pages after copying it,
so the process's peak RSS holds the arena plus about one tensor, not the arena plus the whole file."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from modeld.execution.errors import MissingTensorError
from modeld.execution.sources import MspecSource
from modeld.mspec import PlannedObject, write_mspec
from modeld.mspec import errors as E
from modeld.mspec import format as F

N_TENSORS, ROWS, COLS = 12, 1024, 4096  # 12 x 8 MiB of bf16


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    gen = torch.Generator().manual_seed(0)
    tensors = {f"w{i}": torch.randn(ROWS, COLS, generator=gen).bfloat16() for i in range(N_TENSORS)}
    path = tmp_path_factory.mktemp("rel") / "a.mspec"
    plan = [PlannedObject(n, "tensor", "bfloat16", (ROWS, COLS), F.PLAIN, (lambda t=t: t)) for n, t in tensors.items()]
    write_mspec(path, model_id="m", family="f", recipe={}, metadata={}, objects=plan)
    return path, tensors


def test_release_keeps_values_and_views(artifact):
    path, tensors = artifact
    src = MspecSource(path)
    try:
        view = src.tensor("w3")
        before = view.clone()
        assert src.release("w3") >= ROWS * COLS * 2
        assert torch.equal(view, before) and torch.equal(src.tensor("w3"), tensors["w3"])
        with pytest.raises(MissingTensorError):
            src.release("nope")
        with pytest.raises(E.MspecObjectNotFound):
            src.file.release("nope")
    finally:
        src.close()


_CHILD = """
import re, sys, torch
from modeld.execution.sources import MspecSource
src, arena = MspecSource(sys.argv[1]), []
for name in src.names():
    t = src.tensor(name)
    arena.append(torch.empty_like(t).copy_(t))
    del t
    if sys.argv[2] == "release":
        src.release(name)
print("HWM_KB", re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1))
"""


def _peak_mb(path, mode: str) -> float:
    run = subprocess.run([sys.executable, "-c", _CHILD, str(path), mode], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return int(run.stdout.rsplit("HWM_KB", 1)[1]) / 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmHWM and MADV_DONTNEED are Linux")
def test_release_bounds_peak_rss(artifact, capsys):
    path, _ = artifact
    keep, release = _peak_mb(path, "keep"), _peak_mb(path, "release")
    file_mb = N_TENSORS * ROWS * COLS * 2 / 2**20
    with capsys.disabled():
        print(f"\n[mspec release] peak RSS loading a {file_mb:.0f} MB artifact into a CPU arena: "
              f"{keep:.0f} MB keeping the pages, {release:.0f} MB releasing them")
    assert keep - release > 0.6 * file_mb  # the file's pages no longer add up on top of the arena
