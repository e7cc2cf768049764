"""Where modeld keeps its local state: `MODELD_HOME` and the folders under it.

Layout (docs/interfaces.md):
    $MODELD_HOME/artifacts/              installed model files (.gguf, .mspec)
    $MODELD_HOME/registry.json           names -> artifacts registered by `modeld models add`
    $MODELD_HOME/cells/*.json            extra cell manifests (beside the built-in ones)
    $MODELD_HOME/cache/weights-id.json   GGUF weights-id cache keyed by (realpath, size, mtime_ns)

Nothing here creates directories except `ensure_dir`, which callers use right before a write.
"""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "MODELD_HOME"


def modeld_home() -> Path:
    """`$MODELD_HOME` if set (and non-empty), else `platformdirs.user_cache_dir("modeld")`.

    platformdirs is imported lazily; where it is absent (the H200 machine) the XDG default
    `~/.cache/modeld` is used, which is what platformdirs returns on Linux anyway.
    Pure: reads the environment, touches no file.
    """
    value = os.environ.get(HOME_ENV, "").strip()
    if value:
        return Path(value).expanduser().absolute()
    try:
        import platformdirs
    except ImportError:
        base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
        return Path(base).expanduser().absolute() / "modeld"
    return Path(platformdirs.user_cache_dir("modeld")).absolute()


def artifacts_dir(home: Path | None = None) -> Path:
    return (home or modeld_home()) / "artifacts"


def registry_path(home: Path | None = None) -> Path:
    return (home or modeld_home()) / "registry.json"


def user_cells_dir(home: Path | None = None) -> Path:
    return (home or modeld_home()) / "cells"


def cache_dir(home: Path | None = None) -> Path:
    return (home or modeld_home()) / "cache"


def ensure_dir(path: Path) -> Path:
    """Create `path` (and parents) if needed; returns it. Mutates the filesystem."""
    path.mkdir(parents=True, exist_ok=True)
    return path


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file + rename, so readers never see half a file.

    Raises OSError when the directory is not writable (callers decide whether that is fatal).
    """
    ensure_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
