#!/usr/bin/env bash
# The llama-cpp-python source the H200 builds with CUDA, trimmed to fit a device call's carry (64 MiB in all):
# PyPI has no CUDA wheel, and the 0.3.36 sdist is 76.6 MB, most of it a vendored .git pack, test vocab GGUFs and
# generated op docs. Writes .whl-src/llama_cpp_python-<ver>-trimmed.tar.gz (git-ignored) plus the one runtime
# dependency the device image lacks (diskcache) in .whl/. The version is this venv's, so the control runs the
# llama.cpp CI tests. On the device (carry [".whl", ".whl-src", ...]): tools/device_checks.sh llamacpp.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ver=$("$PY" -c "import importlib.metadata as m; print(m.version('llama-cpp-python'))")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PY" -m pip download -q --no-deps --no-binary :all: -d "$work" "llama-cpp-python==$ver"
tar xzf "$work"/llama_cpp_python-"$ver".tar.gz -C "$work"
src="$work/llama_cpp_python-$ver"
rm -rf "$src/.git" "$src/vendor/llama.cpp/.git" "$src/vendor/llama.cpp/docs" "$src/vendor/llama.cpp/media" \
       "$src/vendor/llama.cpp/models"/*.gguf "$src/vendor/llama.cpp/models"/*.inp "$src/vendor/llama.cpp/models"/*.out
mkdir -p .whl-src .whl
tar czf ".whl-src/llama_cpp_python-$ver-trimmed.tar.gz" -C "$work" "llama_cpp_python-$ver"
"$PY" -m pip download -q --no-deps --only-binary=:all: -d .whl "diskcache==$("$PY" -c "import importlib.metadata as m; print(m.version('diskcache'))")"
ls -la .whl-src
echo "llama-cpp-python $ver source for the H200: $(du -sh .whl-src | cut -f1)"
