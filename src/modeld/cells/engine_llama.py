"""The llama specialized cell: the session contract over `LlamaEngine` (T2 over T1).

First artifact: SmolLM2-135M-Instruct. The cell loads an .mspec (any profile: bf16, fp8, int4 —
the GGUF import keeps Q4_1 losslessly as int4 g32), an HF checkpoint directory, or the GGUF
itself, which it imports once (losslessly, `modeld convert`) into
`$MODELD_HOME/cache/engine_llama/<weights hex>.mspec`; the identity stays the GGUF's, because the
import changes no weight bit. Kernels are bound in code: Triton on a CUDA device, the PyTorch
references elsewhere (how CI runs this cell).

One engine slot holds the resident session's KV + last logits; other sessions are parked as
bytes (`LlamaEngine.save_slot`) and loaded back when used. Prefix reuse keeps the longest common
prefix and trims the KV exactly (llama has no recurrent state). Every engine call runs under
`self.lock`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from modeld.execution.artifacts import open_artifact
from modeld.execution.bindings import KernelSet, default_kernels
from modeld.execution.sampler import SlotSampler
from modeld.execution.tokenizer import Tokenizer
from modeld.kernels.versions import runtime_versions
from modeld.models.llama.config import LlamaConfig
from modeld.models.llama.engine import EngineOptions, LlamaEngine
from modeld.serving.chat import ChatTemplate
from modeld.serving.contract import Capabilities, IdentityKey, MemoryReport
from modeld.serving.slot_cell import SlotEngineCell, SlotEngineSession
from modeld.serving.errors import FatalBackendState, InvalidRequest, Unsupported

BACKEND = "modeld-llama"
CELL_ID = "engine_llama"
UNSUPPORTED_MODES = ("logprobs", "n>1", "embeddings", "lora", "grammar", "images")


def mspec_for_gguf(gguf: str | Path, weights_id: str | None = None, home: Path | None = None) -> Path:
    """The lossless int4 .mspec of a GGUF, converted once into the cache (needs the `gguf`
    package the first time). Returns its path; raises the converter's named errors."""
    from modeld.distribution.home import modeld_home
    from modeld.distribution.identity import gguf_weights_id

    wid = weights_id or gguf_weights_id(Path(gguf))
    out = Path(home or modeld_home()) / "cache" / "engine_llama" / f"{wid.removeprefix('sha256:')}.mspec"
    if not out.is_file():
        from modeld.convert.commands import convert_main

        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".partial.mspec")
        tmp.unlink(missing_ok=True)
        if convert_main([str(gguf), "-o", str(tmp), "--profile", "int4"]) != 0:
            raise FatalBackendState(f"importing {gguf} into an .mspec failed")
        tmp.replace(out)
    return out


def manifest_document(serves: Sequence[tuple[str, str]], *, cell_id: str = "engine_llama_smollm2",
                      rank: int = 100, gpu: bool = True) -> dict:
    """The manifest (JSON-ready dict) of this cell for exact (model_id, weights_id) pairs: the
    Triton engine on one sm_90 GPU (`gpu=False`: no host requirement, for CPU tests only)."""
    req = {"gpu_archs": ["sm_90"], "gpu_count": 1, "min_total_memory_bytes": 1 << 30} if gpu else {}
    return {"id": cell_id, "version": "1", "backend": "engine", "family": "llama",
            "description": "SmolLM2-135M-Instruct on our Triton engine (llama family), CUDA-graph decode",
            "serves": [{"model_id": m, "weights_id": w} for m, w in serves],
            "artifact_formats": ["gguf", "mspec"], "requirements": req, "rank": rank,
            "weight_profile": "as-stored (GGUF: int4 g32 asymmetric = lossless Q4_1)", "kv_profile": "bf16",
            "context_tiers": [], "unsupported_modes": list(UNSUPPORTED_MODES)}


class LlamaCell(SlotEngineCell):
    """Loads a llama artifact (.mspec, HF checkpoint directory, or .gguf imported losslessly).
    `model_id`/`weights_id` default to the identities the .mspec records.

    Raises InvalidRequest (bad n_ctx/policy, no identity), ModelConfigError / WeightLoadError
    subclasses (bad artifact), TokenizerError.
    """

    def __init__(self, artifact: str | Path, *, model_id: str | None = None, weights_id: str | None = None,
                 cell_id: str = CELL_ID, device: str | torch.device | None = None, n_ctx: int = 4096,
                 context_policy: str = "clamp", kernels: KernelSet | None = None, manifest_version: str = "1",
                 options: EngineOptions | None = None) -> None:
        self._check_context(n_ctx, context_policy)
        path = Path(artifact)
        if path.suffix.lower() == ".gguf":
            path = mspec_for_gguf(path, weights_id)
        self.artifact = open_artifact(path)
        model_id = model_id or self.artifact.model_id
        weights_id = weights_id or self.artifact.weights_id
        if not model_id or not weights_id:
            raise InvalidRequest("a checkpoint directory carries no identity: pass model_id and weights_id", param="model")
        meta = _tokenizer_meta(self.artifact)
        eos = meta.get("eos_token_id")
        self.config = LlamaConfig.from_hf(self.artifact.config, (eos,) if isinstance(eos, int) else ())
        self.add_bos = bool(meta.get("add_bos_token", False))
        self.tokenizer = Tokenizer(self.artifact.tokenizer_json)
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        opts = options or EngineOptions()
        opts = EngineOptions(**{**opts.__dict__, "slots": 1, "capacity": n_ctx})
        self.engine = LlamaEngine(self.config, self.artifact.source, dev, kernels or default_kernels(dev), opts)
        self.sampler = SlotSampler(self.engine.kernels.sampling, 1, dev)
        self.lock = threading.RLock()
        self._n_ctx, self._policy = n_ctx, context_policy
        self._resident: LlamaSession | None = None
        src = self.artifact.chat_template
        self._template = ChatTemplate(src, bos_token=self._text(self.config.bos_id), eos_token=self._text(eos)) if src else None
        self.profile = f"{self.engine.weights.profile()}/kv-bf16"
        self._identity = IdentityKey(
            model_id=model_id, weights_id=weights_id, cell_id=cell_id,
            backend=f"{BACKEND}/{self.engine.kernels.name}", profile=self.profile,
            tokenizer_id=self.tokenizer.tokenizer_id,
            template_id=self._template.template_id if self._template else "none",
            manifest_version=manifest_version,
        )
        self._finish_load(dev)

    def _text(self, token: object) -> str:
        if not isinstance(token, int):
            return ""
        return self.tokenizer._tok.id_to_token(token) or ""

    # ---------------------------------------------------------------- Cell
    def capabilities(self) -> Capabilities:
        spec = self.engine.spec
        n = self.engine.lengths[0] if self._resident is not None else 0
        return Capabilities(
            identity=self._identity, n_ctx=self._n_ctx, n_vocab=self.config.vocab,
            context_policy=self._policy, snapshot_supported=True, chat_template=self._template is not None,
            memory=MemoryReport(weights_bytes=self.engine.weights.nbytes, kv_bytes_per_token=spec.bytes_per_token,
                                kv_capacity_bytes=spec.bytes_per_token * spec.capacity,
                                state_bytes=spec.bytes_per_token * n),
            runtime_versions=_versions(self.engine), profiles=(self.profile,), unsupported=UNSUPPORTED_MODES,
        )

    def new_session(self) -> LlamaSession:
        return LlamaSession(self)

    def _tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        if not isinstance(text, str):
            raise InvalidRequest("text must be a string", param="prompt")
        ids = self.tokenizer.encode(text, parse_special=parse_special)
        bos = self.config.bos_id
        return ([bos] if add_special and self.add_bos and isinstance(bos, int) else []) + ids

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return self._tokenize(text, add_special, False)

    def chat_tokens(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        if self._template is None:
            raise Unsupported("this model has no chat template; use a plain completion", param="messages")
        return self._template.tokens(messages, self._tokenize)

    def render_chat(self, messages: Sequence[Mapping[str, str]]) -> str:
        if self._template is None:
            raise Unsupported("this model has no chat template", param="messages")
        return self._template.render(messages)


class LlamaSession(SlotEngineSession):
    """A session whose state lives in engine slot 0 while resident (`SlotEngineSession`)."""

    ENGINE_LABEL = "llama"

    def _engine_truncate(self, n: int) -> None:
        self._cell.engine.truncate(0, n)


def _tokenizer_meta(artifact) -> dict:
    """Tokenizer facts an .mspec records (eos, add_bos); {} for a checkpoint directory."""
    file = getattr(artifact.source, "file", None)
    meta = file.directory.metadata.get("tokenizer") if file is not None else None
    if isinstance(meta, dict):
        return meta
    if artifact.path.is_dir() and (artifact.path / "tokenizer_config.json").is_file():
        import json

        cfg = json.loads((artifact.path / "tokenizer_config.json").read_text())
        return {"add_bos_token": bool(cfg.get("add_bos_token", False))}
    return {}


def _versions(engine: LlamaEngine) -> dict[str, str]:
    return {**runtime_versions(engine.device), "kernels": engine.kernels.name,
            "decode_graph": "captured" if engine.graph.captured else "eager"}


def build(spec, options, *, device: str | torch.device | None = None, kernels: KernelSet | None = None) -> LlamaCell:
    """Factory for `modeld.cells.CELL_FACTORIES` (backend "engine", family "llama"). Defaults:
    CUDA with Triton when present, else the CPU with the references; `cells/engine_reference.py`
    passes device "cpu" and `reference_kernels()` explicitly."""
    return LlamaCell(spec.artifact_path, model_id=spec.model_id, weights_id=spec.weights_id,
                     cell_id=spec.cell_id, device=device, n_ctx=options.n_ctx, context_policy=options.context_policy,
                     kernels=kernels, manifest_version=spec.manifest_version)
