"""Cell manifests: validated pydantic v2 data saying what a cell serves and what it needs.

Built-in manifests are the JSON files in `src/modeld/cells/manifests/` (a new file there is
picked up automatically); users add more in `$MODELD_HOME/cells/*.json`. Loading is strict:
unknown keys, wrong types, inconsistent requirements or duplicate ids raise InvalidManifest,
naming the file and the field. Pydantic is imported here only: `import modeld` stays light.
"""

from __future__ import annotations

import enum
import re
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from modeld.distribution.errors import InvalidIdentity, InvalidManifest
from modeld.distribution.home import user_cells_dir
from modeld.distribution.identity import ModelIdentity, check_identity_text, check_weights_id

MAX_MANIFEST_BYTES = 1 << 20
CELL_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
ARCH_RE = re.compile(r"sm_[0-9]{2,3}[a-z]?")
VERSION_RE = re.compile(r"[0-9]+(\.[0-9]+)*")


class BackendKind(str, enum.Enum):
    LLAMA_CPP = "llama.cpp"  # the general cell, through llama-cpp-python
    ENGINE = "engine"  # our own Triton engine (specialized cells)
    NULL = "null"  # test fixture: never available on a real host


class Interconnect(str, enum.Enum):
    ANY = "any"
    NVLINK = "nvlink"
    PCIE = "pcie"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ServedIdentity(_Strict):
    """One exact (model_id, weights_id) a specialized cell is certified for."""

    model_id: str
    weights_id: str

    @field_validator("model_id")
    @classmethod
    def _model_id(cls, value: str) -> str:
        return _identity_rule(check_identity_text, value, "model_id")

    @field_validator("weights_id")
    @classmethod
    def _weights_id(cls, value: str) -> str:
        return _identity_rule(check_weights_id, value, "weights_id")

    def identity(self) -> ModelIdentity:
        return ModelIdentity(self.model_id, self.weights_id)


def _identity_rule(check, value: str, what: str) -> str:
    try:
        return check(value, what)
    except InvalidIdentity as exc:
        raise ValueError(str(exc)) from None  # pydantic turns it into a located error


class Requirements(_Strict):
    """Host requirements. Memory figures are per GPU, over the `gpu_count` GPUs the cell uses."""

    gpu_archs: list[str] = Field(default_factory=list)  # any of these, e.g. ["sm_90"]
    min_driver: str | None = None  # dotted, e.g. "550.54"
    cuda_runtime_major: int | None = Field(default=None, ge=1)
    min_total_memory_bytes: int = Field(default=0, ge=0)
    min_free_memory_bytes: int = Field(default=0, ge=0)
    gpu_count: int = Field(default=0, ge=0, le=64)
    interconnect: Interconnect = Interconnect.ANY

    @field_validator("gpu_archs")
    @classmethod
    def _archs(cls, value: list[str]) -> list[str]:
        for arch in value:
            if not ARCH_RE.fullmatch(arch):
                raise ValueError(f"{arch!r} is not a GPU arch like 'sm_90'")
        return value

    @field_validator("min_driver")
    @classmethod
    def _driver(cls, value: str | None) -> str | None:
        if value is not None and not VERSION_RE.fullmatch(value):
            raise ValueError(f"{value!r} is not a dotted version like '550.54'")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Requirements:
        gpu_fields = {
            "gpu_archs": bool(self.gpu_archs),
            "min_driver": self.min_driver is not None,
            "cuda_runtime_major": self.cuda_runtime_major is not None,
            "min_total_memory_bytes": self.min_total_memory_bytes > 0,
            "min_free_memory_bytes": self.min_free_memory_bytes > 0,
        }
        needs_gpu = [name for name, used in gpu_fields.items() if used]
        if needs_gpu and self.gpu_count == 0:
            raise ValueError(f"{', '.join(needs_gpu)} set but gpu_count is 0")
        if self.interconnect is not Interconnect.ANY and self.gpu_count < 2:
            raise ValueError("an interconnect other than 'any' needs gpu_count >= 2")
        if self.min_free_memory_bytes > self.min_total_memory_bytes > 0:
            raise ValueError("min_free_memory_bytes exceeds min_total_memory_bytes")
        return self


class CellManifest(_Strict):
    """What one cell serves, on what, and how it ranks (one JSON file in `cells/manifests/`).

    Build it with `parse_manifest` / `load_manifest_file` (JSON): the model is strict, so a
    Python dict would need enum members rather than their string values.
    """

    id: str
    version: str
    description: str = ""
    backend: BackendKind
    serves: list[ServedIdentity] = Field(default_factory=list)
    serves_any: bool = False  # the general cell: any artifact of `artifact_formats`
    artifact_formats: list[Literal["gguf", "mspec"]] = Field(min_length=1)
    family: str | None = None  # e.g. "qwen3_5"; None = any family
    requirements: Requirements = Field(default_factory=Requirements)
    rank: int = Field(ge=-1000, le=1000)
    weight_profile: str
    kv_profile: str
    context_tiers: list[int] = Field(default_factory=list)
    unsupported_modes: list[str] = Field(default_factory=list)

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if not CELL_ID_RE.fullmatch(value):
            raise ValueError(f"{value!r} is not a cell id ([A-Za-z0-9][A-Za-z0-9._-]*, <= 128)")
        return value

    @field_validator("version", "weight_profile", "kv_profile")
    @classmethod
    def _text(cls, value: str) -> str:
        return _identity_rule(check_identity_text, value, "value")

    @field_validator("family")
    @classmethod
    def _family(cls, value: str | None) -> str | None:
        return None if value is None else _identity_rule(check_identity_text, value, "family")

    @field_validator("unsupported_modes")
    @classmethod
    def _modes(cls, value: list[str]) -> list[str]:
        for mode in value:
            _identity_rule(check_identity_text, mode, "mode")
        return value

    @field_validator("context_tiers")
    @classmethod
    def _tiers(cls, value: list[int]) -> list[int]:
        if any(tier <= 0 for tier in value) or value != sorted(set(value)):
            raise ValueError("context tiers must be positive, strictly increasing")
        return value

    @model_validator(mode="after")
    def _serves(self) -> CellManifest:
        if self.serves_any and self.serves:
            raise ValueError("serves_any: true and a serves list are exclusive")
        if not self.serves_any and not self.serves:
            raise ValueError("a cell must list what it serves or declare serves_any: true")
        keys = [(s.model_id, s.weights_id) for s in self.serves]
        if len(keys) != len(set(keys)):
            raise ValueError("serves lists an identity twice")
        return self

    def serves_identity(self, identity: ModelIdentity) -> bool:
        return any(s.model_id == identity.model_id and s.weights_id == identity.weights_id
                   for s in self.serves)


# --------------------------------------------------------------------------- loading


def _located(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "(document)"
        message = error["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {message}")
    return "; ".join(parts)


def parse_manifest(text: str | bytes, source: str = "<manifest>") -> CellManifest:
    """Validate one manifest document; raises InvalidManifest naming `source` and the field."""
    if len(text) > MAX_MANIFEST_BYTES:
        raise InvalidManifest(f"{source}: larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        return CellManifest.model_validate_json(text)
    except ValidationError as exc:
        raise InvalidManifest(f"{source}: {_located(exc)}") from None


def load_manifest_file(path: Path) -> CellManifest:
    """Read and validate one manifest file; raises InvalidManifest (also for unreadable files)."""
    try:
        size = path.stat().st_size
        if size > MAX_MANIFEST_BYTES:
            raise InvalidManifest(f"{path}: larger than {MAX_MANIFEST_BYTES} bytes")
        text = path.read_bytes()
    except OSError as exc:
        raise InvalidManifest(f"{path}: unreadable ({exc.strerror})") from None
    return parse_manifest(text, str(path))


def builtin_manifest_dir() -> Path:
    """`src/modeld/cells/manifests/` as a real path (modeld is installed as files, not a zip)."""
    return Path(str(resources.files("modeld") / "cells" / "manifests"))


def load_manifests(
    builtin_dir: Path | None = None, user_dir: Path | None = None, *, include_user: bool = True
) -> tuple[CellManifest, ...]:
    """All manifests: built-in `*.json` then `$MODELD_HOME/cells/*.json`, each sorted by name.

    Raises InvalidManifest for any invalid file and for two manifests with the same id (a user
    manifest cannot silently replace a built-in one). Reads files only.
    """
    dirs = [builtin_dir or builtin_manifest_dir()]
    if include_user:
        dirs.append(user_dir or user_cells_dir())
    manifests: list[CellManifest] = []
    origin: dict[str, Path] = {}
    for directory in dirs:
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.json")):
            manifest = load_manifest_file(path)
            if manifest.id in origin:
                raise InvalidManifest(
                    f"{path}: id: cell id {manifest.id!r} already defined by {origin[manifest.id]}"
                )
            origin[manifest.id] = path
            manifests.append(manifest)
    return tuple(manifests)
