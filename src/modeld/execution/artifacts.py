"""Open a model artifact for an engine: its tensors, config, tokenizer and identity.

Two forms: an .mspec file (tensors + `metadata.config` + `tokenizer/*` blobs + identities), or
a Hugging Face checkpoint directory (safetensors shards + config.json + tokenizer files), which
is how synthetic checkpoints and HF controls arrive before conversion. Raises
ArtifactFormatError for anything else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modeld.execution.errors import ExecutionError
from modeld.execution.sources import MspecSource, SafetensorsDirSource, TensorSource


class ArtifactFormatError(ExecutionError):
    """The path is neither an .mspec file nor a checkpoint directory with config and tokenizer."""


@dataclass(frozen=True)
class Artifact:
    path: Path
    source: TensorSource
    config: dict[str, Any]
    tokenizer_json: str
    chat_template: str | None
    model_id: str | None       # recorded identity (.mspec), None for a bare directory
    weights_id: str | None


def open_artifact(path: str | Path) -> Artifact:
    p = Path(path)
    if p.is_file():
        src = MspecSource(p)
        d = src.file.directory
        meta = d.metadata
        if not isinstance(meta.get("config"), dict):
            raise ArtifactFormatError(f"{p.name}: metadata has no model config")
        blob = "tokenizer/tokenizer.json"
        if blob not in src.file:
            raise ArtifactFormatError(f"{p.name}: no {blob} blob")
        template = meta.get("chat_template")
        return Artifact(p, src, dict(meta["config"]), src.file.blob(blob).decode("utf-8"),
                        template if isinstance(template, str) else None, d.model_id, d.weights_id)
    if p.is_dir():
        try:
            config = json.loads((p / "config.json").read_text())
            tok = (p / "tokenizer.json").read_text(encoding="utf-8")
        except (OSError, json.JSONDecodeError) as exc:
            raise ArtifactFormatError(f"{p}: needs config.json and tokenizer.json ({exc})") from None
        template = None
        tc = p / "tokenizer_config.json"
        if tc.exists():
            t = json.loads(tc.read_text()).get("chat_template")
            template = t if isinstance(t, str) else None
        return Artifact(p, SafetensorsDirSource(p), config, tok, template, None, None)
    raise ArtifactFormatError(f"{p} is neither an .mspec file nor a checkpoint directory")
