"""Programmatic dependent launch (kernels/_pdl.py): the switch, and bit-identical results with it on.

CPU: when the switch is on (never in the interpreter, which runs no inline asm). GPU (`-m gpu`): a decode
chain of kernels that take part (add+RMSNorm -> SwiGLU int4 GEMV (hmma, gate/up apart + finish launch) ->
int4 down GEMV (split-K, fused finish) -> RMSNorm -> bf16 v2 GEMV -> fp8 v2 GEMV) captured in one CUDA graph
and replayed on new inputs: with PDL every GEMV starts before its predecessor has finished and must wait
before reading x, so a missing wait shows up as a difference from the run without PDL.
"""

from __future__ import annotations

import pytest
import torch

from modeld.kernels import _pdl
from modeld.kernels.errors import KernelValueError
from modeld.kernels.linear import quant
from modeld.kernels.linear import triton as lin
from modeld.kernels.rmsnorm import triton as norm


def _set_env(monkeypatch, name: str, value: str | None) -> None:
    """$name = value for the test; None: unset."""
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("env,interp,mode", [("1", "0", 1), ("late", "0", 2), ("0", "0", 0), ("", "0", 1),
                                             (None, "0", 1), ("1", "1", 0), ("late", "1", 0), (None, "1", 0)])
def test_pdl_switch(env, interp, mode, monkeypatch):
    _set_env(monkeypatch, _pdl.PDL_ENV, env)
    monkeypatch.setenv("TRITON_INTERPRET", interp)
    assert _pdl.pdl_mode() == mode and _pdl.pdl_on() is (mode > 0)
    assert _pdl.launch_options(mode > 0) == ({"launch_pdl": True} if mode else {})


def test_pdl_switch_rejects_unknown_values(monkeypatch):
    monkeypatch.setenv(_pdl.PDL_ENV, "yes")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(KernelValueError, match="MODELD_PDL"):
        _pdl.pdl_mode()


@pytest.mark.parametrize("pdl,late,family,want", [("1", None, "hmma", 1), ("1", "", "hmma", 1), ("1", "hmma", "hmma", 2),
                                                   ("1", "hmma, fp8", "fp8", 2), ("1", "hmma", "fp8", 1),
                                                   ("0", "hmma", "hmma", 0), ("late", "", "bf16", 2),
                                                   ("late", "ring", "hmma", 2)])
def test_gemv_late_trigger_by_family(pdl, late, family, want, monkeypatch):
    """MODELD_PDL_LATE lists the GEMV families that trigger after their K loop (constexpr 2) while PDL is on; the
    others keep `pdl_mode`."""
    monkeypatch.setenv(_pdl.PDL_ENV, pdl)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    _set_env(monkeypatch, _pdl.LATE_ENV, late)
    assert _pdl.gemv_pdl_mode(family) == want


def test_gemv_late_trigger_rejects_unknown_families(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setenv(_pdl.LATE_ENV, "hmma,int8")
    with pytest.raises(KernelValueError, match="MODELD_PDL_LATE: unknown GEMV family int8"):
        _pdl.gemv_pdl_mode("hmma")
    monkeypatch.delenv(_pdl.LATE_ENV)
    with pytest.raises(KernelValueError, match="unknown GEMV family fp4"):
        _pdl.gemv_pdl_mode("fp4")


def test_every_gemv_launch_names_a_known_family():
    """Each decode-GEMV launcher asks `gemv_pdl_mode` with a family MODELD_PDL_LATE can name (v2 passes its format)."""
    import inspect
    import re

    from modeld.kernels.linear import gemv, gemv_fp8_batch, gemv_hmma, gemv_hmma_batch
    from modeld.kernels.linear import triton as tt
    named = set()
    for mod in (gemv_fp8_batch, gemv_hmma, gemv_hmma_batch, tt):
        named |= set(re.findall(r'gemv_pdl_mode\("([\w-]+)"\)', inspect.getsource(mod)))
    assert "gemv_pdl_mode(fmt)" in inspect.getsource(gemv.launch_gemv)
    assert named | {"int4", "fp8", "bf16"} == set(_pdl.GEMV_FAMILIES), named


@pytest.mark.parametrize("pdl,light,want", [("1", None, 2), ("1", "", 2), ("1", "0", True), ("1", "1", 2),
                                             ("0", "1", False), ("late", "1", 2)])
def test_light_switch(pdl, light, want, monkeypatch):
    """MODELD_PDL_LIGHT=1 (the default) makes the light kernels wait first (constexpr 2, launched with PDL); 0
    keeps the session-7 True / False constexprs, launched without the attribute."""
    monkeypatch.setenv(_pdl.PDL_ENV, pdl)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    _set_env(monkeypatch, _pdl.LIGHT_ENV, light)
    got = _pdl.light_pdl()
    assert got == want and type(got) is type(want)
    assert _pdl.light_launch(got) == ({"launch_pdl": True} if want == 2 else {})


def test_light_switch_rejects_unknown_values(monkeypatch):
    monkeypatch.setenv(_pdl.LIGHT_ENV, "yes")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(KernelValueError, match="MODELD_PDL_LIGHT"):
        _pdl.light_pdl()


def _chain(x, res, p):
    """One decode-like chain of PDL-aware kernels; returns every intermediate (all must match)."""
    nr = norm.add_rms_norm(x, res, p["n1"], 1e-6, True)
    h, res2 = nr.out, nr.residual
    a = lin.swiglu_linear_int4(h, *p["gu"])             # hmma, gate/up apart: split-K + finish launch
    d = lin.linear_int4(a, *p["down"])                  # hmma, split-K (fused finish at N = 1024)
    h2 = norm.rms_norm(d, p["n2"], 1e-6, True)
    b = lin.linear(h2, p["wb"])                         # bf16 v2
    f = lin.linear_fp8(b, *p["f8"])                     # fp8 v2
    return [h, res2, a, d, h2, b, f]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["1", "late", "light", "light-plain-x"])
def test_gpu_pdl_chain_bit_identical(mode, gen, device, monkeypatch):
    """mode "light": MODELD_PDL=1 with MODELD_PDL_LIGHT=1 (the norms and the finish launch wait first);
    "light-plain-x": that, with the hmma GEMVs loading x by plain ld.global (MODELD_HMMA_X_LOAD=plain). Here x is
    written by the kernel just before each GEMV, so a load of x moved above the PDL wait would show."""
    g = torch.Generator(device=device)
    g.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    rnd = lambda *s: torch.randn(*s, generator=g, device=device)  # noqa: E731
    d_model, d_ff = 1024, 2816
    p = {"n1": rnd(d_model).bfloat16() * 0.1, "n2": rnd(d_model).bfloat16() * 0.1,
         "gu": quant.quantize_int4(rnd(2 * d_ff, d_model) / d_model**0.5, 128),
         "down": quant.quantize_int4(rnd(d_model, d_ff) / d_ff**0.5, 128),
         "wb": (rnd(4096, d_model) / d_model**0.5).bfloat16(),
         "f8": quant.quantize_fp8(rnd(2048, 4096) / 64.0)}
    inputs = [(rnd(1, d_model).bfloat16(), rnd(1, d_model).bfloat16()) for _ in range(4)]
    outs = {}
    for flag in ("0", mode):
        light = flag.startswith("light")
        monkeypatch.setenv(_pdl.PDL_ENV, "1" if light else flag)
        monkeypatch.setenv(_pdl.LIGHT_ENV, "1" if light else "0")
        monkeypatch.setenv("MODELD_HMMA_X_LOAD", "plain" if flag == "light-plain-x" else "nc")
        x, res = (t.clone() for t in inputs[0])
        _chain(x, res, p)                                 # warm-up: compile, reserve counters
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            got = _chain(x, res, p)
        outs[flag] = []
        for xi, ri in inputs:
            x.copy_(xi)
            res.copy_(ri)
            graph.replay()
            torch.cuda.synchronize()
            outs[flag].append([t.clone() for t in got])
    for i, (off, on) in enumerate(zip(outs["0"], outs[mode])):
        for j, (a, b) in enumerate(zip(off, on)):
            assert torch.equal(a, b), f"input {i}, stage {j}: PDL changed the result"
