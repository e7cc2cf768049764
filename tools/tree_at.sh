#!/usr/bin/env bash
# A runnable copy of an older commit's code under .scratch/at-<commit>/ (src, bench, tools, oracle, tests/fixtures;
# ~2 MB), with its commit in COMMIT, for a device call that runs an old bench beside today's tree — e.g. the
# certification at an earlier commit to bisect a moved gate (`CERT_TREE=.scratch/at-e514bc0 tools/device_checks.sh
# cert-at`; KNOWLEDGE/findings/fp8-rung6-flips-rose-between-s28-and-s31.md). Carry .scratch as usual.
#
#   tools/tree_at.sh e514bc0        # -> .scratch/at-e514bc0
set -euo pipefail
commit=${1:?usage: tools/tree_at.sh COMMIT}
cd "$(dirname "$0")/.."
full=$(git rev-parse --verify "$commit^{commit}")
dest=.scratch/at-$commit
rm -rf "$dest" && mkdir -p "$dest"
paths=()
for p in src bench tools oracle tests/fixtures; do
  git cat-file -e "$full:$p" 2>/dev/null && paths+=("$p")
done
git archive "$full" "${paths[@]}" | tar -x -C "$dest"
echo "$full" > "$dest/COMMIT"
echo "$dest: $(du -sh "$dest" | cut -f1) at $full"
