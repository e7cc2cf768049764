#!/usr/bin/env bash
# Download, into .whl/ (git-ignored), the wheels the H200 image lacks for serving and GGUF work:
# pydantic (+core), fastapi (+ opentelemetry-api, which it imports unconditionally), starlette,
# uvicorn, platformdirs, gguf and their pure-Python needs. Versions = this venv's, so the device runs
# what CI tests. On the device (carry [".whl"]):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:src:.
# See KNOWLEDGE/pitfalls/fastapi-imports-opentelemetry-api.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ver() { "$PY" -c "import importlib.metadata as m; print(m.version('$1'))"; }
mkdir -p .whl
pkgs=()
for p in pydantic pydantic_core annotated-types typing-inspection typing_extensions fastapi starlette \
         annotated-doc uvicorn platformdirs gguf opentelemetry-api; do
  pkgs+=("$p==$(ver "$p")")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "${pkgs[@]}"
# pydantic_core is a cp312 build: the import check can only run there; start each device command
# with the install line above followed by: python3 -c "import fastapi, uvicorn, pydantic, gguf, platformdirs"
# pytest-xdist spreads `pytest -m gpu` over the device's 16 cores (Triton compiles are CPU-bound); the image lacks it
"$PY" -m pip download -q --no-deps --only-binary=:all: -d .whl pytest-xdist==3.8.0 execnet==2.1.2
ls .whl
echo "wheels for the H200 are in .whl/ ($(du -sh .whl | cut -f1))"
