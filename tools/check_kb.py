"""CI gate: engine, kernel and model commits carry knowledge.

Every commit that touches `src/modeld/{kernels,models,execution,mspec,convert}/` must also touch
`KNOWLEDGE/` or say `kb: none - <reason>` on a line of its message. Checks every commit reachable
from HEAD (or those after --since REV). Exit 1 and name the offending commits otherwise.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

HOT = re.compile(r"^src/modeld/(kernels|models|execution|mspec|convert)/")
EXCUSE = re.compile(r"^kb: none - \S", re.MULTILINE)


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


def offending_commits(since: str | None) -> list[str]:
    rev_range = f"{since}..HEAD" if since else "HEAD"
    problems = []
    for sha in _git("rev-list", rev_range).split():
        files = _git("show", "--pretty=format:", "--name-only", sha).split()
        if not any(HOT.match(f) for f in files):
            continue
        if any(f.startswith("KNOWLEDGE/") for f in files):
            continue
        if EXCUSE.search(_git("log", "-1", "--format=%B", sha)):
            continue
        subject = _git("log", "-1", "--format=%h %s", sha).strip()
        problems.append(subject)
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--since", help="only check commits after this revision")
    args = parser.parse_args(argv)
    problems = offending_commits(args.since)
    for subject in problems:
        print(f"kb-check: commit touches engine code without KNOWLEDGE/ or 'kb: none - <reason>': {subject}")
    print(f"kb-check: {'FAILED' if problems else 'ok'} ({len(problems)} offending commits)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
