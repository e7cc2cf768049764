"""A do-nothing specialized cell (TEST FIXTURE, never shipped).

It serves exactly one fake identity (backend kind `null`) and produces deterministic tokens, so
selection + the session contract can be proven without any engine. Vocabulary: 0 is the end
token, ids 1..95 are the printable ASCII characters 32..126. The "model": the next token after
state `kv` is the letter ((kv[-1] * 7 + len(kv)) % 26) — greedy and seed-independent.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence

from modeld.serving.chat import ChatTemplate
from modeld.serving.contract import Capabilities, Cell, IdentityKey, MemoryReport, SamplingParams
from modeld.serving.engine_session import EngineSession
from modeld.serving.errors import SnapshotCorrupt

NULL_MODEL_ID = "test/null-model"
N_VOCAB = 96
TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def tok(text: str) -> list[int]:
    return [ord(c) - 31 for c in text if 32 <= ord(c) < 127]


class NullCell(Cell):
    def __init__(self, spec, options) -> None:
        self.lock = threading.RLock()
        self.n_ctx = options.n_ctx
        self.policy = options.context_policy
        self.template = ChatTemplate(TEMPLATE, bos_token="", eos_token="")
        self._identity = IdentityKey(spec.model_id, spec.weights_id, spec.cell_id, "null", "none/none",
                                     "ascii-v1", self.template.template_id, spec.manifest_version)
        self.evals = 0  # engine calls, for tests

    @property
    def identity(self) -> IdentityKey:
        return self._identity

    def capabilities(self) -> Capabilities:
        return Capabilities(self._identity, self.n_ctx, N_VOCAB, self.policy, True, True,
                            MemoryReport(0, 4, 4 * self.n_ctx, 0), {"null": "1"}, ("none/none",), ("logprobs",))

    def new_session(self) -> NullSession:
        return NullSession(self)

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return tok(text)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return "".join(chr(t + 31) for t in tokens if t > 0)

    def chat_tokens(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        return self.template.tokens(messages, lambda text, add, special: tok(text))

    def close(self) -> None:
        pass


class NullSession(EngineSession):
    def __init__(self, cell: NullCell) -> None:
        super().__init__(cell.lock, cell.n_ctx, N_VOCAB, identity=cell.identity, context_policy=cell.policy)
        self.cell = cell
        self.engine: list[int] = []

    def capabilities(self) -> Capabilities:
        return self.cell.capabilities()

    def _engine_truncate(self, n: int) -> None:
        del self.engine[n:]

    def _engine_eval(self, tokens: Sequence[int]) -> None:
        self.cell.evals += 1
        self.engine.extend(tokens)

    def _engine_clear(self) -> None:
        self.engine.clear()

    def _engine_sampler(self, params: SamplingParams, seed: int):
        return None

    def _engine_sample(self, sampler) -> int:
        return ((self.engine[-1] * 7 + len(self.engine)) % 26) + ord("a") - 31

    def _engine_piece(self, token: int) -> bytes:
        return chr(token + 31).encode() if token > 0 else b""

    def _engine_is_end(self, token: int) -> bool:
        return token == 0

    def _engine_save(self) -> bytes:
        return json.dumps(self.engine).encode()

    def _engine_load(self, payload: bytes, n_tokens: int) -> None:
        try:
            state = json.loads(payload)
        except ValueError:
            raise SnapshotCorrupt("null state is not JSON") from None
        if not isinstance(state, list) or len(state) != n_tokens:
            raise SnapshotCorrupt("null state length disagrees with the header")
        self.engine = list(state)


def install_null_cell(home) -> tuple[str, str]:
    """Write a tiny GGUF artifact, register it as `null-test` with the fake model id, and write the
    null cell's manifest into `home/cells`. Returns (name, weights_id)."""
    from gguf import GGUFWriter

    from modeld.distribution.identity import gguf_weights_id
    from modeld.distribution.registry import Registry

    art = home / "artifacts" / "null-test.gguf"
    art.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(str(art), "null")
    writer.add_name("null test model")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    weights_id = gguf_weights_id(art, home=home)
    registry = Registry.load(home)
    registry.add("null-test", art, model_id=NULL_MODEL_ID, replace=True)
    registry.save()
    manifest = {
        "id": "null_test_cell", "version": "1", "backend": "null",
        "serves": [{"model_id": NULL_MODEL_ID, "weights_id": weights_id}],
        "artifact_formats": ["gguf"], "rank": 100, "weight_profile": "none", "kv_profile": "none",
    }
    (home / "cells").mkdir(parents=True, exist_ok=True)
    (home / "cells" / "null_test_cell.json").write_text(json.dumps(manifest))
    return "null-test", weights_id


NULL_FACTORIES = {"null": NullCell}
