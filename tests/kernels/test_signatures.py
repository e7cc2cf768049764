"""Every kernels/<op>/ folder with reference.py and triton.py exports the same public functions
with identical signatures (names, parameters, defaults, annotations).

Public functions = the functions named in the module's `__all__` (or, without `__all__`, every
function defined there whose name does not start with "_"). A reference may list extra spec-only
functions in `REFERENCE_ONLY` (e.g. a second, chunked formulation).
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

import modeld.kernels

KERNELS_DIR = Path(modeld.kernels.__file__).parent
OP_DIRS = sorted(p.name for p in KERNELS_DIR.iterdir() if (p / "reference.py").is_file() and (p / "triton.py").is_file())


def _api(module) -> dict[str, inspect.Signature]:
    """The module's public functions: those named in `__all__` if it has one, else every function
    defined in the module whose name does not start with "_"."""
    if hasattr(module, "__all__"):
        names = list(module.__all__)
    else:
        names = [n for n, o in vars(module).items()
                 if not n.startswith("_") and getattr(o, "__module__", None) == module.__name__]
    return {n: inspect.signature(getattr(module, n)) for n in names if inspect.isfunction(getattr(module, n))}


def test_ops_are_discovered():
    for op in ("rmsnorm", "gated_rmsnorm", "rope", "conv1d", "gdn", "embedding", "sampling"):
        assert op in OP_DIRS, f"kernels/{op}/ lacks reference.py or triton.py"


@pytest.mark.parametrize("op", OP_DIRS)
def test_reference_and_triton_signatures_match(op):
    ref = importlib.import_module(f"modeld.kernels.{op}.reference")
    tt = importlib.import_module(f"modeld.kernels.{op}.triton")
    ref_only = set(getattr(ref, "REFERENCE_ONLY", ()))
    ref_api = {k: v for k, v in _api(ref).items() if k not in ref_only}
    tt_api = _api(tt)
    assert ref_api, f"kernels/{op}/reference.py exports no public functions"
    assert set(tt_api) == set(ref_api), (
        f"{op}: public functions differ: only in reference {sorted(set(ref_api) - set(tt_api))}, "
        f"only in triton {sorted(set(tt_api) - set(ref_api))} (make helpers private or list them in __all__)"
    )
    for name, sig in ref_api.items():
        assert tt_api[name] == sig, f"{op}.{name}: reference{sig} != triton{tt_api[name]}"


@pytest.mark.parametrize("op", OP_DIRS)
def test_reference_has_a_spec_docstring(op):
    ref = importlib.import_module(f"modeld.kernels.{op}.reference")
    assert ref.__doc__ and len(ref.__doc__.strip()) > 40, f"kernels/{op}/reference.py needs its spec docstring"
