#!/usr/bin/env bash
# Generates completions/ and the man pages docs/*.1 from the CLI, or checks they did not drift.
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
pages="conlock.1"
for sub in run sem status watch break dev-server; do
  "$bin" man "$sub" >"$tmp/conlock-$sub.1"
  pages="$pages conlock-$sub.1"
done
if [ "$mode" = write ]; then
  mkdir -p completions docs
  cp "$tmp"/conlock.bash "$tmp"/_conlock "$tmp"/conlock.fish "$tmp"/conlock.elv "$tmp"/_conlock.ps1 completions/
  for p in $pages; do cp "$tmp/$p" "docs/$p"; done
  echo "completions/ and docs/*.1 regenerated"
  exit 0
fi
status=0
for f in conlock.bash _conlock conlock.fish conlock.elv _conlock.ps1; do
  if ! cmp -s "$tmp/$f" "completions/$f"; then
    echo "completions/$f is out of date with the CLI: run 'make completions'" >&2
    status=1
  fi
done
for p in $pages; do
  if ! cmp -s "$tmp/$p" "docs/$p"; then
    echo "docs/$p is out of date with the CLI: run 'make completions'" >&2
    status=1
  fi
done
[ "$status" = 0 ] && echo "completions and man page match the CLI"
exit "$status"
