#!/usr/bin/env bash
# Install containerd-stargz-grpc, the stargz snapshotter's daemon that the lazy-pull engine of
# tests/remote_engine.py runs (eStargz images pulled lazily: layers mounted over FUSE, files
# fetched from the registry when read).
# Debian ships no build of it: its stargz-snapshotter package holds ctr-remote only (Debian 12's
# 0.12.0 and Debian 13's 0.14.3 alike). So it is built here, from .ci/stargz-grpc/main.go, with
# the host's own Debian suite's Go (golang-go) against that suite's Go sources of the
# snapshotter's library (golang-github-containerd-stargz-snapshotter-dev and the -dev packages
# apt resolves for it). Those sources are downloaded and unpacked in a temp dir, not installed:
# installing them would pull ~270 packages into the system (and move systemd's).
# Idempotent: does nothing when the installed binary was built from this main.go.
# Usage: .ci/stargz-install.sh        (root)
set -euo pipefail

say() { echo "stargz-install: $*"; }

src="$(cd "$(dirname "$0")" && pwd)/stargz-grpc/main.go"
bin=/usr/local/bin/containerd-stargz-grpc
stamp=/usr/local/share/imagebuilder/containerd-stargz-grpc.sha256
want=$(sha256sum "$src" | cut -d' ' -f1)

if [ -x "$bin" ] && [ "$(cat "$stamp" 2>/dev/null || true)" = "$want" ]; then
    say "$bin already built from $(basename "$(dirname "$src")")/main.go"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    say "installing containerd-stargz-grpc needs root; run this script as root" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# The suite's own Go (a pinned trixie source on Debian 12 has priority 100: never chosen here).
command -v go >/dev/null 2>&1 || apt-get install -y -qq --no-install-recommends golang-go
work=$(mktemp -d /tmp/stargz-build.XXXXXX)
trap 'rm -rf "$work"' EXIT
# The -dev packages apt would install for the library (the ones installed already are in
# /usr/share/gocode): one provider each, as apt resolves them.
mapfile -t devs < <(apt-get install -s --no-install-recommends golang-github-containerd-stargz-snapshotter-dev \
    | awk '/^Inst /{print $2}' | grep -E -- '-dev$')
say "building $bin with $(go version | cut -d' ' -f3) against ${#devs[@]} Debian -dev packages' sources"
mkdir -p "$work/debs" "$work/root" "$work/gopath/src/stargzgrpc"
(cd "$work/debs" && apt-get download -qq "${devs[@]}" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$work/root"; done
cp "$src" "$work/gopath/src/stargzgrpc/main.go"
# GOPATH mode, as Debian builds Go: every import from the unpacked sources, nothing fetched.
(cd "$work/gopath/src/stargzgrpc" \
    && GO111MODULE=off GOFLAGS= GOPROXY=off GOCACHE="$work/cache" \
       GOPATH="$work/gopath:$work/root/usr/share/gocode:/usr/share/gocode" \
       go build -trimpath -o "$work/containerd-stargz-grpc" .)
install -m 0755 "$work/containerd-stargz-grpc" "$bin"
mkdir -p "$(dirname "$stamp")"
echo "$want" >"$stamp"
say "installed $bin"
