"""Artifact records: what a model file on this host is (path, format, identity, family, size).

`Artifact` is plain frozen data the pure resolver reads. `inspect_artifact` builds one from a
path (reads the file: GGUF metadata + hashed weights id, or the .mspec directory through
`modeld.mspec`); it never downloads and never raises for a missing file (present=False), a
corrupt file (readable=False) or an unknown identity (identity None; `problem` says why) — the
resolver turns those into named rejections. Only an unsupported file type raises (InvalidArtifact).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modeld.distribution.file_cache import cached_file_facts
from modeld.distribution.errors import InvalidArtifact, InvalidIdentity, ModeldError
from modeld.distribution.identity import (
    ModelIdentity,
    ProgressCallback,
    check_identity_text,
    gguf_weights_id,
)
from modeld.distribution.mspec_adapter import read_mspec_identity

FORMATS = {".gguf": "gguf", ".mspec": "mspec"}
GGUF_META_CACHE = "gguf-metadata.json"


@dataclass(frozen=True, slots=True)
class Artifact:
    """One model artifact as the resolver sees it.

    `names`: every name this artifact answers to (aliases, registry name, or the path as typed).
    `identity` is None when model_id or weights_id could not be established; `problem` says why.
    """

    names: tuple[str, ...]
    path: str  # resolved (symlinks followed) absolute path
    format: str  # "gguf" | "mspec"
    present: bool
    origin: str  # "builtin" | "registry" | "store" | "path"
    model_id: str | None = None
    weights_id: str | None = None
    family: str | None = None  # GGUF general.architecture / .mspec family
    size_bytes: int | None = None
    display_name: str | None = None  # e.g. GGUF general.name, for humans only
    readable: bool = True  # False: the file is present but does not parse (see `problem`)
    problem: str | None = None

    @property
    def identity(self) -> ModelIdentity | None:
        if self.model_id is None or self.weights_id is None:
            return None
        return ModelIdentity(self.model_id, self.weights_id)

    @property
    def name(self) -> str:
        return self.names[0]

    @property
    def serving_model_id(self) -> str:
        """`model_id`, or the file stem when none is known (a plain-path GGUF). For labels and
        cache keys only (the weights id still pins the bytes); never used for selection."""
        return self.model_id if self.model_id is not None else Path(self.path).stem

    def to_dict(self) -> dict[str, Any]:
        return {
            "names": list(self.names),
            "path": self.path,
            "format": self.format,
            "present": self.present,
            "origin": self.origin,
            "model_id": self.model_id,
            "weights_id": self.weights_id,
            "family": self.family,
            "size_bytes": self.size_bytes,
            "display_name": self.display_name,
            "readable": self.readable,
            "problem": self.problem,
        }


def artifact_format(path: str | os.PathLike[str]) -> str:
    """"gguf" or "mspec" from the file suffix; raises InvalidArtifact for anything else."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise InvalidArtifact(f"{path}: not a model artifact (expected .gguf or .mspec)")
    return FORMATS[suffix]


def read_gguf_metadata(path: Path, home: Path | None = None) -> dict[str, str]:
    """`general.architecture` and `general.name` of a GGUF file (cached like the weights id:
    GGUFReader parses every tensor and token, ~2 s for the 98 MB SmolLM2 file).

    Raises InvalidArtifact when gguf is missing or the file does not parse: hostile files give a
    named error, never a crash.
    """
    entry = cached_file_facts(path, GGUF_META_CACHE, _parse_gguf_metadata, home=home,
                              valid=lambda e: isinstance(e.get("metadata"), dict))
    return {str(k): str(v) for k, v in entry["metadata"].items()}


def _parse_gguf_metadata(path: Path) -> dict[str, dict[str, str]]:
    try:
        from gguf import GGUFReader
    except ImportError as exc:
        raise InvalidArtifact(f"{path}: cannot read GGUF metadata, gguf not installed ({exc})")
    try:
        reader = GGUFReader(str(path), "r")
        out = {}
        for key in ("general.architecture", "general.name"):
            field = reader.fields.get(key)
            if field is not None and field.data:
                value = field.parts[field.data[0]]
                out[key] = bytes(value).decode("utf-8", "replace")
        return {"metadata": out}
    except Exception as exc:  # gguf raises ValueError/IndexError/struct errors on bad files
        raise InvalidArtifact(f"{path}: not a readable GGUF ({type(exc).__name__}: {exc})") from None


def inspect_artifact(
    path: str | os.PathLike[str],
    *,
    names: tuple[str, ...],
    origin: str,
    model_id: str | None = None,
    home: Path | None = None,
    progress: ProgressCallback | None = None,
) -> Artifact:
    """Describe the artifact at `path` (reads it; may hash it, cached; writes the id cache).

    `model_id` (from a registry entry or the built-in table) wins over what the file says; a GGUF
    has no trustworthy model id of its own, so without one its identity stays None.
    Raises InvalidArtifact only for a path that is not .gguf/.mspec.
    """
    fmt = artifact_format(path)
    real = Path(os.path.realpath(path))
    if not real.is_file():
        return Artifact(names=names, path=str(real), format=fmt, present=False, origin=origin,
                        model_id=model_id, problem=f"{real} does not exist or is not a file")
    size = real.stat().st_size
    weights_id = family = display = problem = None
    readable = True
    try:
        if fmt == "gguf":
            meta = read_gguf_metadata(real, home)
            family = meta.get("general.architecture")
            display = meta.get("general.name")
            weights_id = gguf_weights_id(real, home=home, progress=progress)
            if model_id is None:
                problem = "no model id known for this GGUF (register it with --model-id)"
        else:
            found = read_mspec_identity(real)
            weights_id, family = found.weights_id, found.family
            if model_id is not None and model_id != found.model_id:
                problem = f"registry says model_id {model_id!r}, the file says {found.model_id!r}"
                model_id = None
            else:
                model_id = found.model_id
    except InvalidArtifact as exc:
        problem, readable, model_id = exc.one_line(), False, None
    except ModeldError as exc:  # MspecReaderUnavailable: the identity is unknown, not the file bad
        problem = exc.one_line()
    if model_id is not None:
        try:
            check_identity_text(model_id, "model_id")
        except InvalidIdentity as exc:
            problem, model_id = exc.one_line(), None
    return Artifact(
        names=names, path=str(real), format=fmt, present=True, origin=origin, model_id=model_id,
        weights_id=weights_id, family=family, size_bytes=size, display_name=display, readable=readable,
        problem=problem,
    )
