#!/usr/bin/env bash
# `make install DESTDIR=… PREFIX=/usr` lays out exactly the binary, the man pages, the
# bash/zsh/fish completions where man and the shells look, and the documentation under
# share/doc/conlock/ (scripts/doc-files.sh, the same files and layout as the .deb); `make uninstall` removes them
# all; without PREFIX everything goes under /usr/local.
set -euo pipefail
cd "$(dirname "$0")/.."
make=${MAKE:-make}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "install-check: $*" >&2; exit 1; }

files_under() { (cd "$1" && find . \( -type f -o -type l \) | sed 's|^\.||' | LC_ALL=C sort); }

expected() { # $1 = prefix
  {
    echo "$1/bin/conlock"
    for m in docs/*.1; do echo "$1/share/man/man1/$(basename "$m")"; done
    echo "$1/share/bash-completion/completions/conlock"
    echo "$1/share/zsh/site-functions/_conlock"
    echo "$1/share/fish/vendor_completions.d/conlock.fish"
    bash scripts/doc-files.sh | sed "s|^|$1/share/doc/conlock/|"
  } | LC_ALL=C sort
}

stage=$tmp/stage
$make --no-print-directory -s install DESTDIR="$stage" PREFIX=/usr >/dev/null
diff -u <(expected /usr) <(files_under "$stage") || fail "PREFIX=/usr: the installed files differ from the expected list (- expected, + installed)"

[ -x "$stage/usr/bin/conlock" ] || fail "/usr/bin/conlock is not executable"
"$stage/usr/bin/conlock" --version | grep -q '^conlock ' || fail "the installed binary does not run"
for m in docs/*.1; do
  cmp -s "$m" "$stage/usr/share/man/man1/$(basename "$m")" || fail "$m was not installed as is"
done
cmp -s completions/conlock.bash "$stage/usr/share/bash-completion/completions/conlock" || fail "bash completion differs"
cmp -s completions/_conlock "$stage/usr/share/zsh/site-functions/_conlock" || fail "zsh completion differs"
cmp -s completions/conlock.fish "$stage/usr/share/fish/vendor_completions.d/conlock.fish" || fail "fish completion differs"
for f in $(bash scripts/doc-files.sh); do
  cmp -s "$f" "$stage/usr/share/doc/conlock/$f" || fail "$f was not installed as is"
done
for f in $(files_under "$stage"); do
  mode=$(stat -c %a "$stage$f")
  case $f in
    */bin/conlock) want=755 ;;
    *) want=644 ;;
  esac
  [ "$mode" = "$want" ] || fail "$f has mode $mode, expected $want"
done

$make --no-print-directory -s uninstall DESTDIR="$stage" PREFIX=/usr >/dev/null
left=$(files_under "$stage")
[ -z "$left" ] || fail "make uninstall left files behind: $left"

default=$tmp/default
$make --no-print-directory -s install DESTDIR="$default" >/dev/null
diff -u <(expected /usr/local) <(files_under "$default") || fail "default PREFIX: the installed files differ from the expected list"

echo "install-check: $(expected /usr | wc -l) files installed under PREFIX=/usr and /usr/local, uninstall removed them all"
