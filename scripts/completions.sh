#!/usr/bin/env bash
# Generates completions/ and docs/conlock.1 from the CLI, or checks they did not drift.
set -euo pipefail
bin=$1
mode=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin" completions bash >"$tmp/conlock.bash"
"$bin" completions zsh >"$tmp/_conlock"
"$bin" completions fish >"$tmp/conlock.fish"
"$bin" completions elvish >"$tmp/conlock.elv"
"$bin" completions powershell >"$tmp/_conlock.ps1"
"$bin" man >"$tmp/conlock.1"
if [ "$mode" = write ]; then
  mkdir -p completions docs
  cp "$tmp"/conlock.bash "$tmp"/_conlock "$tmp"/conlock.fish "$tmp"/conlock.elv "$tmp"/_conlock.ps1 completions/
  cp "$tmp/conlock.1" docs/conlock.1
  echo "completions/ and docs/conlock.1 regenerated"
  exit 0
fi
status=0
for f in conlock.bash _conlock conlock.fish conlock.elv _conlock.ps1; do
  if ! cmp -s "$tmp/$f" "completions/$f"; then
    echo "completions/$f is out of date with the CLI: run 'make completions'" >&2
    status=1
  fi
done
if ! cmp -s "$tmp/conlock.1" docs/conlock.1; then
  echo "docs/conlock.1 is out of date with the CLI: run 'make completions'" >&2
  status=1
fi
[ "$status" = 0 ] && echo "completions and man page match the CLI"
exit "$status"
