"""Every qualify entry point explains itself with --help (and imports nothing heavy to do so)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("module", ["modeld.qualify.parity", "modeld.qualify.fixtures",
                                    "modeld.qualify.quality"])
def test_help(module, capsys):
    mod = __import__(module, fromlist=["main"])
    with pytest.raises(SystemExit) as exc:
        mod.main(["--help"])
    assert exc.value.code == 0
    assert len(capsys.readouterr().out) > 200


def test_bench_help_and_light_imports():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "hf_control_27b.py"), "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "--new-tokens" in out and "hf_control_27b_fixture.json" in out
    code = ("import sys, modeld.qualify.parity, modeld.qualify.fixtures, modeld.qualify.quality, "
            "modeld.qualify.synth_stream; bad = {'torch', 'transformers', 'pydantic'} & set(sys.modules); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
