"""Read an .mspec artifact's identity through `modeld.mspec`, defensively.

`modeld.mspec` is written by another helper; this adapter is the only place that knows its
API. It tries, in order, the entry points listed in `_ENTRY_POINTS` and reads `model_id`,
`weights_id` and `family` from the result (attributes or mapping keys, possibly under an
`identity`/`metadata` member). Outcomes:
* the reader is missing, has none of the entry points, or crashes with a non-ModeldError
  -> MspecReaderUnavailable (the artifact's identity is then unknown, not the file invalid);
* the reader raises a ModeldError (bad magic, checksum mismatch...) -> InvalidArtifact.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modeld.distribution.errors import InvalidArtifact, ModeldError, MspecReaderUnavailable
from modeld.distribution.identity import check_identity_text, check_weights_id

# (module, attribute) pairs, most specific first.
# `open_mspec(path)` validates header + directory (not the payload hashes) and returns an
# MspecFile whose `.directory` carries model_id, weights_id and family.
_ENTRY_POINTS = (
    ("modeld.mspec", "read_identity"),
    ("modeld.mspec", "open_mspec"),
)


@dataclass(frozen=True, slots=True)
class MspecIdentity:
    model_id: str
    weights_id: str
    family: str | None


def _member(obj: Any, key: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(key)
    return getattr(obj, key, None)


def _find(obj: Any, key: str) -> Any:
    """`key` on obj, or one level down (obj.directory, .identity, .metadata, .header, .meta)."""
    value = _member(obj, key)
    if value is not None:
        return value
    for nest in ("directory", "identity", "metadata", "header", "meta"):
        inner = _member(obj, nest)
        if inner is not None and _member(inner, key) is not None:
            return _member(inner, key)
    return None


def _entry_point():
    for module_name, attribute in _ENTRY_POINTS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            continue
        except Exception as exc:  # a broken module must not crash resolution
            raise MspecReaderUnavailable(
                f"{module_name} failed to import ({type(exc).__name__}: {exc})"
            ) from None
        function = getattr(module, attribute, None)
        if callable(function):
            return function
    raise MspecReaderUnavailable("modeld.mspec has no identity reader (read_identity/open_mspec)")


def read_mspec_identity(path: Path) -> MspecIdentity:
    """The (model_id, weights_id, family) recorded in the .mspec at `path`. Reads the file.

    Raises MspecReaderUnavailable or InvalidArtifact (see the module docstring).
    """
    function = _entry_point()
    try:
        result = function(path)
    except ModeldError as exc:
        raise InvalidArtifact(f"{path}: {exc.one_line()}") from None
    except Exception as exc:
        raise MspecReaderUnavailable(
            f"reading {path} crashed the .mspec reader ({type(exc).__name__}: {exc})"
        ) from None
    try:
        try:
            model_id = check_identity_text(_find(result, "model_id"), "model_id")
            weights_id = check_weights_id(_find(result, "weights_id"))
        except ModeldError as exc:
            raise InvalidArtifact(f"{path}: {exc.one_line()}") from None
        family = _find(result, "family")
        return MspecIdentity(model_id, weights_id, family if isinstance(family, str) else None)
    finally:
        close = getattr(result, "close", None)
        if callable(close):
            try:
                close()
            except Exception:
                pass
