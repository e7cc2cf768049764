"""The general cell: llama.cpp through llama-cpp-python (T2 implementation of the contract).

One `llama_cpp.Llama` context per cell holds the KV cache of the *resident* session. Other
sessions of the same cell are parked: their llama.cpp state (the used KV cells) is serialized
into memory when another session takes the context, and loaded back when they are used again;
each session keeps its own copy of the last logits, because llama.cpp's state blob has none
(KNOWLEDGE/pitfalls/llama-cpp-state-has-no-logits.md). Prefix reuse is llama.cpp's own KV: trimming uses `llama_memory_seq_rm` and
evaluation appends at position `n_tokens` (KNOWLEDGE/findings/llama-cpp-python-kv-trim-and-state.md).

Every engine call runs under `self.lock` (one engine call at a time per cell).
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from modeld.serving.chat import ChatTemplate
from modeld.serving.contract import (
    CONTEXT_POLICIES,
    Capabilities,
    Cell,
    IdentityKey,
    MemoryReport,
    SamplingParams,
)
from modeld.serving.engine_session import EngineSession
from modeld.serving.errors import (
    FatalBackendState,
    InvalidRequest,
    SnapshotCorrupt,
    Unsupported,
)

BACKEND = "llama_cpp"
UNSUPPORTED_MODES = ("logprobs", "n>1", "embeddings", "lora", "grammar", "images")
_FILE_TYPES = {0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 7: "q8_0", 8: "q5_0", 9: "q5_1",
               10: "q2_k", 11: "q3_k_s", 14: "q4_k_s", 15: "q4_k_m", 16: "q5_k_s", 17: "q5_k_m",
               18: "q6_k", 32: "bf16"}


class LlamaCppCell(Cell):
    """Loads one GGUF file. Raises InvalidRequest for a bad n_ctx/policy, FatalBackendState if
    llama.cpp cannot load the file."""

    def __init__(
        self,
        model_path: str | os.PathLike,
        *,
        model_id: str,
        weights_id: str,
        cell_id: str = BACKEND,
        n_ctx: int = 2048,
        n_threads: int | None = None,
        context_policy: str = "clamp",
        manifest_version: str = "1",
    ) -> None:
        import llama_cpp
        from llama_cpp import Llama

        if not isinstance(n_ctx, int) or not 16 <= n_ctx <= 1 << 20:
            raise InvalidRequest("n_ctx must be an integer in [16, 1048576]", param="n_ctx")
        if context_policy not in CONTEXT_POLICIES:
            raise InvalidRequest(f"context_policy must be one of {CONTEXT_POLICIES}", param="context_policy")
        self._lc = llama_cpp
        self.lock = threading.RLock()
        self.path = Path(model_path)
        # Prefill uses the same thread count as decode: llama-cpp-python's default batch thread
        # count (all cores) busy-waits badly on a shared small host
        # (KNOWLEDGE/pitfalls/llama-cpp-batch-threads-thrash-on-shared-cores.md).
        threads = n_threads or max(1, (os.cpu_count() or 2) // 2)
        try:
            # verbose=False keeps llama.cpp's load log off stderr (the CLI prints one line or text).
            self._llm = Llama(model_path=str(self.path), n_ctx=n_ctx, n_batch=512, n_threads=threads,
                              n_threads_batch=threads, verbose=False)
        except Exception as exc:  # llama-cpp-python raises ValueError for unloadable files
            raise FatalBackendState(f"llama.cpp could not load {self.path.name}: {exc}") from None
        from llama_cpp._internals import LlamaTokenDataArray

        self._vocab = llama_cpp.llama_model_get_vocab(self._llm.model)
        self._candidates = LlamaTokenDataArray(n_vocab=self._llm.n_vocab())
        self._n_ctx = self._llm.n_ctx()
        self._n_vocab = self._llm.n_vocab()
        self._policy = context_policy
        self._resident: LlamaCppSession | None = None
        meta = self._llm.metadata
        self._meta = meta
        template_src = meta.get("tokenizer.chat_template")
        bos = self._token_text(self._llm.token_bos())
        eos = self._token_text(self._llm.token_eos())
        self._template = ChatTemplate(template_src, bos_token=bos, eos_token=eos) if template_src else None
        ft = meta.get("general.file_type")
        quant = _FILE_TYPES.get(int(ft), f"ft{ft}") if ft is not None else "unknown"
        self._profile = f"gguf-{quant}/kv-f16"
        self._identity = IdentityKey(
            model_id=model_id,
            weights_id=weights_id,
            cell_id=cell_id,
            backend=BACKEND,
            profile=self._profile,
            tokenizer_id="gguf-embedded:" + weights_id,
            template_id=self._template.template_id if self._template else "none",
            manifest_version=manifest_version,
        )

    # ---------------------------------------------------------------- helpers
    def _token_text(self, token: int) -> str:
        if token < 0:
            return ""
        return self._llm._model.token_get_text(token)

    def piece(self, token: int) -> bytes:
        """Bytes of one token (control tokens give b""); grows the buffer for long pieces."""
        size = 64
        while True:
            buf = ctypes.create_string_buffer(size)
            n = self._lc.llama_token_to_piece(self._vocab, token, buf, size, 0, False)
            if n >= 0:
                return buf.raw[:n]
            size = -n

    def _kv_bytes_per_token(self) -> int:
        arch = self._meta.get("general.architecture", "llama")
        layers = int(self._meta.get(f"{arch}.block_count", 0))
        heads = int(self._meta.get(f"{arch}.attention.head_count", 1))
        kv_heads = int(self._meta.get(f"{arch}.attention.head_count_kv", heads))
        embd = int(self._meta.get(f"{arch}.embedding_length", 0))
        k_len = int(self._meta.get(f"{arch}.attention.key_length", embd // max(heads, 1)))
        v_len = int(self._meta.get(f"{arch}.attention.value_length", k_len))
        return layers * kv_heads * (k_len + v_len) * 2  # f16 K and V cache

    def state_size(self) -> int:
        with self.lock:
            return int(self._lc.llama_state_get_size(self._llm.ctx))

    def save_state_bytes(self) -> bytes:
        """llama.cpp's serialized context state (used cells of the KV + last logits)."""
        size = self._lc.llama_state_get_size(self._llm.ctx)
        buf = (ctypes.c_uint8 * size)()
        n = self._lc.llama_state_get_data(self._llm.ctx, buf, size)
        if n == 0 or n > size:
            raise FatalBackendState(f"llama_state_get_data wrote {n} of {size} bytes")
        return ctypes.string_at(buf, n)

    def load_state_bytes(self, payload: bytes, n_tokens: int) -> None:
        """Load a state; raises SnapshotCorrupt if llama.cpp refuses it or its positions disagree
        with n_tokens (the caller then restores its backup)."""
        if not payload:
            raise SnapshotCorrupt("empty backend state")
        buf = (ctypes.c_uint8 * len(payload)).from_buffer_copy(payload)
        used = self._lc.llama_state_set_data(self._llm.ctx, buf, len(payload))
        if used != len(payload):
            raise SnapshotCorrupt(f"llama.cpp consumed {used} of {len(payload)} state bytes")
        mem = self._lc.llama_get_memory(self._llm.ctx)
        pos_max = self._lc.llama_memory_seq_pos_max(mem, 0)
        if pos_max != n_tokens - 1:
            raise SnapshotCorrupt(f"state holds positions up to {pos_max}, the header says {n_tokens} tokens")
        self._llm.n_tokens = n_tokens

    def activate(self, session: LlamaCppSession) -> None:
        """Make `session` resident: park the current one, load the newcomer's parked state.
        Called under self.lock."""
        if self._resident is session:
            return
        if self._resident is not None and not self._resident._closed and self._resident._kv:
            self._resident._parked = self.save_state_bytes()
        self._resident = None
        if session._parked is not None:
            parked, session._parked = session._parked, None
            try:
                self.load_state_bytes(parked, len(session._kv))
            except SnapshotCorrupt as exc:
                self._llm._ctx.kv_cache_clear()
                self._llm.n_tokens = 0
                session._kv, session._pending, session._logits_ready, session._logits = [], None, False, None
                self._resident = session
                raise FatalBackendState(f"a parked session state did not load back ({exc}); the session was reset") from None
            self._llm.input_ids[: len(session._kv)] = session._kv
        else:
            self._llm._ctx.kv_cache_clear()
            self._llm.n_tokens = 0
            session._kv, session._pending, session._logits_ready, session._logits = [], None, False, None
        self._resident = session

    # ---------------------------------------------------------------- Cell
    @property
    def identity(self) -> IdentityKey:
        return self._identity

    @property
    def llm(self):
        return self._llm

    def capabilities(self) -> Capabilities:
        per_token = self._kv_bytes_per_token()
        return Capabilities(
            identity=self._identity,
            n_ctx=self._n_ctx,
            n_vocab=self._n_vocab,
            context_policy=self._policy,
            snapshot_supported=True,
            chat_template=self._template is not None,
            memory=MemoryReport(
                weights_bytes=int(self._lc.llama_model_size(self._llm.model)),
                kv_bytes_per_token=per_token,
                kv_capacity_bytes=per_token * self._n_ctx,
                state_bytes=self.state_size(),
            ),
            runtime_versions={
                "llama-cpp-python": self._lc.__version__,
                "ggml": _ggml_version(self._lc),
                "ggml-system-info": self._lc.llama_print_system_info().decode(errors="replace").strip(),
            },
            profiles=(self._profile,),
            unsupported=UNSUPPORTED_MODES,
        )

    def new_session(self) -> LlamaCppSession:
        return LlamaCppSession(self)

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return self._tokenize(text, add_special, False)

    def _tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        if not isinstance(text, str):
            raise InvalidRequest("text must be a string", param="prompt")
        return self._llm.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(int(t)) for t in tokens).decode("utf-8", errors="replace")

    def chat_tokens(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        if self._template is None:
            raise Unsupported("this model has no chat template; use a plain completion", param="messages")
        return self._template.tokens(messages, self._tokenize)

    def render_chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        if self._template is None:
            raise Unsupported("this model has no chat template", param="messages")
        return self._template.render(messages)

    def close(self) -> None:
        with self.lock:
            self._resident = None
            self._llm.close()


class LlamaCppSession(EngineSession):
    """A session whose state lives in the cell's llama.cpp context while resident."""

    def __init__(self, cell: LlamaCppCell) -> None:
        super().__init__(cell.lock, cell._n_ctx, cell._n_vocab, identity=cell.identity,
                         context_policy=cell._policy)
        self._cell = cell
        self._parked: bytes | None = None
        self._logits = None  # np.ndarray [n_vocab] float32: next-token logits at len(_kv)

    def capabilities(self) -> Capabilities:
        return self._cell.capabilities()

    def _activate(self) -> None:
        self._cell.activate(self)

    def _engine_truncate(self, n: int) -> None:
        llm = self._cell.llm
        llm._ctx.kv_cache_seq_rm(0, n, -1)
        llm.n_tokens = n
        self._logits = None

    def _engine_eval(self, tokens: Sequence[int]) -> None:
        import numpy as np

        llm = self._cell.llm
        llm.n_tokens = len(self._kv)
        self._logits = None
        try:
            llm.eval(list(tokens))
        except Exception as exc:  # llama_decode != 0 surfaces as RuntimeError
            raise FatalBackendState(f"llama.cpp eval failed: {exc}") from None
        # llama.cpp's state blob does not carry logits (KNOWLEDGE/pitfalls/llama-cpp-state-has-no-logits.md),
        # so the session keeps its own copy: [n_vocab] float32 for position len(_kv).
        row = llm._ctx.get_logits_ith(-1)
        self._logits = np.ctypeslib.as_array(row, shape=(self._n_vocab,)).copy()

    def _engine_logits_ready(self) -> bool:
        return self._logits is not None

    def _engine_clear(self) -> None:
        llm = self._cell.llm
        llm._ctx.kv_cache_clear()
        llm.n_tokens = 0
        self._logits = None

    def _engine_sampler(self, params: SamplingParams, seed: int):
        from llama_cpp._internals import LlamaSampler

        sampler = LlamaSampler()
        if params.temperature == 0.0:
            sampler.add_greedy()
        else:
            if params.top_k > 0:
                sampler.add_top_k(params.top_k)
            sampler.add_top_p(params.top_p, 1)
            sampler.add_temp(params.temperature)
            sampler.add_dist(seed)
        return sampler

    def _engine_sample(self, sampler) -> int:
        """Apply the sampler chain to the session's stored logits (not the context's: those may
        belong to another session or be stale after a state load), then accept the token."""
        lc, arr = self._cell._lc, self._cell._candidates
        if self._logits is None:
            raise FatalBackendState("no logits to sample from")
        arr.copy_logits(self._logits)
        arr.candidates.selected = -1
        lc.llama_sampler_apply(sampler.sampler, ctypes.byref(arr.candidates))
        sel = arr.candidates.selected
        if not 0 <= sel < arr.candidates.size:
            raise FatalBackendState(f"sampler selected index {sel} of {arr.candidates.size}")
        token = int(arr.candidates_data.id[sel])
        lc.llama_sampler_accept(sampler.sampler, token)
        return token

    def _engine_piece(self, token: int) -> bytes:
        return self._cell.piece(token)

    def _engine_is_end(self, token: int) -> bool:
        return bool(self._cell._lc.llama_vocab_is_eog(self._cell._vocab, token))

    def _engine_save(self) -> bytes:
        """Payload: u32 n_logits (0 or n_vocab), n_logits float32, then llama.cpp's state blob."""
        logits = b"" if self._logits is None else self._logits.tobytes()
        return struct.pack("<I", len(logits) // 4) + logits + self._cell.save_state_bytes()

    def _engine_load(self, payload: bytes, n_tokens: int) -> None:
        import numpy as np

        if len(payload) < 4:
            raise SnapshotCorrupt("backend payload is truncated")
        (n_logits,) = struct.unpack_from("<I", payload, 0)
        if n_logits not in (0, self._n_vocab):
            raise SnapshotCorrupt(f"payload has {n_logits} logits; this model has {self._n_vocab}")
        end = 4 + 4 * n_logits
        if len(payload) < end:
            raise SnapshotCorrupt("backend payload is truncated inside the logits")
        logits = np.frombuffer(payload[4:end], dtype=np.float32).copy() if n_logits else None
        self._cell.load_state_bytes(payload[end:], n_tokens)
        self._logits = logits

    def close(self) -> None:
        super().close()
        with self._cell.lock:
            self._parked = None
            if self._cell._resident is self:
                self._cell._resident = None


def _ggml_version(llama_cpp_module) -> str:
    """The vendored ggml's version, from its shared library name (libggml.so.X.Y.Z); the Python
    API exposes no llama.cpp build number."""
    lib = Path(llama_cpp_module.__file__).parent / "lib"
    names = sorted(p.name for p in lib.glob("libggml.so.*.*.*"))
    return names[-1].removeprefix("libggml.so.") if names else "unknown"
