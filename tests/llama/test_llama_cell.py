"""The llama cell's session contract on SmolLM2 (CPU, reference kernels): greedy through the
session, exact prefix reuse with KV trimming, parking, snapshot/restore, bad snapshots, and the
factory path from a selected CellSpec."""

from __future__ import annotations

import pytest
import torch

from llama_kernels import cached_reference_kernels
from llama_support import engine_greedy
from modeld.cells.engine_llama import LlamaCell
from modeld.serving.contract import SamplingParams
from modeld.serving.errors import SnapshotCorrupt

GREEDY = SamplingParams(max_tokens=6, temperature=0.0)


@pytest.fixture(scope="module")
def cell(int4_mspec):
    c = LlamaCell(int4_mspec, device="cpu", n_ctx=256, kernels=cached_reference_kernels())
    yield c
    c.close()


def _greedy(session, params=GREEDY) -> list[int]:
    return [e.token_id for e in session.decode(params) if e.token_id is not None]


def test_capabilities_report_the_profile_and_exact_kv_size(cell, int4_mspec):
    cap = cell.capabilities()
    assert cap.identity.profile == "int4/kv-bf16"
    assert cap.identity.model_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert cap.identity.weights_id == cell.artifact.weights_id
    assert cap.memory.kv_bytes_per_token == 30 * 2 * 3 * 64 * 2       # layers x (k, v) x Hkv x Dh x bf16
    assert cap.snapshot_supported and cap.chat_template and cap.n_vocab == 49152


def test_session_greedy_equals_the_engine_and_the_chat_template_tokens(cell, tokenizer):
    msgs = [{"role": "user", "content": "What is 2 + 2?"}]
    ids = cell.chat_tokens(msgs)
    text = cell.render_chat(msgs)       # SmolLM2's template adds its default system turn
    assert text.endswith("<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"), text
    assert ids == tokenizer.encode(text, parse_special=True) and ids[0] == 1   # <|im_start|> as one id
    s = cell.new_session()
    s.ensure_prefix(ids)
    got = _greedy(s, SamplingParams(max_tokens=4, temperature=0.0))
    s.close()                                 # the engine's slot is free again
    want, _ = engine_greedy(cell.engine, ids, 4)
    assert got == want[: len(got)] and got, (got, want)
    assert cell.detokenize(got).strip()


def test_prefix_reuse_trims_the_kv_exactly(cell, tokenizer):
    """A+B then A+C: the A prefix is reused (the KV is cut back, A is never recomputed), and the
    logits and greedy tokens equal those of a session that held A+B' instead (same shapes, other
    tokens): what was cut leaves no trace."""
    a = tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 2)
    b, b2 = tokenizer.encode(" Then it slept."), tokenizer.encode(" Later we ate.")
    c = tokenizer.encode(" And it ran away, far away.")
    assert len(b) == len(b2) and len({b[0], b2[0], c[0]}) == 3
    results = []
    for tail in (b, b2):
        s = cell.new_session()
        s.ensure_prefix(a + tail)
        r = s.ensure_prefix(a + c)
        assert (r.reused, r.prefilled) == (len(a), len(c))
        results.append((cell.engine.logits[0].clone(), _greedy(s, SamplingParams(max_tokens=3, temperature=0.0))))
        again = s.ensure_prefix(list(s.tokens))   # the same tokens again: all reused
        assert again.prefilled == 0 and again.reused == len(s.tokens)
        s.close()
    assert torch.equal(results[0][0], results[1][0]) and results[0][1] == results[1][1]


def test_parked_sessions_resume_exactly(cell, tokenizer):
    one, two = cell.new_session(), cell.new_session()
    one.ensure_prefix(tokenizer.encode("def fibonacci(n):"))
    two.ensure_prefix(tokenizer.encode("Water boils at a temperature of"))
    solo = cell.new_session()
    solo.ensure_prefix(tokenizer.encode("def fibonacci(n):"))
    assert _greedy(one) == _greedy(solo)      # `one` was parked while `two` ran
    for s in (one, two, solo):
        s.close()


def test_snapshot_restore_continues_bit_identically_and_rejects_corruption(cell, tokenizer):
    s = cell.new_session()
    s.ensure_prefix(tokenizer.encode("The capital of France is"))
    snap = s.snapshot()
    first = _greedy(s)
    s.restore(snap)
    assert _greedy(s) == first
    bad = bytearray(snap.data)
    bad[-5] ^= 0xFF
    with pytest.raises(SnapshotCorrupt):
        s.restore(bytes(bad))
    s.restore(snap)                           # still usable after the rejection
    assert _greedy(s) == first
    s.close()


def test_engine_state_bytes_are_validated(cell):
    from modeld.models.llama.engine import StateFormatError

    eng = cell.engine
    payload = eng.save_slot(0)
    with pytest.raises(StateFormatError):
        eng.load_slot(0, payload[:-1])
    with pytest.raises(StateFormatError):
        eng.load_slot(0, b"QQQQQQQQ" + payload[8:])


def test_factory_builds_the_llama_cell_from_a_gguf_spec(smollm2_gguf, gguf_id, int4_mspec):
    """The `engine` backend's llama branch: a CellSpec naming the GGUF builds a LlamaCell over the
    cached lossless import, keeping the GGUF's identity."""
    from modeld.serving.selection import CellOptions, CellSpec, build_cell

    spec = CellSpec(backend="engine", cell_id="engine_llama_smollm2", manifest_version="1",
                    model_id="HuggingFaceTB/SmolLM2-135M-Instruct", weights_id=gguf_id,
                    artifact_path=str(smollm2_gguf), fell_through=False, request="SmolLM2", family="llama")
    built = build_cell(spec, CellOptions(n_ctx=64))
    try:
        assert isinstance(built, LlamaCell)
        assert built.artifact.path == int4_mspec           # the import was reused, not redone
        assert built.identity.weights_id == gguf_id and built.identity.cell_id == "engine_llama_smollm2"
    finally:
        built.close()
