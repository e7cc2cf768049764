"""A small JSON cache of per-file facts keyed by (realpath, size, mtime_ns).

Used for GGUF weights ids (`cache/weights-id.json`, docs/interfaces.md) and GGUF metadata
(`cache/gguf-metadata.json`): both cost seconds on large files and never change while the file
does not. A stale, corrupt or unwritable cache only costs a recomputation, never a wrong answer:
entries are reused only when size and mtime_ns still match, and a file that changes while it is
being read is not cached (InvalidArtifact).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from modeld.distribution.errors import InvalidArtifact
from modeld.distribution.home import atomic_write_text, cache_dir

CACHE_VERSION = 1


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
        return {}
    entries = data.get("entries")
    return entries if isinstance(entries, dict) else {}


def cached_file_facts(
    path: str | os.PathLike[str],
    cache_name: str,
    compute: Callable[[Path], dict[str, Any]],
    *,
    home: Path | None = None,
    valid: Callable[[dict[str, Any]], bool] = lambda entry: True,
    use_cache: bool = True,
) -> dict[str, Any]:
    """`compute(realpath)` for the file at `path`, cached in `cache/<cache_name>`.

    A cached entry is used if its size and mtime_ns match the file's and `valid(entry)` holds.
    Mutates the cache file (atomic rewrite) on a miss. Raises InvalidArtifact for a missing or
    non-regular file, a file that changed during `compute`, and whatever `compute` raises.
    """
    real = Path(os.path.realpath(path))
    try:
        before = real.stat()
    except OSError as exc:
        raise InvalidArtifact(f"{path}: cannot stat ({exc.strerror})") from None
    if not real.is_file():
        raise InvalidArtifact(f"{path}: not a regular file")
    key = str(real)
    cache_path = cache_dir(home) / cache_name
    if use_cache:
        hit = _load(cache_path).get(key)
        if (isinstance(hit, dict) and hit.get("size") == before.st_size
                and hit.get("mtime_ns") == before.st_mtime_ns and valid(hit)):
            return hit
    try:
        facts = compute(real)
        after = real.stat()
    except OSError as exc:
        raise InvalidArtifact(f"{path}: cannot read ({exc.strerror})") from None
    if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
        raise InvalidArtifact(f"{path}: the file changed while it was being read")
    entry = {**facts, "size": before.st_size, "mtime_ns": before.st_mtime_ns}
    if use_cache:
        entries = _load(cache_path)  # re-read: another process may have added entries
        entries[key] = entry
        try:
            atomic_write_text(cache_path, json.dumps(
                {"version": CACHE_VERSION, "entries": entries}, indent=1, sort_keys=True))
        except OSError:
            pass  # a read-only MODELD_HOME costs a recomputation next time, nothing else
    return entry
