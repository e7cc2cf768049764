"""Regenerate the knowledge index in AGENTS.md from each entry's `touches:` field.

Every KNOWLEDGE entry names the paths it is about (`- touches: a/, b.py`). This groups entries by
those paths and rewrites the table between the INDEX markers in AGENTS.md, so that the index
cannot drift from the entries. `--check` exits 1 when AGENTS.md is stale (used by the tests).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- INDEX:BEGIN (tools/index_kb.py) -->", "<!-- INDEX:END -->"
FOLDERS = ("pitfalls", "findings", "optimizations", "dead-ends", "ah-ha")


def _touches(entry: Path) -> list[str]:
    match = re.search(r"^- touches: (.+)$", entry.read_text(), re.MULTILINE)
    if not match:
        return ["(anywhere)"]
    paths = [p.strip().strip("`") for p in re.split(r"[,;]", match.group(1))]
    return [p for p in paths if p] or ["(anywhere)"]


def render_index() -> str:
    by_path: dict[str, list[str]] = defaultdict(list)
    for folder in FOLDERS:
        for entry in sorted((ROOT / "KNOWLEDGE" / folder).glob("*.md")):
            for path in _touches(entry):
                by_path[path].append(str(entry.relative_to(ROOT)))
    rows = ["| path | read first |", "|---|---|"]
    for path in sorted(by_path):
        rows.append(f"| `{path}` | " + ", ".join(f"`{e}`" for e in by_path[path]) + " |")
    return "\n".join([BEGIN, *rows, END])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if AGENTS.md is stale")
    args = parser.parse_args(argv)
    agents = ROOT / "AGENTS.md"
    text = agents.read_text()
    start, stop = text.index(BEGIN), text.index(END) + len(END)
    updated = text[:start] + render_index() + text[stop:]
    if args.check:
        if updated != text:
            print("AGENTS.md index is stale: run `python3 tools/index_kb.py`")
            return 1
        return 0
    agents.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
