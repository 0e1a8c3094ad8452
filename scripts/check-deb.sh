#!/usr/bin/env bash
# The .deb from `make deb` holds exactly: the binary, the man pages (gzipped, as Debian
# wants), bash/zsh/fish completions, README, guide, systemd examples and the license
# (copyright); all owned by root with the right modes; and its binary is the release
# build given ($2), linked as the Makefile chose ($3: static or dynamic), and runs.
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
  echo "-rw-r--r-- 0/0 ./usr/share/doc/conlock/README.md"
  echo "-rw-r--r-- 0/0 ./usr/share/doc/conlock/guide.md"
  echo "-rw-r--r-- 0/0 ./usr/share/doc/conlock/copyright"
  for u in contrib/systemd/*; do echo "-rw-r--r-- 0/0 ./usr/share/doc/conlock/examples/systemd/$(basename "$u")"; done
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
echo "deb-check: $(basename "$deb") holds the $(wc -l <"$tmp/expected") expected files"
