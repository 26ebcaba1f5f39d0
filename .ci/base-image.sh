#!/usr/bin/env bash
# Create a minimal Debian base image without any registry: debootstrap + docker import.
# Idempotent: does nothing when NAME:TAG already exists.
# Usage: .ci/base-image.sh NAME:TAG [SUITE]      (SUITE: bookworm (default), trixie, ...)
# env BASE_IMAGE_WAIT_S: when no engine answers yet (.ci/setup installs and starts one beside
# this), debootstrap anyway and wait up to that many seconds for it before the import (default
# 0); BASE_IMAGE_GIVE_UP_IF: a file whose appearance means no engine will come (stop waiting).
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: $0 NAME:TAG [SUITE]" >&2
    exit 2
fi
image="$1"
suite="${2:-bookworm}"

say() { echo "base-image: $*"; }
exists() {
    if docker image inspect "$image" >/dev/null 2>&1; then
        say "$image already exists ($(docker image inspect --format '{{.Id}}' "$image")); nothing to do"
        return 0
    fi
    return 1
}
engine_answers() {  # wait up to BASE_IMAGE_WAIT_S for the engine, saying so every 15 s
    local waited=0
    until docker info >/dev/null 2>&1; do
        if [ "$waited" -ge "${BASE_IMAGE_WAIT_S:-0}" ] \
                || { [ -n "${BASE_IMAGE_GIVE_UP_IF:-}" ] && [ -e "$BASE_IMAGE_GIVE_UP_IF" ]; }; then
            say "no Docker Engine answers (waited ${waited}s): cannot import $image" >&2
            return 1
        fi
        [ $((waited % 15)) -ne 0 ] || say "waiting for the Docker Engine to answer (${waited}s)"
        sleep 1
        waited=$((waited + 1))
    done
}

if docker info >/dev/null 2>&1 && exists; then
    exit 0
fi

if ! command -v debootstrap >/dev/null 2>&1; then
    say "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends debootstrap
fi

rootfs="$(mktemp -d /tmp/base-image.XXXXXX)"
log="$rootfs.log"  # kept where debootstrap fails
trap 'rm -rf "$rootfs"' EXIT

say "debootstrap --variant=minbase $suite into $rootfs (~1 min)"
debootstrap --variant=minbase "$suite" "$rootfs" >"$log" 2>&1 || {
    say "debootstrap failed; last lines of $log:" >&2
    tail -n 30 "$log" >&2
    exit 1
}
rm -f "$log"
# An image needs no apt lists or package caches; docker-import keeps what the tree holds.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb

engine_answers
if exists; then  # made meanwhile, or in the engine's store before it answered
    exit 0
fi

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
