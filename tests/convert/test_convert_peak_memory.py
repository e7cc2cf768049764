"""Peak memory of `modeld convert` does not grow with depth (streaming, one tensor at a time).

Fast variant for CI (small widths, 4 vs 32 layers: if the converter held the model, peak RSS
would grow by the ~70 MB difference). The 27B-width measurement (4 vs 8 layers) is a manual run
recorded in KNOWLEDGE/findings/convert-peak-rss-27b-widths.md.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from modeld.convert.qwen3_5_spec import preset
from modeld.convert.synth import write_synthetic

# VmHWM, not getrusage(RUSAGE_SELF).ru_maxrss: Linux carries ru_maxrss across execve, so a child
# forked from a big pytest process would report the parent's RSS (measured: 1685 MB for both
# depths); VmHWM belongs to the new address space and starts at zero at exec.
_CHILD = ("import re, sys\nfrom modeld.convert.commands import convert_main\nconvert_main(sys.argv[1:])\n"
          "print('MAXRSS_KB', re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))")


def _peak_kb(src, out, profile) -> int:
    run = subprocess.run([sys.executable, "-c", _CHILD, str(src), "-o", str(out), "--profile", profile],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return int(run.stdout.rsplit("MAXRSS_KB", 1)[1])


@pytest.mark.parametrize("profile", ["int4"])
def test_peak_rss_is_independent_of_depth(tmp_path, profile, capsys):
    sizes = {}
    for layers in (4, 32):
        src = tmp_path / f"src{layers}"
        result = write_synthetic(preset("small", layers), 0, src, workers=1)
        sizes[layers] = (result.total_bytes, _peak_kb(src, tmp_path / f"o{layers}.mspec", profile))
    grow_mb = (sizes[32][1] - sizes[4][1]) / 1024
    ckpt_grow_mb = (sizes[32][0] - sizes[4][0]) / 2**20
    with capsys.disabled():
        print(f"\n[convert peak RSS, small widths, {profile}] L4: {sizes[4][1] / 1024:.0f} MB, "
              f"L32: {sizes[32][1] / 1024:.0f} MB (checkpoint grows by {ckpt_grow_mb:.0f} MB)")
    assert grow_mb < 0.3 * ckpt_grow_mb
