"""The knowledge base stays usable: every entry has the required fields and is indexed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KB = ROOT / "KNOWLEDGE"
CATEGORIES = {"pitfalls": "pitfall", "findings": "finding", "optimizations": "optimization",
              "dead-ends": "dead-end", "ah-ha": "ah-ha"}
FIELDS = ("category", "status", "versions", "date")
SECTIONS = ("## Expected", "## Observed", "## Reproduction", "## Rule")

ENTRIES = sorted(p for folder in CATEGORIES for p in (KB / folder).glob("*.md"))


def test_knowledge_base_has_its_folders() -> None:
    for folder in CATEGORIES:
        assert (KB / folder).is_dir(), folder
    assert (KB / "README.md").is_file() and (KB / "asm-inventory.md").is_file()
    assert ENTRIES, "the knowledge base is empty"


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_entry_has_fields_and_sections(entry: Path) -> None:
    text = entry.read_text()
    assert text.startswith("# "), "an entry opens with a one-line title"
    for field in FIELDS:
        assert re.search(rf"^- {field}: \S", text, re.MULTILINE), f"missing field '{field}'"
    category = re.search(r"^- category: (\S+)", text, re.MULTILINE).group(1)
    assert category == CATEGORIES[entry.parent.name], f"category {category} in folder {entry.parent.name}"
    status = re.search(r"^- status: (.+)$", text, re.MULTILINE).group(1)
    assert status == "active" or status.startswith("superseded by "), status
    for section in SECTIONS:
        assert section in text, f"missing section '{section}'"


def test_agents_md_index_is_current() -> None:
    """AGENTS.md's index is generated from the entries' `touches:` fields; it must not drift."""
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "index_kb.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    index = (ROOT / "AGENTS.md").read_text()
    missing = [str(p.relative_to(ROOT)) for p in ENTRIES if str(p.relative_to(ROOT)) not in index]
    assert not missing, f"run python3 tools/index_kb.py: {missing}"
