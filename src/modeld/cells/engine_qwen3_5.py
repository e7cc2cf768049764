"""The qwen3_5 specialized cell: the session contract over `Qwen35Engine` (T2 over T1).

One engine slot holds the *resident* session's state (KV + GDN conv/recurrent state + last
logits); other sessions are parked as bytes (`Qwen35Engine.save_slot`) and loaded back when used,
as the llama.cpp cell does. Kernels are bound in code at load: Triton on a CUDA device, the
PyTorch references elsewhere (that is how CI runs this cell on CPU).

Prefix reuse: `ensure_prefix` keeps the longest common prefix. Attention KV can be cut anywhere,
but GDN recurrent state cannot be rolled back, so the engine keeps GDN state checkpoints at
every `checkpoint_every` positions and at the end of each prefill (a few entries per slot);
trimming restores the newest checkpoint at or before the cut and re-evaluates the tokens between
it and the cut (`PrefixResult.prefilled` does not count those: they are engine-internal, and
`Qwen35Session.recomputed` reports them). Without a checkpoint it re-prefills from position 0.

Every engine call runs under `self.lock`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from modeld.execution.bindings import KernelSet, default_kernels
from modeld.execution.sampler import SlotSampler
from modeld.execution.artifacts import open_artifact
from modeld.execution.tokenizer import Tokenizer
from modeld.kernels.versions import runtime_versions
from modeld.models.qwen3_5.config import Qwen35Config
from modeld.models.qwen3_5.engine import EngineOptions, Qwen35Engine, default_suffix_bucket
from modeld.serving.chat import ChatTemplate
from modeld.serving.contract import Capabilities, IdentityKey, MemoryReport
from modeld.serving.slot_cell import SlotEngineCell, SlotEngineSession
from modeld.serving.errors import InvalidRequest, Unsupported

BACKEND = "modeld-qwen3_5"
CELL_ID = "engine_qwen3_5"
KV_PROFILE = "kv-bf16"
UNSUPPORTED_MODES = ("logprobs", "n>1", "embeddings", "lora", "grammar", "images", "mtp-speculation")


class Qwen35Cell(SlotEngineCell):
    """Loads a qwen3_5 artifact: an .mspec file or an HF checkpoint directory (`open_artifact`).
    `model_id`/`weights_id` default to the identities the .mspec records.

    Raises InvalidRequest (bad n_ctx/policy), ModelConfigError / WeightLoadError subclasses (bad
    artifact), TokenizerError.
    """

    def __init__(self, artifact: str | Path, *, model_id: str | None = None, weights_id: str | None = None, cell_id: str = CELL_ID,
                 device: str | torch.device | None = None, n_ctx: int = 4096, context_policy: str = "clamp",
                 kernels: KernelSet | None = None, manifest_version: str = "1",
                 options: EngineOptions | None = None) -> None:
        self._check_context(n_ctx, context_policy)
        self.artifact = open_artifact(artifact)
        model_id = model_id or self.artifact.model_id
        weights_id = weights_id or self.artifact.weights_id
        if not model_id or not weights_id:
            raise InvalidRequest("a checkpoint directory carries no identity: pass model_id and weights_id", param="model")
        dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.config = Qwen35Config.from_hf(self.artifact.config)
        self.tokenizer = Tokenizer(self.artifact.tokenizer_json)
        opts = options or EngineOptions(suffix_bucket=default_suffix_bucket(dev, n_ctx))
        # the padded suffix step needs its rows inside the context: a bucket wider than n_ctx shrinks to it
        opts = EngineOptions(**{**opts.__dict__, "slots": 1, "capacity": n_ctx,
                                "suffix_bucket": min(opts.suffix_bucket, n_ctx)})
        self.engine = Qwen35Engine(self.config, self.artifact.source, dev,
                                   kernels or default_kernels(dev), opts)
        self.sampler = SlotSampler(self.engine.kernels.sampling, 1, dev)
        self.lock = threading.RLock()
        self._n_ctx, self._policy = n_ctx, context_policy
        self._resident: Qwen35Session | None = None
        self._template = self._load_template()
        self._identity = IdentityKey(
            model_id=model_id, weights_id=weights_id, cell_id=cell_id,
            backend=f"{BACKEND}/{self.engine.kernels.name}", profile=self.profile,
            tokenizer_id=self.tokenizer.tokenizer_id,
            template_id=self._template.template_id if self._template else "none",
            manifest_version=manifest_version,
        )
        self._finish_load(dev)

    def _load_template(self) -> ChatTemplate | None:
        source = self.artifact.chat_template
        return ChatTemplate(source, bos_token="", eos_token="<|endoftext|>") if source else None

    @property
    def profile(self) -> str:
        """Weight/KV profile, e.g. "bf16/kv-bf16" or "fp8/kv-bf16" (what the artifact stores)."""
        return f"{self.engine.weights.profile}/{KV_PROFILE}"

    # ---------------------------------------------------------------- Cell
    def capabilities(self) -> Capabilities:
        spec = self.engine.spec
        n = self.engine.lengths[0] if self._resident is not None else 0
        return Capabilities(
            identity=self._identity, n_ctx=self._n_ctx, n_vocab=self.config.vocab,
            context_policy=self._policy, snapshot_supported=True, chat_template=self._template is not None,
            memory=MemoryReport(
                weights_bytes=self.engine.weights.nbytes,
                kv_bytes_per_token=spec.bytes_per_token,
                kv_capacity_bytes=spec.bytes_per_token * spec.capacity,
                state_bytes=spec.bytes_per_token * n + spec.fixed_bytes_per_slot,
            ),
            runtime_versions=_versions(self.engine),
            profiles=(self.profile,),
            unsupported=UNSUPPORTED_MODES,
        )

    def new_session(self) -> Qwen35Session:
        return Qwen35Session(self)

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise InvalidRequest("text must be a string", param="prompt")
        return self.tokenizer.encode(text)  # qwen3_5 adds no BOS (tokenizer_config add_bos_token false)

    def chat_tokens(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        if self._template is None:
            raise Unsupported("this model has no chat template; use a plain completion", param="messages")
        return self._template.tokens(messages, lambda text, _bos, special: self.tokenizer.encode(text, parse_special=special))


class Qwen35Session(SlotEngineSession):
    """A session whose state lives in engine slot 0 while resident (`SlotEngineSession`)."""

    ENGINE_LABEL = "qwen3_5"

    def __init__(self, cell: Qwen35Cell) -> None:
        super().__init__(cell)
        self.recomputed = 0  # tokens re-evaluated internally to rebuild GDN state after trims

    def _engine_truncate(self, n: int) -> int:
        count = self._guard(lambda: self._cell.engine.truncate(0, n, self._kv))
        self.recomputed += count
        return count


def _versions(engine: Qwen35Engine) -> dict[str, str]:
    return {**runtime_versions(engine.device), "kernels": engine.kernels.name}


def build(spec, options, *, device: str | torch.device | None = None, kernels: KernelSet | None = None) -> Qwen35Cell:
    """Factory for `modeld.cells.CELL_FACTORIES` (backend "engine", family "qwen3_5"). Defaults:
    CUDA with Triton when present, else the CPU with the references; `cells/engine_reference.py`
    passes device "cpu" and `reference_kernels()` explicitly."""
    return Qwen35Cell(spec.artifact_path, model_id=spec.model_id, weights_id=spec.weights_id,
                      cell_id=spec.cell_id, device=device, n_ctx=options.n_ctx, context_policy=options.context_policy,
                      kernels=kernels, manifest_version=spec.manifest_version)
