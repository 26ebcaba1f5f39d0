#!/usr/bin/env bash
# Create a minimal Debian base image without any registry: debootstrap + docker import.
# Idempotent: does nothing when NAME:TAG already exists.
# Usage: .ci/base-image.sh NAME:TAG [SUITE]      (SUITE: bookworm (default), trixie, ...)
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: $0 NAME:TAG [SUITE]" >&2
    exit 2
fi
image="$1"
suite="${2:-bookworm}"

say() { echo "base-image: $*"; }

if docker image inspect "$image" >/dev/null 2>&1; then
    say "$image already exists ($(docker image inspect --format '{{.Id}}' "$image")); nothing to do"
    exit 0
fi

if ! command -v debootstrap >/dev/null 2>&1; then
    say "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends debootstrap
fi

rootfs="$(mktemp -d /tmp/base-image.XXXXXX)"
trap 'rm -rf "$rootfs"' EXIT

say "debootstrap --variant=minbase $suite into $rootfs"
debootstrap --variant=minbase "$suite" "$rootfs" >/tmp/base-image-debootstrap.log 2>&1 || {
    say "debootstrap failed; last lines of /tmp/base-image-debootstrap.log:" >&2
    tail -n 30 /tmp/base-image-debootstrap.log >&2
    exit 1
}
# An image needs no apt lists or package caches; docker-import keeps what the tree holds.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb

say "importing $rootfs as $image"
tar -C "$rootfs" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["bash"]' \
    --message "debootstrap --variant=minbase $suite" \
    - "$image"

say "checking that apt-get works inside $image"
docker run --rm "$image" bash -c \
    'apt-get update -qq && apt-get install -y -qq --no-install-recommends ca-certificates >/dev/null && echo apt-ok' \
    | grep -q apt-ok || { say "apt-get update/install failed inside $image" >&2; exit 1; }

say "$image ready: $(docker image inspect --format '{{.Id}} {{.Size}} bytes' "$image")"
