#!/usr/bin/env bash
# Prints the documentation files that `make install` and the .deb ship under
# share/doc/conlock/, as paths relative to the repository: README.md and every file its
# relative links reach, following the links of each Markdown page in turn (a link to a
# directory ships the files in it). Installed in the same layout, so the links work there.
set -euo pipefail
cd "$(dirname "$0")/.."
declare -A seen=()
queue=(README.md)
while ((${#queue[@]})); do
  f=${queue[0]}
  queue=("${queue[@]:1}")
  [ -n "${seen[$f]:-}" ] && continue
  seen[$f]=1
  case $f in *.md) ;; *) continue ;; esac
  dir=$(dirname "$f")
  # Targets of inline links [text](target), without an #anchor; not URLs or anchors alone.
  while IFS= read -r target; do
    target=${target%%#*}
    case $target in '' | *://* | mailto:*) continue ;; esac
    path=$(realpath -m --relative-to=. "$dir/$target")
    if [ -d "$path" ]; then
      for g in "$path"/*; do [ -f "$g" ] && queue+=("$g"); done
    elif [ -f "$path" ]; then
      queue+=("$path")
    else
      echo "doc-files: $f links to $target, which does not exist" >&2
      exit 1
    fi
  done < <(grep -oE '\]\([^) ]+\)' "$f" | sed -E 's/^\]\(//; s/\)$//')
done
printf '%s\n' "${!seen[@]}" | LC_ALL=C sort
