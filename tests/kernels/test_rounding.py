"""`_tl.round_to`: the GPU's one RTNE convert ($MODELD_ROUND_BITS=0; the GPU default in sessions 30-32) against the
bit trick the interpreter needs (=1; the compiled default again since session 33, when the 27B engine's certification
logits moved with the convert): fewer instructions offline, no bf16 arithmetic for LLVM to contract across a
rounding, the same bits on the H200 in every probed kernel family."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from modeld.kernels._testing import offline_compile_rows

ROOT = Path(__file__).resolve().parents[2]

# the kernels whose instruction counts the convert cuts most (offline sm_90, s30's inline convert: rmsnorm 816 -> 560,
# rope 1504 -> 1168, conv prefill 2560 -> 2056, the gated GDN output 2864 -> 2360), through bench/sass_counts.py
KERNELS = ("rmsnorm", "rope", "conv_prefill_rest", "gdn_v2_out_gated")
COUNT_CODE = (f"from bench.sass_counts import main; "
              f"main(['--only', {','.join(KERNELS)!r}, '--gated-norm-tiles', '16x4'])")


def _counts(bits: str | None) -> dict[str, dict[str, str]]:
    """The rows with $MODELD_ROUND_BITS=bits (None: unset, the compiled default)."""
    saved = os.environ.pop("MODELD_ROUND_BITS", None)
    if bits is not None:
        os.environ["MODELD_ROUND_BITS"] = bits
    try:
        return {r["name"]: r for r in offline_compile_rows(COUNT_CODE, "SASS", ROOT)}
    finally:
        os.environ.pop("MODELD_ROUND_BITS", None)
        if saved is not None:
            os.environ["MODELD_ROUND_BITS"] = saved


def test_native_convert_cuts_instructions_offline():
    """Offline sm_90: with the convert each kernel has at least 10 % fewer SASS instructions and no trace of the
    trick's 0x7FFF bias in its PTX; with $MODELD_ROUND_BITS=1 the bias is there (the trick compiled in). Neither side
    holds bf16 arithmetic: a plain cast let LLVM fuse RoPE's rounded product into a bf16 FMA (session 30, H200: 1-2
    ulp off; pitfalls/llvm-contracts-across-a-bf16-rounding.md)."""
    native, trick = _counts("0"), _counts("1")
    assert set(native) == set(trick) == {*KERNELS, "gated_rmsnorm_16x4"}
    for name in native:
        assert int(native[name]["instr"]) < 0.9 * int(trick[name]["instr"]), (name, native[name], trick[name])
        assert int(native[name]["trick"]) == 0 < int(trick[name]["trick"]), (name, native[name], trick[name])
        assert int(native[name]["half_math"]) == 0 == int(trick[name]["half_math"]), (name, native[name])


def test_compiled_default_is_the_trick():
    """Without $MODELD_ROUND_BITS the compiled kernels round with the trick (session 33: with the convert the 27B fp8
    engine's certification logits changed digest and its rung-6 flips went 2 -> 7; with the trick they are the
    certified ones again, findings/round-to-convert-moved-the-engine-logits-s33.md)."""
    default, trick = _counts(None), _counts("1")
    assert default == trick and all(int(r["trick"]) > 0 for r in default.values()), default


def _probe(tmp_path: Path, bits: str) -> dict[str, torch.Tensor]:
    path = tmp_path / f"bits{bits}.pt"
    env = {**os.environ, "MODELD_ROUND_BITS": bits, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "kernels" / "rounding_probe.py"), str(path)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return torch.load(path)


@pytest.mark.gpu
def test_gpu_native_convert_is_the_bit_trick_bit_for_bit(tmp_path):
    """Every kernel family that rounds through round_to gives the same bits with the convert as with the trick,
    and round_to agrees with torch's RTNE on ties, their neighbours, subnormals, the overflow edge and ±inf."""
    native, trick = _probe(tmp_path, "0"), _probe(tmp_path, "1")
    assert set(native) == set(trick) and len(native) >= 22
    for name in native:
        a, b = native[name], trick[name]
        assert a.dtype == b.dtype and a.shape == b.shape, name
        assert torch.equal(a.view(torch.int16) if a.dtype == torch.bfloat16 else a,
                           b.view(torch.int16) if b.dtype == torch.bfloat16 else b), name
    for side in (native, trick):
        assert torch.equal(side["round_to"].view(torch.int16), side["round_to_torch"].view(torch.int16))


def test_bad_round_bits_value_fails_the_import():
    env = {**os.environ, "MODELD_ROUND_BITS": "yes", "PYTHONPATH": str(ROOT / "src")}
    r = subprocess.run([sys.executable, "-c", "import modeld.kernels._tl"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and "MODELD_ROUND_BITS='yes': expected one of 0, 1" in r.stderr


@pytest.mark.parametrize("args, message", [(["--only", "rmsnorm,nope"], "no kernel named nope"),
                                           (["--no-aot", "--gated-norm-tiles", "16"], "is not ROWSxWARPS")])
def test_sass_counts_refuses_bad_arguments(args, message):
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "sass_counts.py"), *args], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and message in r.stderr, r.stderr[-2000:]
