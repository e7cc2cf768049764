"""The same engine code bound to the Triton kernels (CPU interpreter here, the GPU on the H200):
every wrapper accepts the views and strides the schedule hands it, and the tokens agree with the
reference binding. Numbers are loose: the interpreter mis-rounds bf16 (kernels/README.md)."""

from __future__ import annotations

import pytest
import torch

from engine_support import make_engine, random_prompt
from modeld.execution.bindings import reference_kernels, triton_kernels


def test_triton_binding_runs_the_schedule(ckpt_dir):
    tt = make_engine(ckpt_dir("tiny"), kernels=triton_kernels(), capacity=64)
    ref = make_engine(ckpt_dir("tiny"), kernels=reference_kernels(), capacity=64)
    assert tt.kernels.name == "triton" and not tt.graph.captured  # graphs only on CUDA
    prompt = random_prompt(1024, 10, 0)
    a, b = tt.prefill(0, prompt), ref.prefill(0, prompt)
    assert int(a.argmax()) == int(b.argmax()) and float((a - b).abs().max()) < 1.0
    for tok in (7, 8):
        a, b = tt.decode([tok])[0], ref.decode([tok])[0]
        assert torch.isfinite(a).all() and float((a - b).abs().max()) < 1.0


@pytest.mark.gpu
def test_decode_graph_replays_like_eager(ckpt_dir):
    """On CUDA: the captured decode step gives bit-identical logits to the eager step."""
    from engine_support import Qwen35Config, Qwen35Engine, SafetensorsDirSource
    from modeld.models.qwen3_5.engine import EngineOptions

    d = ckpt_dir("tiny")
    cfg = Qwen35Config.from_file(d / "config.json")
    graphed = Qwen35Engine(cfg, SafetensorsDirSource(d), "cuda", options=EngineOptions(capacity=64, use_graph=True))
    eager = Qwen35Engine(cfg, SafetensorsDirSource(d), "cuda", options=EngineOptions(capacity=64, use_graph=False))
    assert graphed.graph.captured and not eager.graph.captured
    prompt = random_prompt(1024, 10, 0)
    graphed.prefill(0, prompt)
    eager.prefill(0, prompt)
    for tok in (7, 8, 9):
        a, b = graphed.decode([tok])[0].clone(), eager.decode([tok])[0].clone()
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_decode_back_to_back_without_sync_matches_synced(ckpt_dir):
    """On CUDA decode() fills its inputs by asynchronous copies from pinned staging buffers: steps issued
    back to back with no host sync (the staging buffers rewritten while earlier copies may still be queued)
    must give the same logits as steps synchronised one by one."""
    from engine_support import Qwen35Config, Qwen35Engine, SafetensorsDirSource
    from modeld.models.qwen3_5.engine import EngineOptions

    d = ckpt_dir("tiny")
    cfg = Qwen35Config.from_file(d / "config.json")
    eng = Qwen35Engine(cfg, SafetensorsDirSource(d), "cuda", options=EngineOptions(capacity=64, use_graph=True))
    assert eng._ids_host.is_pinned() and eng._lens_host.is_pinned()
    prompt, tokens = random_prompt(1024, 10, 0), random_prompt(1024, 12, 1)
    runs = []
    for synced in (True, False):
        eng.reset_slot(0)
        eng.prefill(0, prompt)
        out = []
        for tok in tokens:
            out.append(eng.decode([tok])[0].clone())
            if synced:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        runs.append(out)
    for i, (a, b) in enumerate(zip(*runs)):
        assert torch.equal(a, b), f"step {i}"


@pytest.mark.gpu
def test_suffix_bucket_graph_replays_like_eager(ckpt_dir):
    """On CUDA: the captured padded suffix step (EngineOptions.suffix_bucket) gives bit-identical logits to the same
    padded step run eagerly, at several starts and lengths, and matches the plain prefill within tolerance; reuse
    (trim + suffix) equals a cold prefill bit for bit."""
    from engine_support import Qwen35Config, Qwen35Engine, SafetensorsDirSource
    from modeld.models.qwen3_5.engine import EngineOptions

    d = ckpt_dir("tiny")
    cfg = Qwen35Config.from_file(d / "config.json")
    opts = dict(slots=2, capacity=96, prefill_chunk=32, checkpoint_every=32, checkpoints=2, suffix_bucket=16)
    graphed = Qwen35Engine(cfg, SafetensorsDirSource(d), "cuda", options=EngineOptions(use_graph=True, **opts))
    eager = Qwen35Engine(cfg, SafetensorsDirSource(d), "cuda", options=EngineOptions(use_graph=False, **opts))
    plain = Qwen35Engine(cfg, SafetensorsDirSource(d), "cuda",
                         options=EngineOptions(use_graph=False, **{**opts, "suffix_bucket": 0}))
    assert all(g.captured for g in graphed._buckets) and not any(g.captured for g in eager._buckets)
    assert graphed.bucket_graph_bytes > 0 and eager.bucket_graph_bytes == 0 == plain.bucket_graph_bytes
    for n in (1, 9, 16, 37, 70):
        # both slots, one after the other: their steps share one graph memory pool
        prompts = [random_prompt(1024, n, n), random_prompt(1024, n + 3, 100 + n)]
        for slot in (0, 1):
            outs = []
            for eng in (graphed, eager, plain):
                eng.reset_slot(slot)
                outs.append(eng.prefill(slot, prompts[slot]).clone())
            assert torch.equal(outs[0], outs[1]), (n, slot)
            assert int(outs[0].argmax()) == int(outs[2].argmax()), (n, slot)
            assert float((outs[0] - outs[2]).abs().max()) < 0.1, (n, slot)
        assert torch.equal(graphed.logits[0], eager.logits[0]), n  # slot 1's replay left slot 0's logits alone
    prefix, turn, last = random_prompt(1024, 32, 1), random_prompt(1024, 9, 2), random_prompt(1024, 11, 3)
    graphed.reset_slot(0)
    want = graphed.prefill(0, prefix + turn).clone()
    graphed.reset_slot(0)
    graphed.prefill(0, prefix + last)
    graphed.truncate(0, 32, prefix)
    assert torch.equal(graphed.prefill(0, turn), want)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_checkpoints_inside_a_piece_on_the_triton_kernels(ckpt_dir, device):
    """Triton kernels (the interpreter on CPU): a 128-token piece that checkpoints at 64 runs its GDN layers in two
    segments; the logits equal the piece run whole bit for bit (the segments start on the GDN kernels' 64-token chunk
    grid), and the entry at 64 holds the state a 64-token prefill leaves, to the rounding of that prefill's own
    GEMM tiles (64 rows take the mid-M tiles, 128 the suffix tiles)."""
    from engine_support import Qwen35Config, Qwen35Engine, SafetensorsDirSource
    from modeld.models.qwen3_5.engine import EngineOptions

    d = ckpt_dir("tiny")
    cfg = Qwen35Config.from_file(d / "config.json")

    def build(every):
        opts = EngineOptions(capacity=160, prefill_chunk=128, checkpoint_every=every, checkpoints=2, use_graph=False)
        return Qwen35Engine(cfg, SafetensorsDirSource(d), device, kernels=triton_kernels(), options=opts)

    split, whole = build(64), build(128)
    prompt = random_prompt(1024, 128, 40)
    assert torch.equal(split.prefill(0, prompt).clone(), whole.prefill(0, prompt).clone())
    assert split.ckpts[0].held() == [64, 128]
    whole.reset_slot(0)
    whole.prefill(0, prompt[:64])
    ck = split.ckpts[0]
    j = ck.positions.index(64)
    for n in ck.names:
        got, want = ck.arena[f"{j}:{n}"].float(), whole.state[n][0].float()
        err = float((got - want).abs().max())
        assert err <= 0.02 * float(want.abs().max()), (n, err)


GDN_CANDIDATES = {   # the opt-in GDN prefill switches of session 22, alone and together
    "fp16-passes": {"MODELD_GDN_PASS_PRECISION": "fp16"},
    "output-loop": {"MODELD_GDN_OUTPUT_LOOP": "2,64,4,2"},
    "fp16x3-series": {"MODELD_GDN_INV_PRECISION": "fp16x3"},
    "state-transposed": {"MODELD_GDN_STATE_T": "1"},
    "state-kpre": {"MODELD_GDN_STATE_KPRE": "1"},   # session 28; not with the transposed state ("all")
    "fused-norm": {"MODELD_GDN_FUSED_NORM": "1"},    # session 28; not with the output loop ("all")
    "segments": {"MODELD_GDN_SNAPSHOTS": "segments"},   # session 31: checkpoints by segments / in the state pass
    "in-pass": {"MODELD_GDN_SNAPSHOTS": "in-pass"},
    "prep-fp16": {"MODELD_GDN_PREP_PRECISION": "fp16"},   # session 30
    "all": {"MODELD_GDN_PASS_PRECISION": "fp16", "MODELD_GDN_OUTPUT_LOOP": "2,64,4,2",
            "MODELD_GDN_INV_PRECISION": "fp16x3", "MODELD_GDN_STATE_T": "1"},
}


CPU_CANDIDATES = ("all", "fused-norm", "segments", "in-pass")


@pytest.mark.parametrize("variant", [*CPU_CANDIDATES, *[pytest.param(v, marks=pytest.mark.gpu)
                                                        for v in GDN_CANDIDATES if v not in CPU_CANDIDATES]])
def test_gdn_candidates_through_the_engine(ckpt_dir, variant, monkeypatch):
    """The GDN candidates inside the engine (interpreter on CPU: the session-22 four together, the fused output
    norm, whose segments each normalise their own rows, and both ways of keeping the checkpoints; each alone on the
    H200):
    a 128-token piece that checkpoints at 64 gives the whole piece's logits bit for bit (segments on the chunk grid),
    and the logits stay near the reference binding's, same argmax."""
    from engine_support import Qwen35Config, Qwen35Engine, SafetensorsDirSource
    from modeld.models.qwen3_5.engine import EngineOptions

    for name, value in GDN_CANDIDATES[variant].items():
        monkeypatch.setenv(name, value)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    d = ckpt_dir("tiny")
    cfg = Qwen35Config.from_file(d / "config.json")

    def build(every, kernels):
        opts = EngineOptions(capacity=160, prefill_chunk=128, checkpoint_every=every, checkpoints=2, use_graph=False)
        return Qwen35Engine(cfg, SafetensorsDirSource(d), device, kernels=kernels, options=opts)

    prompt = random_prompt(1024, 128, 41)
    split = build(64, triton_kernels()).prefill(0, prompt).clone()
    whole = build(128, triton_kernels()).prefill(0, prompt).clone()
    assert torch.equal(split, whole)
    ref = build(128, reference_kernels()).prefill(0, prompt).clone()
    assert int(split.argmax()) == int(ref.argmax()) and float((split - ref).abs().max()) < 1.0
