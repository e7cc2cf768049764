"""The oracle is independent: no file under oracle/ imports modeld (or torch/transformers).

An AST scan of every .py file, so a lazy import inside a function is caught too, and so are
`importlib.import_module("modeld...")` and `__import__("modeld")` calls with literal names.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ORACLE = Path(__file__).resolve().parents[2] / "oracle"
ALLOWED_THIRD_PARTY = {"numpy"}           # the oracle runs where torch does not


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if name in ("import_module", "__import__") and node.args and \
                    isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return found


def _files() -> list[Path]:
    files = sorted(ORACLE.rglob("*.py"))
    assert files, f"no python files under {ORACLE}"
    return files


@pytest.mark.parametrize("path", _files(), ids=lambda p: p.name)
def test_oracle_file_imports_only_stdlib_numpy_and_oracle(path):
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = []
    for line, module in _imports(tree):
        top = module.split(".")[0]
        if top == "modeld" or not (top in sys.stdlib_module_names or top in ALLOWED_THIRD_PARTY
                                   or top == "oracle" or top == "__future__"):
            bad.append(f"{path.name}:{line}: import {module}")
    assert not bad, "oracle must stay independent of modeld and torch:\n" + "\n".join(bad)


def test_scanner_catches_every_import_form():
    src = ("import modeld\nfrom modeld.kernels import x\nimport importlib\n"
           "def f():\n    import modeld.models\n    importlib.import_module('modeld.qualify')\n"
           "    __import__('torch')\n")
    mods = [m for _, m in _imports(ast.parse(src))]
    assert mods == ["modeld", "modeld.kernels", "importlib", "modeld.models", "modeld.qualify",
                    "torch"] or sorted(mods) == sorted(["modeld", "modeld.kernels", "importlib",
                                                        "modeld.models", "modeld.qualify", "torch"])
