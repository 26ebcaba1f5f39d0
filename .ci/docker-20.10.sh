#!/usr/bin/env bash
# Debian 12's Docker Engine 20.10 (docker.io from bookworm), unpacked into DIR, never installed:
# tests/test_dual_compression.py starts its dockerd in a network namespace of its own (as
# tests/remote_engine.py does) to check what an engine without zstd pulls. The running Docker
# and its packages stay as they are (dpkg -x only writes DIR).
# Usage: .ci/docker-20.10.sh [DIR]   prints DIR/usr/sbin/dockerd on its last line
# DIR defaults to /opt/imagebuilder/docker-20.10. Idempotent: a DIR that has dockerd is kept.
set -euo pipefail

dir="${1:-/opt/imagebuilder/docker-20.10}"
say() { echo "docker-20.10: $*" >&2; }

if [ -x "$dir/usr/sbin/dockerd" ]; then
    echo "$dir/usr/sbin/dockerd"
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say "downloading docker.io from bookworm"
if ! (cd "$work" && apt-get download -qq docker.io/bookworm) 2>"$work/err"; then
    say "apt has no bookworm docker.io yet; updating its lists"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    (cd "$work" && apt-get download -qq docker.io/bookworm)
fi
deb=$(find "$work" -name 'docker.io_20.10*.deb' -print -quit)
if [ -z "$deb" ]; then
    say "bookworm's docker.io is not 20.10 here: $(find "$work" -name '*.deb')"
    exit 1
fi
rm -rf "$dir.tmp"
mkdir -p "$dir.tmp"
dpkg -x "$deb" "$dir.tmp"
rm -rf "$dir"
mv "$dir.tmp" "$dir"
say "unpacked $(basename "$deb") into $dir"
echo "$dir/usr/sbin/dockerd"
