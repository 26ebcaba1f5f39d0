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
# Idempotent: does nothing when the installed binary was built from these inputs: main.go, the
# suite's Go and its snapshotter library (their versions, in the stamp), and still answers.
# Every step says its name when it fails (a failed download is not a Go import error later).
# Usage: .ci/stargz-install.sh        (root)
# env STARGZ_BIN, STARGZ_STAMP: where the binary and its stamp go (defaults below); the suite
# builds into a temp dir with them, to run the first install's path beside the installed daemon.
set -euo pipefail

say() { echo "stargz-install: $*"; }
step() {  # step NAME CMD...: run CMD; on failure, one line naming the step, and stop
    local name=$1
    shift
    local status=0
    "$@" || status=$?
    if [ "$status" -ne 0 ]; then
        say "step '$name' failed (exit $status): $*" >&2
        exit 1
    fi
}

src="$(cd "$(dirname "$0")" && pwd)/stargz-grpc/main.go"
bin=${STARGZ_BIN:-/usr/local/bin/containerd-stargz-grpc}
stamp=${STARGZ_STAMP:-/usr/local/share/imagebuilder/containerd-stargz-grpc.sha256}
library=golang-github-containerd-stargz-snapshotter-dev

# The library's version apt would install (apt-cache rebuilds its cache: ~5 s, so read once).
candidate=$(apt-cache policy "$library" | awk '/Candidate:/{print $2}')
inputs() {  # what the binary is built from: main.go, the Go toolchain, the library's version
    sha256sum "$src" | cut -d' ' -f1
    if command -v go >/dev/null 2>&1; then go version; else echo "no go"; fi
    echo "$library $candidate"
}

answers() {  # the installed daemon serves containerd's snapshots API on a socket of its own
    local dir pid out status
    dir=$(mktemp -d /tmp/stargz-check.XXXXXX)
    "$bin" -address "$dir/s.sock" -root "$dir/root" >"$dir/log" 2>&1 &
    pid=$!
    for _ in $(seq 1 50); do [ -S "$dir/s.sock" ] && break; sleep 0.1; done
    # An empty snapshotter answers List with its own error ("bucket does not exist"): that is an
    # answer; a transport error (no socket, refused, timeout) is not.
    out=$(timeout 10 ctr -a "$dir/s.sock" snapshots --snapshotter stargz ls 2>&1) && status=0 || status=$?
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    rm -rf "$dir"
    if [ "$status" -eq 0 ] || { echo "$out" | grep -q "bucket does not exist" \
            && ! echo "$out" | grep -qiE "connection refused|no such file|deadline|transport"; }; then
        return 0
    fi
    say "$bin does not answer containerd's snapshots API: $out" >&2
    return 1
}

want=$(inputs | sha256sum | cut -d' ' -f1)
if [ -x "$bin" ] && [ "$(cat "$stamp" 2>/dev/null || true)" = "$want" ] && answers; then
    say "$bin already built from $(basename "$(dirname "$src")")/main.go, $(go version | cut -d' ' -f3) and" \
        "$candidate; it answers"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    say "installing containerd-stargz-grpc needs root; run this script as root" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
step "apt-get update" apt-get update -qq
candidate=$(apt-cache policy "$library" | awk '/Candidate:/{print $2}')  # the stamp's, after the update
# The suite's own Go (a pinned trixie source on Debian 12 has priority 100: never chosen here).
command -v go >/dev/null 2>&1 || step "install the suite's Go (golang-go)" apt-get install -y -qq --no-install-recommends golang-go
work=$(mktemp -d /tmp/stargz-build.XXXXXX)
trap 'rm -rf "$work"' EXIT
# The -dev packages apt would install for the library (the ones installed already are in
# /usr/share/gocode): one provider each, as apt resolves them.
step "resolve the library's Go sources ($library)" apt-get install -s --no-install-recommends "$library" >"$work/resolved"
mapfile -t devs < <(awk '/^Inst /{print $2}' "$work/resolved" | grep -E -- '-dev$' || true)
say "building $bin with $(go version | cut -d' ' -f3) against ${#devs[@]} Debian -dev packages' sources"
mkdir -p "$work/debs" "$work/root" "$work/gopath/src/stargzgrpc"
chmod 0755 "$work" && chmod 0777 "$work/debs"  # apt downloads as _apt where it can
if [ "${#devs[@]}" -gt 0 ]; then
    (cd "$work/debs" && step "download the library's Go sources (${#devs[@]} -dev packages)" \
        apt-get download -qq "${devs[@]}")
fi
for deb in "$work"/debs/*.deb; do
    [ -e "$deb" ] || continue
    step "unpack $(basename "$deb")" dpkg-deb -x "$deb" "$work/root"
done
cp "$src" "$work/gopath/src/stargzgrpc/main.go"
# GOPATH mode, as Debian builds Go: every import from the unpacked sources, nothing fetched.
(cd "$work/gopath/src/stargzgrpc" \
    && GO111MODULE=off GOFLAGS='' GOPROXY=off GOCACHE="$work/cache" \
       GOPATH="$work/gopath:$work/root/usr/share/gocode:/usr/share/gocode" \
       step "go build" go build -trimpath -o "$work/containerd-stargz-grpc" .)
step "install $bin" install -D -m 0755 "$work/containerd-stargz-grpc" "$bin"
step "check that the built daemon answers" answers
mkdir -p "$(dirname "$stamp")"
inputs | sha256sum | cut -d' ' -f1 >"$stamp"
say "installed $bin ($(go version -m "$bin" | head -1 | awk '{print $2}')); it answers containerd's snapshots API"
