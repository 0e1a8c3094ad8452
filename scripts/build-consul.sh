#!/usr/bin/env bash
# Builds a `consul` binary from a Consul source tree you already have (for
# `make test-real CONSUL_BIN=...`). It downloads nothing: the tree must vendor its
# dependencies (vendor/, as Consul's tags up to 1.4 do), and it is built in GOPATH mode
# (GO111MODULE=off) from a copy, so your tree is never modified.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: scripts/build-consul.sh CONSUL_SOURCE_TREE OUTPUT_BINARY

Builds Consul from CONSUL_SOURCE_TREE (a checkout or unpacked source archive of a
Consul release with a vendor/ directory, e.g. v1.0.8 or v1.4.0) into OUTPUT_BINARY,
then prints its `version`. Needs only a Go toolchain (Go 1.19 built 1.0.8 and 1.4.0);
nothing is downloaded. The tree is copied (without .git) into a temporary GOPATH,
removed afterwards. Where the tree lacks the generated web-UI assets
(agent/bindata_assetfs.go), the copy gets a stand-in that serves no UI; the HTTP API
and `consul lock` are unaffected.

Environment:
  GIT_DESCRIBE  version stamp (default v<Version in version/version.go>), as Consul's
                GNUmakefile sets it; without it `consul version` says "-dev"
  GIT_COMMIT    commit stamp (default none)
  TMPDIR        where the temporary GOPATH goes (default /tmp)

Then: make test-real CONSUL_BIN=OUTPUT_BINARY
EOF
}

case "${1:-}" in -h | --help) usage; exit 0 ;; esac
if [ $# -ne 2 ]; then
    usage >&2
    exit 2
fi
SRC=$1
OUT=$2
die() { echo "build-consul.sh: $*" >&2; exit 1; }

[ -d "$SRC" ] || die "$SRC is not a directory (give the Consul source tree)"
SRC=$(cd "$SRC" && pwd)
[ -f "$SRC/main.go" ] && [ -f "$SRC/version/version.go" ] \
    || die "$SRC does not look like a Consul source tree (no main.go or version/version.go)"
[ -d "$SRC/vendor" ] \
    || die "$SRC has no vendor/ directory: this script builds without downloading, so the dependencies must be vendored (Consul 1.4 and earlier)"
command -v go >/dev/null || die "no go toolchain on PATH"
case "$OUT" in /*) ;; *) OUT="$PWD/$OUT" ;; esac
mkdir -p "$(dirname "$OUT")"

GP=$(mktemp -d "${TMPDIR:-/tmp}/build-consul.XXXXXX")
trap 'rm -rf "$GP"' EXIT
TREE=$GP/src/github.com/hashicorp/consul
mkdir -p "$TREE"
tar -C "$SRC" --exclude=./.git -cf - . | tar -C "$TREE" -xf -

# Some source snapshots lack this generated file (made by go-bindata from the UI build).
ASSET=$TREE/agent/bindata_assetfs.go
if [ ! -f "$ASSET" ]; then
    echo "build-consul.sh: agent/bindata_assetfs.go is missing; using a stand-in without UI files" >&2
    cat >"$ASSET" <<'EOF'
// Stand-in for the go-bindata generated web UI assets (not present in this
// source snapshot). The built-in web UI serves nothing; everything else works.

package agent

import (
	"fmt"
	"os"

	assetfs "github.com/elazarl/go-bindata-assetfs"
)

// Asset returns an error: no UI assets are embedded.
func Asset(name string) ([]byte, error) {
	return nil, fmt.Errorf("Asset %s not found (UI assets not embedded)", name)
}

// MustAsset panics: no UI assets are embedded.
func MustAsset(name string) []byte {
	a, err := Asset(name)
	if err != nil {
		panic("asset: Asset(" + name + "): " + err.Error())
	}
	return a
}

// AssetInfo returns an error: no UI assets are embedded.
func AssetInfo(name string) (os.FileInfo, error) {
	return nil, fmt.Errorf("AssetInfo %s not found (UI assets not embedded)", name)
}

// AssetNames returns an empty list.
func AssetNames() []string { return nil }

// AssetDir returns an error: no UI assets are embedded.
func AssetDir(name string) ([]string, error) {
	return nil, fmt.Errorf("AssetDir %s not found (UI assets not embedded)", name)
}

func assetFS() *assetfs.AssetFS {
	return &assetfs.AssetFS{Asset: Asset, AssetDir: AssetDir, AssetInfo: AssetInfo, Prefix: "pkg/web_ui"}
}
EOF
fi

# The version stamp Consul's GNUmakefile sets (-X version.GitDescribe / GitCommit).
VER=$(sed -n 's/^[[:space:]]*Version = "\(.*\)"/\1/p' "$TREE/version/version.go" | head -n1)
GIT_DESCRIBE=${GIT_DESCRIBE:-v$VER}
GIT_IMPORT=github.com/hashicorp/consul/version
LDFLAGS="-X $GIT_IMPORT.GitDescribe=$GIT_DESCRIBE"
if [ -n "${GIT_COMMIT:-}" ]; then
    LDFLAGS="$LDFLAGS -X $GIT_IMPORT.GitCommit=$GIT_COMMIT"
fi

start=$(date +%s)
# GOPATH mode resolves imports from vendor/ and GOPATH only; GOPROXY=off and
# GOTOOLCHAIN=local make sure no module or toolchain is fetched either way.
(cd "$TREE" && env GOPATH="$GP" GO111MODULE=off GOFLAGS= GOPROXY=off GOTOOLCHAIN=local \
    CGO_ENABLED=0 go build -ldflags "$LDFLAGS" -o "$OUT" .)
echo "build-consul.sh: built $OUT in $(($(date +%s) - start))s" >&2
"$OUT" version
