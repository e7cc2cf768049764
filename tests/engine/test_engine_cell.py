"""The qwen3_5 cell on CPU reference kernels: session contract, prefix reuse through GDN
checkpoints, snapshot/restore continuing bit-identically, parking, seeded sampling. Every test runs twice: with
the plain prefill and with the padded suffix step (EngineOptions.suffix_bucket = 16), which serves the last
piece of every prefill of up to 16 tokens."""

from __future__ import annotations

import pytest
import torch

from engine_support import random_prompt
from modeld.cells.engine_qwen3_5 import Qwen35Cell
from modeld.models.qwen3_5.engine import SUFFIX_BUCKET_CUDA, EngineOptions, default_suffix_bucket
from modeld.serving.contract import SamplingParams
from modeld.serving.errors import ContextOverflow, SnapshotCorrupt

WID = "sha256:" + "ab" * 32
GREEDY = SamplingParams(max_tokens=6, temperature=0.0)


@pytest.fixture(scope="module", params=[0, 16], ids=["plain", "suffix-bucket"])
def cell(ckpt_dir, request):
    # small checkpoint interval so trims inside a 40-token prompt hit a checkpoint
    return Qwen35Cell(ckpt_dir("tiny"), model_id="synthetic/qwen3_5-tiny-L4-seed0", weights_id=WID,
                      device="cpu", n_ctx=256,
                      options=EngineOptions(checkpoint_every=16, checkpoints=4, suffix_bucket=request.param))


def run(session, params=GREEDY):
    events = list(session.decode(params))
    return [e.token_id for e in events if e.token_id is not None], events[-1].trace


def logits_bytes(cell):
    return cell.engine.logits[0].clone()


def test_a_suffix_bucket_wider_than_the_context_shrinks_to_it(ckpt_dir):
    c = Qwen35Cell(ckpt_dir("tiny"), model_id="synthetic/qwen3_5-tiny-L4-seed0", weights_id=WID, device="cpu",
                   n_ctx=24, options=EngineOptions(suffix_bucket=128))
    assert c.engine.options.suffix_bucket == 24
    s = c.new_session()
    s.ensure_prefix(random_prompt(1024, 10, 1))
    assert len(run(s, SamplingParams(max_tokens=3, temperature=0.0))[0]) >= 1


def test_the_cell_turns_the_suffix_bucket_on_for_cuda_only(ckpt_dir):
    """Without options the cell takes default_suffix_bucket: 128 rows on CUDA (within the context), off on the CPU,
    where no graph replays the padded step."""
    assert (default_suffix_bucket("cuda", 4096), default_suffix_bucket("cuda", 24)) == (SUFFIX_BUCKET_CUDA, 24)
    assert default_suffix_bucket("cpu", 4096) == 0
    c = Qwen35Cell(ckpt_dir("tiny"), model_id="synthetic/qwen3_5-tiny-L4-seed0", weights_id=WID, device="cpu", n_ctx=64)
    assert c.engine.options.suffix_bucket == 0


def test_a_session_prefills_in_the_engine_pieces(ckpt_dir, monkeypatch):
    """A prompt reaches the engine in prefill_chunk pieces (not the session base class's 256-token calls, which
    would keep the GEMMs at 256 rows and checkpoint after every call)."""
    c = Qwen35Cell(ckpt_dir("tiny"), model_id="synthetic/qwen3_5-tiny-L4-seed0", weights_id=WID, device="cpu",
                   n_ctx=512, options=EngineOptions(prefill_chunk=300, checkpoint_every=64, checkpoints=4))
    calls, real = [], c.engine.prefill
    monkeypatch.setattr(c.engine, "prefill", lambda slot, toks, probe=None: calls.append(len(toks)) or real(slot, toks))
    c.new_session().ensure_prefix(random_prompt(1024, 400, 5))
    assert calls == [300, 100]
    assert c.engine.ckpts[0].held() == [300, 320, 384, 400]  # each call's end and inside the pieces: the newest four


def test_capabilities_and_identity(cell):
    caps = cell.capabilities()
    assert caps.n_ctx == 256 and caps.n_vocab == 1024 and caps.snapshot_supported and caps.chat_template
    assert caps.identity.backend == "modeld-qwen3_5/reference" and caps.identity.weights_id == WID
    assert caps.memory.kv_bytes_per_token == 2 * 2 * 32 * 2  # 1 attention layer, K+V, 2 heads x 32 x bf16
    assert caps.memory.weights_bytes == cell.engine.weights.nbytes


def test_greedy_matches_engine_and_accounts_tokens(cell):
    prompt = random_prompt(1024, 30, 3)
    s = cell.new_session()
    r = s.ensure_prefix(prompt)
    assert (r.reused, r.prefilled, r.n_tokens) == (0, 30, 30)
    toks, trace = run(s)
    # the same engine driven directly: prefill, then greedy decode
    eng = cell.engine
    eng.reset_slot(0)
    logit = eng.prefill(0, prompt)
    direct = []
    for _ in range(len(toks)):
        direct.append(int(logit.argmax()))
        logit = eng.decode([direct[-1]])[0]
    assert toks == direct[: len(toks)]
    assert trace.prompt_tokens == 30 and trace.prefilled_tokens == 30 and trace.completion_tokens == len(toks)
    s.close()


def test_prefix_reuse_and_trim_through_checkpoints(cell):
    prompt = random_prompt(1024, 40, 4)
    s = cell.new_session()
    s.ensure_prefix(prompt)
    run(s)
    extended = list(s.tokens) + random_prompt(1024, 5, 5)
    r = s.ensure_prefix(extended)
    assert r.reused == len(extended) - 5 and r.prefilled == 5
    # edit inside the prompt: keep 35 tokens (checkpoint at 32 -> 3 re-evaluated internally)
    edited = prompt[:35] + random_prompt(1024, 4, 6)
    before = s.recomputed
    r = s.ensure_prefix(edited)
    assert (r.reused, r.prefilled) == (35, 4)
    assert s.recomputed - before == 3
    trimmed_logits = logits_bytes(cell)
    fresh = cell.new_session()
    fresh.ensure_prefix(edited)
    # same tokens, different chunking of the prefill: equal up to bf16 re-rounding
    assert float((logits_bytes(cell) - trimmed_logits).abs().max()) < 0.05
    assert run(fresh)[0][:3] == run(s)[0][:3]


def test_repeated_prompt_restores_its_end_exactly(cell):
    """A stateless client re-sending the same prompt gets the same text: the session cuts back to
    the prompt's end (a GDN checkpoint is taken there) and puts back the logits that prefill
    produced, instead of re-evaluating the last token by another kernel path (on the H200 that
    flipped a near-tie at the third greedy token: KNOWLEDGE/pitfalls/repeated-prompt-re-evaluation-flips-greedy.md)."""
    prompt = random_prompt(1024, 21, 11)
    s = cell.new_session()
    s.ensure_prefix(prompt)
    first_logits = logits_bytes(cell)
    a, _ = run(s)
    before = s.recomputed
    r = s.ensure_prefix(prompt)
    assert (r.reused, r.prefilled) == (21, 0) and s.recomputed == before
    assert torch.equal(logits_bytes(cell).view(torch.int32), first_logits.view(torch.int32))
    b, trace = run(s)
    assert b == a and trace.prefilled_tokens == 0
    # A cut below the prompt's end forgets it: the next repeat evaluates again (and still agrees).
    s.ensure_prefix(prompt[:10])
    r = s.ensure_prefix(prompt)
    assert (r.reused, r.prefilled) == (10, 11)
    assert run(s)[0] == a
    # After a restore the saved end is not trusted (the state came from elsewhere).
    snap = s.snapshot()
    s.restore(snap)
    r = s.ensure_prefix(prompt)
    assert r.prefilled == 1
    s.close()


def test_snapshot_restore_continues_bit_identically(cell):
    s = cell.new_session()
    s.ensure_prefix(random_prompt(1024, 33, 7))
    run(s)
    snap, held = s.snapshot(), s.tokens
    a_toks, _ = run(s)
    a_logits = logits_bytes(cell)
    other = cell.new_session()
    other.restore(snap)
    assert other.tokens == held
    b_toks, _ = run(other)
    assert b_toks == a_toks
    assert torch.equal(logits_bytes(cell).view(torch.int32), a_logits.view(torch.int32))


def test_restore_rejects_corrupt_state_and_keeps_previous(cell):
    s = cell.new_session()
    s.ensure_prefix(random_prompt(1024, 12, 8))
    snap = s.snapshot()
    held = s.tokens
    with pytest.raises(SnapshotCorrupt):
        s.restore(snap.data[:-40] + bytes(40))
    assert s.tokens == held
    toks, _ = run(s)
    assert len(toks) >= 1


def test_parking_two_sessions_interleaved(cell):
    p1, p2 = random_prompt(1024, 20, 9), random_prompt(1024, 25, 10)
    solo = []
    for p in (p1, p2):
        s = cell.new_session()
        s.ensure_prefix(p)
        solo.append(run(s)[0])
        s.close()
    a, b = cell.new_session(), cell.new_session()
    a.ensure_prefix(p1)
    b.ensure_prefix(p2)  # parks a
    ta = run(a, SamplingParams(max_tokens=3))[0]  # parks b, loads a
    tb = run(b, SamplingParams(max_tokens=3))[0]
    assert ta == solo[0][:3] and tb == solo[1][:3]


def test_seeded_sampling_is_reproducible(cell):
    params = SamplingParams(max_tokens=8, temperature=0.9, top_k=50, top_p=0.95, seed=1234)
    outs = []
    for _ in range(2):
        s = cell.new_session()
        s.ensure_prefix(random_prompt(1024, 10, 11))
        outs.append(run(s, params)[0])
        s.close()
    assert outs[0] == outs[1] and len(outs[0]) >= 1


def test_chat_tokens_and_overflow(cell):
    ids = cell.chat_tokens([{"role": "user", "content": "hello <|im_end|> world"}])
    assert ids[0] == 991 and ids.count(992) == 1  # the user's "<|im_end|>" stays text
    assert "hello <|im_end|> world" in cell.detokenize(ids)
    s = cell.new_session()
    with pytest.raises(ContextOverflow):
        s.ensure_prefix([1] * 256)


def test_cell_from_mspec_matches_directory(cell, mspec_file):
    from modeld.execution.artifacts import open_artifact

    m = Qwen35Cell(mspec_file("tiny"), device="cpu", n_ctx=256)
    assert m.artifact.source.file._mm.closed  # weights copied into the arena: the file is unmapped
    assert m.identity.weights_id == open_artifact(mspec_file("tiny")).weights_id
    assert m.identity.tokenizer_id == cell.identity.tokenizer_id
    prompt = random_prompt(1024, 15, 12)
    outs = []
    for c in (cell, m):
        s = c.new_session()
        s.ensure_prefix(prompt)
        outs.append(run(s)[0])
        s.close()
    assert outs[0] == outs[1]


def test_factory_builds_from_a_cell_spec(mspec_file):
    """`build(spec, options)` is what modeld.cells.CELL_FACTORIES maps the "engine" backend to."""
    from modeld.cells.engine_qwen3_5 import build
    from modeld.execution.artifacts import open_artifact
    from modeld.serving.selection import CellOptions, CellSpec

    path = mspec_file("tiny")
    art = open_artifact(path)
    spec = CellSpec(backend="engine", cell_id="engine_qwen3_5", manifest_version="1", model_id=art.model_id,
                    weights_id=art.weights_id, artifact_path=str(path), fell_through=False, request=art.model_id)
    c = build(spec, CellOptions(n_ctx=128))
    assert c.capabilities().n_ctx == 128 and c.identity.model_id == art.model_id
    s = c.new_session()
    s.ensure_prefix(c.tokenize("hello world"))
    assert len(run(s, SamplingParams(max_tokens=2))[0]) >= 1


def test_warm_up_compiles_short_prefills_both_ways(ckpt_dir, monkeypatch):
    """With the padded suffix step on, warm_up runs each short length through the step and eagerly (the eager
    kernels serve a last piece near the capacity), then puts the options back."""
    c = Qwen35Cell(ckpt_dir("tiny"), model_id="synthetic/qwen3_5-tiny-L4-seed0", weights_id=WID, device="cpu",
                   n_ctx=256, options=EngineOptions(suffix_bucket=128, checkpoint_every=64, prefill_chunk=256))
    options, padded, eager = c.engine.options, [], []
    real = c.engine.forward
    monkeypatch.setattr(c.engine, "forward", lambda ids, ctx, **k: (
        (padded if ctx.valid is not None else eager).append(int(ctx.valid or ids.shape[0])) or real(ids, ctx, **k)))
    c.warm_up()
    assert sorted(padded) == [1, 5, 16, 33, 80, 80, 100]  # the default lengths, 80 + 1 over a prefix
    assert {5, 16, 33, 80, 100, 1, 249} <= set(eager)  # the same eagerly, and one piece of chunk - 7 tokens
    assert c.engine.options is options and c.engine.lengths[0] == 0


def test_warm_up_leaves_the_cell_as_fresh(cell):
    """warm_up (run at load on CUDA to move Triton's JIT out of the first TTFT) leaves slot 0 empty:
    a session afterwards decodes exactly what it decodes without it."""
    prompt = random_prompt(1024, 12, 21)
    s = cell.new_session()
    s.ensure_prefix(prompt)
    want, _ = run(s)
    s.close()
    assert cell.warm_up() >= 0.0
    assert cell.engine.lengths[0] == 0 and cell._resident is None
    fresh = cell.new_session()
    r = fresh.ensure_prefix(prompt)
    assert (r.reused, r.prefilled) == (0, 12)
    assert run(fresh)[0] == want
    fresh.close()
