"""The Gluon warp-specialized prefill attention ($MODELD_ATTN_PREFILL=gluon, attention/prefill_gluon.py). Gluon does
not run in the CPU interpreter: on the CPU it is compiled offline for sm_90 and its switch must refuse the
interpreter before touching the cache; on the GPU it runs against the reference in a child under a watchdog (a
barrier bug would hang: KNOWLEDGE/pitfalls/gemm-warp-specialized-never-finished-h200.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from modeld.kernels._testing import assert_close, interpreting, offline_compile_rows, pytest_in_child
from modeld.kernels.attention import reference as ref
from modeld.kernels.attention import triton as tt
from modeld.kernels.errors import KernelValueError

ROOT = Path(__file__).resolve().parents[2]
CHILD_FLAG = "MODELD_TEST_ATTN_GLUON_CHILD"


def _rand(shape, device, seed):
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return torch.randn(*shape, generator=g, device=device).bfloat16()


def test_gluon_switch_refuses_the_interpreter_before_touching_the_cache(device, monkeypatch):
    if not interpreting() and torch.cuda.is_available():
        pytest.skip("the GPU runs the kernel (test_gpu_gluon_prefill)")
    monkeypatch.setenv(tt.PREFILL_ENV, "gluon")
    q, k = _rand((3, 4, 64), device, 0), _rand((3, 2, 64), device, 1)
    kc = torch.zeros(8, 2, 64, dtype=torch.bfloat16, device=device)
    with pytest.raises(KernelValueError, match="MODELD_ATTN_PREFILL=gluon"):
        tt.attention_prefill(q, k, k, kc, kc.clone(), 0, 0.125)
    assert int(kc.count_nonzero()) == 0


def test_gluon_prefill_compiles_for_sm90_offline():
    """Offline sm_90, both forms (OVERLAP: each next Q Kᵀ issued before the current softmax; the one-pass form
    trimmed: its unmasked and diagonal loops, CAUSAL_TRIM): wgmma (HGMMA) for
    Q Kᵀ and P V, TMA loads of Q / K / V (UTMALDG), the consumers at 240 registers
    beside the producer's 24, shared memory within an SM's 227 KB; no spill but the gated epilogue at head_dim 256
    (the gate's and output's per-element addresses beside the accumulator, once per block: ≤ 2 KB)."""
    code = r'''
import re
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from bench.feasibility import cuobjdump_sass, ptxas_sm90
from modeld.kernels.attention import prefill_gluon as A
for dh in (256, 64):
  for overlap, pingpong in ((False, False), (True, False), (False, True)):
    for gate in (True, False):
        desc = lambda rows: f"tensordesc<bf16[{rows}, {dh}],{A.shared_layout([rows, dh])!r}>"
        sig = {"q_desc": desc(A.BLOCK_M // 2), "k_desc": desc(A.BLOCK_N), "v_desc": desc(A.BLOCK_N),
               "g_ptr": "*bf16", "o_ptr": "*bf16", "T": "i32", "start": "i32", "qk_scale": "fp32",
               "stride_qh": "i32", "stride_ch": "i32", "stride_gt": "i32", "stride_gh": "i32", "stride_ot": "i32",
               "stride_oh": "i32", "GQA": "constexpr", "HAS_GATE": "constexpr", "S": "constexpr",
               "OVERLAP": "constexpr", "TRIM": "constexpr", "num_warps": "constexpr", "PINGPONG": "constexpr"}
        src = GluonASTSource(A._prefill_gluon_kernel, sig,
                             constexprs={"GQA": 6, "HAS_GATE": gate, "S": A.STAGES, "OVERLAP": overlap,
                                         "TRIM": A.CAUSAL_TRIM and not overlap, "num_warps": 4,
                                         "PINGPONG": pingpong})
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "maxnreg": A.MAXNREG})
        ptx = k.asm["ptx"]
        report, obj = ptxas_sm90(ptx, "attn_gluon_test")
        sass = cuobjdump_sass(obj)
        spill = sum(map(int, re.findall(r"(\d+) bytes spill", report)))
        nreg = sorted(set(re.findall(r"setmaxnreg[.](?:inc|dec)[.]sync[.]aligned[.]u32\s+(\d+);", ptx)), key=int)
        print(f"GA dh={dh} overlap={int(overlap)} pingpong={int(pingpong)} gate={int(gate)} spill={spill} "
              f"smem={k.metadata.shared} syncs={len(re.findall('SYNCS', sass))} "
              f"hgmma={len(re.findall('HGMMA', sass))} utmaldg={len(re.findall('UTMALDG', sass))} "
              f"setmaxnreg={','.join(nreg)}")
'''
    lines = offline_compile_rows(code, "GA", ROOT)
    assert len(lines) == 12, lines
    for f in lines:
        # overlap: the next tile's Q Kᵀ is a second wgmma site in the loop; trimmed: two loops (twice the HGMMA sites)
        assert int(f["hgmma"]) >= 16 and int(f["utmaldg"]) >= 4, f
        regs = [int(x) for x in f["setmaxnreg"].split(",")]
        assert 24 in regs and 240 in regs and max(regs) <= 256, f
        assert 0 < int(f["smem"]) <= 232448, f
        assert int(f["spill"]) == 0 or (f["dh"] == "256" and f["gate"] == "1" and int(f["spill"]) <= 2048), f
    # the trimmed one-pass form has as many wgmma sites as the overlap form (s26, dh 256: 80 each; untrimmed 40), the
    # ping-pong form the same products plus its turns (more mbarrier operations than the one-pass form)
    form = {(f["dh"], f["gate"], f["overlap"] + f["pingpong"]): f for f in lines}
    for (dh, g, _), f in form.items():
        assert int(f["hgmma"]) == int(form[dh, g, "10"]["hgmma"]), form
    for dh, g, _ in form:
        assert int(form[dh, g, "01"]["syncs"]) > int(form[dh, g, "00"]["syncs"]), form


# (T, start, HQ, HKV, Dh, S, gated): a partial last block, blocks with prior cache rows (start > 0: a later prefill
# piece), qwen3_5's heads (24 / 4 / 256) and SmolLM2's (9 / 3 / 64), one token
GPU_CASES = [(777, 0, 24, 4, 256, 1024, True), (300, 1000, 24, 4, 256, 1400, True), (1, 0, 24, 4, 256, 16, True),
             (2048, 4096, 24, 4, 256, 6144, False), (500, 37, 9, 3, 64, 600, False)]


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get(CHILD_FLAG) != "1", reason="runs in test_gpu_gluon_prefill's child")
@pytest.mark.parametrize("t,start,hq,hkv,dh,s_cap,gated", GPU_CASES)
@pytest.mark.parametrize("variant", ["gluon", "gluon-untrimmed", "gluon-overlap"])
def test_gpu_gluon_prefill_child(t, start, hq, hkv, dh, s_cap, gated, variant, device, monkeypatch):
    """Against the reference, with the cache rows past start + T poisoned with NaN: the kernel must not read them
    (a masked P of 0 times a NaN of V is NaN)."""
    _check_gluon_variant(variant, t, start, hq, hkv, dh, s_cap, gated, device, monkeypatch)


@pytest.mark.gpu
@pytest.mark.skipif(os.environ.get(CHILD_FLAG) != "pingpong", reason="runs in test_gpu_gluon_pingpong_prefill's child")
@pytest.mark.parametrize("t,start,hq,hkv,dh,s_cap,gated", GPU_CASES)
def test_gpu_gluon_pingpong_child(t, start, hq, hkv, dh, s_cap, gated, device, monkeypatch):
    """The ping-pong form (never run before session 27): its own child, so a turn-barrier hang cannot hide the
    other forms' results."""
    _check_gluon_variant("gluon-pingpong", t, start, hq, hkv, dh, s_cap, gated, device, monkeypatch)


def _check_gluon_variant(variant, t, start, hq, hkv, dh, s_cap, gated, device, monkeypatch):
    from modeld.kernels.attention import prefill_gluon
    monkeypatch.setattr(prefill_gluon, "CAUSAL_TRIM", variant != "gluon-untrimmed")
    monkeypatch.setenv(tt.PREFILL_ENV, variant.removesuffix("-untrimmed"))
    qg = _rand((t, hq, 2 * dh), device, 1)  # q and gate as head-strided halves of one projection, as qwen3_5's
    q, gate = qg[..., :dh], (qg[..., dh:] if gated else None)
    k, v = _rand((t, hkv, dh), device, 2), _rand((t, hkv, dh), device, 3)
    kc, vc = _rand((s_cap, hkv, dh), device, 4), _rand((s_cap, hkv, dh), device, 5)
    kc[start + t:], vc[start + t:] = float("nan"), float("nan")
    kc_ref, vc_ref = kc.clone(), vc.clone()
    got = tt.attention_prefill(q, k, v, kc, vc, start, dh**-0.5, gate)
    want = ref.attention_prefill(q, k, v, kc_ref, vc_ref, start, dh**-0.5, gate)
    for c, c_ref in ((kc, kc_ref), (vc, vc_ref)):
        assert torch.equal(c[: start + t], c_ref[: start + t]), "cache rows differ"
        assert bool(c[start + t:].isnan().all()), "rows past start + T written"
    assert_close(got, want, what=f"{variant} prefill T={t} start={start}")


@pytest.mark.gpu
def test_gpu_gluon_prefill(device):
    """The Gluon prefill forms in a child pytest under a watchdog: a timeout is a failure (the barriers are ours)."""
    status, out = pytest_in_child(f"{__file__}::test_gpu_gluon_prefill_child", CHILD_FLAG, 300)
    assert status == "passed", f"{status}: {out}"


@pytest.mark.gpu
def test_gpu_gluon_pingpong_prefill(device):
    """The ping-pong form in its own child (a hang in its turns costs at most this watchdog)."""
    status, out = pytest_in_child(f"{__file__}::test_gpu_gluon_pingpong_child", CHILD_FLAG, 180, flag_value="pingpong")
    assert status == "passed", f"{status}: {out}"


@pytest.mark.parametrize("one_pass", tt.ONE_PASS_KERNELS)
def test_auto_one_pass_kernel_switch(one_pass, device, monkeypatch):
    """"auto" with ONE_PASS_KERNEL = "gluon" takes the Gluon kernel for one-pass prefills it can run and nothing else:
    the interpreter (and any input `usable` refuses) falls back to the Triton kernel; results match the reference."""
    _check_auto_switch(one_pass, device, monkeypatch)


@pytest.mark.gpu
@pytest.mark.parametrize("one_pass", ["triton", "gluon"])  # gluon-pingpong: first in its own child (a hang's cost)
def test_gpu_auto_one_pass_kernel_switch(one_pass, device, monkeypatch):
    """The same on the H200 at qwen3_5's heads: the one-pass prefill goes to the Gluon kernel, a 3-token suffix over
    a 200-token prefix keeps the split-KV passes."""
    _check_auto_switch(one_pass, device, monkeypatch)


def _check_auto_switch(one_pass, device, monkeypatch):
    from modeld.kernels.attention import prefill_gluon

    monkeypatch.delenv(tt.PREFILL_ENV, raising=False)
    monkeypatch.setattr(tt, "ONE_PASS_KERNEL", one_pass)
    calls = []
    launch = prefill_gluon.launch
    monkeypatch.setattr(prefill_gluon, "launch", lambda *a, **k: calls.append(a[0].shape[0]) or launch(*a, **k))
    gpu = not interpreting() and torch.cuda.is_available()
    dh, hq, hkv = (256, 24, 4) if gpu else (64, 4, 2)
    # one pass (on a GPU 800 tokens: 7 row blocks x 24 heads fill the SMs, so "auto" does not split them; 300 did,
    # session 27); a 3-token suffix (split-KV on a GPU)
    cases = ((800 if gpu else 300, 0, 832 if gpu else 320), (3, 200, 256))
    for t, start, s_cap in cases:
        qg = _rand((t, hq, 2 * dh), device, 1)
        q, gate = qg[..., :dh], qg[..., dh:]
        k, v = _rand((t, hkv, dh), device, 2), _rand((t, hkv, dh), device, 3)
        kc, vc = _rand((s_cap, hkv, dh), device, 4), _rand((s_cap, hkv, dh), device, 5)
        kc_ref, vc_ref = kc.clone(), vc.clone()
        got = tt.attention_prefill(q, k, v, kc, vc, start, dh**-0.5, gate)
        assert_close(got, ref.attention_prefill(q, k, v, kc_ref, vc_ref, start, dh**-0.5, gate))
    dev = torch.device(device)
    one_pass_ts = [t for t, start, _ in cases if tt.prefill_split_choice(t, hq, hkv, dh, start, dev)[1] == 0]
    if gpu:
        assert one_pass_ts[:1] == [cases[0][0]], "the first case must be a one-pass prefill, or it shows nothing"
    want = one_pass_ts if (gpu and one_pass != "triton") else []
    assert calls == want, (calls, want)
