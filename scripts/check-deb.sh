#!/usr/bin/env bash
# The .deb from `make deb` holds exactly: the binary, the man pages (gzipped, as Debian
# wants), bash/zsh/fish completions, the documentation (scripts/doc-files.sh: README.md
# and every file its links reach, in the repository's layout, so the links resolve), the
# license (copyright) and Debian's changelog; all owned by root with the right modes; the
# maintainer has an address; its binary is the release build given ($2), linked as the
# Makefile chose ($3: static or dynamic), and runs; the man pages name only pages and
# documentation files that the package holds.
set -euo pipefail
cd "$(dirname "$0")/.."
deb=$1
release_bin=$2
kind=$3
fail() { echo "deb-check: $*" >&2; exit 1; }
command -v dpkg-deb >/dev/null || fail "dpkg-deb not found: install dpkg (apt-get install dpkg)"
command -v readelf >/dev/null || fail "readelf not found: install binutils (apt-get install binutils)"
[ -f "$deb" ] || fail "$deb was not built"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
[ "$(dpkg-deb -f "$deb" Package)" = conlock ] || fail "Package is not conlock"
[ "$(dpkg-deb -f "$deb" Version)" = "$version-1" ] || fail "Version is not $version-1"

{
  echo "-rwxr-xr-x 0/0 ./usr/bin/conlock"
  for m in docs/*.1; do echo "-rw-r--r-- 0/0 ./usr/share/man/man1/$(basename "$m").gz"; done
  echo "-rw-r--r-- 0/0 ./usr/share/bash-completion/completions/conlock"
  echo "-rw-r--r-- 0/0 ./usr/share/zsh/site-functions/_conlock"
  echo "-rw-r--r-- 0/0 ./usr/share/fish/vendor_completions.d/conlock.fish"
  bash scripts/doc-files.sh | sed 's|^|-rw-r--r-- 0/0 ./usr/share/doc/conlock/|'
  echo "-rw-r--r-- 0/0 ./usr/share/doc/conlock/copyright"
  echo "-rw-r--r-- 0/0 ./usr/share/doc/conlock/changelog.Debian.gz"
} | LC_ALL=C sort >"$tmp/expected"
# Mode, owner and path of every entry that is not a directory.
dpkg-deb -c "$deb" | awk '$1 !~ /^d/ { print $1, $2, $6 }' | LC_ALL=C sort >"$tmp/actual"
diff -u "$tmp/expected" "$tmp/actual" || fail "the package's files differ from the expected list (- expected, + packaged)"

dpkg-deb -x "$deb" "$tmp/root"
cmp -s "$tmp/root/usr/bin/conlock" "$release_bin" || fail "the packaged binary is not $release_bin"
# A dynamic (glibc) binary needs libc6; the static musl one needs nothing.
headers=$(readelf -l "$release_bin") || fail "readelf cannot read $release_bin"
if grep -q 'program interpreter' <<<"$headers"; then linked=dynamic; else linked=static; fi
[ "$linked" = "$kind" ] || fail "$release_bin is $linked, but the Makefile built a $kind binary"
case $kind in
  dynamic) dpkg-deb -f "$deb" Depends | grep -q libc6 || fail "Depends does not name libc6 (dynamic binary)" ;;
  static) [ -z "$(dpkg-deb -f "$deb" Depends)" ] || fail "Depends is not empty for a static binary: $(dpkg-deb -f "$deb" Depends)" ;;
  *) fail "usage: check-deb.sh DEB RELEASE_BIN static|dynamic" ;;
esac
"$tmp/root/usr/bin/conlock" --version | grep -qx "conlock $version" || fail "the packaged binary does not print 'conlock $version'"
for m in docs/*.1; do
  gzip -dc "$tmp/root/usr/share/man/man1/$(basename "$m").gz" | cmp -s - "$m" || fail "$m differs in the package"
done
grep -q "Mozilla Public License Version 2.0" "$tmp/root/usr/share/doc/conlock/copyright" || fail "copyright lacks the license text"
doc=$tmp/root/usr/share/doc/conlock
for f in $(bash scripts/doc-files.sh); do
  cmp -s "$f" "$doc/$f" || fail "$f differs in the package"
done
# Every relative link of a packaged page resolves inside the package.
for page in $(cd "$doc" && find . -name '*.md'); do
  while IFS= read -r target; do
    target=${target%%#*}
    case $target in '' | *://* | mailto:*) continue ;; esac
    [ -e "$doc/$(dirname "$page")/$target" ] || fail "${page#./} links to $target, which the package lacks"
  done < <(grep -oE '\]\([^) ]+\)' "$doc/$page" | sed -E 's/^\]\(//; s/\)$//')
done
maintainer=$(dpkg-deb -f "$deb" Maintainer)
[[ $maintainer =~ ^[^\<]+\ \<[^@\>\ ]+@[^@\>\ ]+\>$ ]] || fail "Maintainer is not 'Name <address>': $maintainer"
changelog=$(gzip -dc "$doc/changelog.Debian.gz")
head -n1 <<<"$changelog" | grep -q "^conlock ($version-1) " || fail "changelog.Debian does not start with conlock ($version-1): update contrib/debian/changelog"
grep -qF " -- $maintainer  " <<<"$changelog" || fail "changelog.Debian is not signed by the Maintainer ($maintainer)"
# The man pages point only at what is installed: pages of the package, files in it.
for m in "$tmp"/root/usr/share/man/man1/*.gz; do
  # Without font changes and with plain hyphens.
  text=$(gzip -dc "$m" | sed 's/\\f[BIRP]//g; s/\\-/-/g')
  for ref in $(grep -oE 'conlock(-[a-z-]+)?\(1\)' <<<"$text" | sed 's/(1)$//' | sort -u); do
    [ -f "$tmp/root/usr/share/man/man1/$ref.1.gz" ] || fail "$(basename "$m") names $ref(1), which the package lacks"
  done
  for path in $(grep -oE '/usr/share/doc/conlock/[^ ]+' <<<"$text" | sed 's/[),.;]*$//' | sort -u); do
    [ -e "$tmp/root$path" ] || fail "$(basename "$m") names $path, which the package lacks"
  done
done
echo "deb-check: $(basename "$deb") holds the $(wc -l <"$tmp/expected") expected files"
