#!/usr/bin/env bash
# A clone has nothing beside it: fails if a tracked file refers to the reference material
# outside the repository (the tests read their copy under tests/fixtures/).
set -euo pipefail
cd "$(dirname "$0")/.."
self=scripts/check-selfcontained.sh
pattern='\.\./shared|/work/shared'
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  files=$(git ls-files)
else
  files=$(find . -path ./target -prune -o -path ./.git -prune -o -type f -print | sed 's|^\./||')
fi
hits=$(printf '%s\n' "$files" | grep -vxF "$self" | tr '\n' '\0' | xargs -0 grep -nIE "$pattern" -- || true)
if [ -n "$hits" ]; then
  echo "these lines point outside the repository; use tests/fixtures/ instead:" >&2
  echo "$hits" >&2
  exit 1
fi
echo "self-contained: no file refers to material outside the repository"
