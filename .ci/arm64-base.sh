#!/usr/bin/env bash
# Create a minimal Debian arm64 base image without any registry, runnable here under QEMU.
# `docker import` records the host's platform, so the rootfs goes in through a BuildKit
# `FROM scratch` + `ADD rootfs.tar /` built with --platform linux/arm64, which records arm64.
# With NATIVE (this host's base of the same suite), NAME:TAG is a multi-platform image, as
# real bases are (Debian's, Ubuntu's, nvidia/cuda's): linux/arm64 from the rootfs, linux/amd64
# NATIVE's image, so that a cross build's native-wheels stage (`FROM --platform=$BUILDPLATFORM`)
# finds this host's variant of the same OS.
# Idempotent: does nothing when NAME:TAG already exists (with NATIVE: with both platforms).
# Usage: .ci/arm64-base.sh NAME:TAG [SUITE [NATIVE]]      (SUITE: bookworm (default), trixie, ...)
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 3 ]; then
    echo "usage: $0 NAME:TAG [SUITE [NATIVE]]" >&2
    exit 2
fi
image="$1"
suite="${2:-bookworm}"
native="${3:-}"

say() { echo "arm64-base: $*"; }

# On an amd64 host a multi-platform image inspects as amd64; the arm64-only one as arm64.
if docker image inspect "$image" >/dev/null 2>&1 \
        && { [ -z "$native" ] || [ "$(docker image inspect --format '{{.Architecture}}' "$image")" != arm64 ]; }; then
    say "$image already exists ($(docker image inspect --format '{{.Id}} {{.Architecture}}' "$image")); nothing to do"
    exit 0
fi

bash "$(dirname "$0")/qemu.sh"

work="$(mktemp -d /tmp/arm64-base.XXXXXX)"
aside="$image-arm64-only-$$"
trap 'rm -rf "$work"; docker rmi "$aside" >/dev/null 2>&1 || true' EXIT
rootfs="$work/rootfs"
if docker image inspect "$image" >/dev/null 2>&1; then
    # An arm64-only image of an earlier setup: its rootfs is reused, not debootstrapped again.
    say "$image is arm64 only: adding $native's linux/amd64 to it"
    docker tag "$image" "$aside"
    printf 'FROM %s AS base-arm64\n' "$aside" >"$work/Dockerfile"
else
    say "debootstrap --arch=arm64 --variant=minbase $suite (under qemu-aarch64, ~2.5 min)"
    debootstrap --arch=arm64 --variant=minbase "$suite" "$rootfs" >/tmp/arm64-base-debootstrap.log 2>&1 || {
        say "debootstrap failed; last lines of /tmp/arm64-base-debootstrap.log:" >&2
        tail -n 30 /tmp/arm64-base-debootstrap.log >&2
        exit 1
    }
    rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
    tar -C "$rootfs" -cf "$work/rootfs.tar" .
    rm -rf "$rootfs"
    cat >"$work/Dockerfile" <<'DOCKERFILE'
FROM scratch AS base-arm64
ADD rootfs.tar /
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
CMD ["bash"]
DOCKERFILE
fi
platforms=linux/arm64
if [ -n "$native" ]; then
    # ARM64_BASE_WAIT_S: how long to wait for NATIVE, made beside this by .ci/setup.
    waited=0
    until docker image inspect "$native" >/dev/null 2>&1; do
        [ "$waited" -lt "${ARM64_BASE_WAIT_S:-0}" ] || { say "$native (NATIVE) does not exist" >&2; exit 1; }
        [ $((waited % 15)) -ne 0 ] || say "waiting for $native (${waited}s)"
        sleep 3; waited=$((waited + 3))
    done
    printf 'FROM %s AS base-amd64\nFROM base-${TARGETARCH}\n' "$native" >>"$work/Dockerfile"
    platforms=linux/amd64,linux/arm64
fi

say "importing the rootfs as $image ($platforms)"
# /usr/bin/docker: Debian's 20.10 CLI has BuildKit built in; a newer CLI first on PATH may not.
docker_cli=/usr/bin/docker
[ -x "$docker_cli" ] || docker_cli=docker
docker rmi "$image" >/dev/null 2>&1 || true  # an arm64-only one of an earlier setup
DOCKER_BUILDKIT=1 "$docker_cli" buildx build --progress=plain --platform "$platforms" \
    --output "type=image,name=$image" "$work" >/tmp/arm64-base-build.log 2>&1 || {
    say "the image build failed; last lines of /tmp/arm64-base-build.log:" >&2
    tail -n 30 /tmp/arm64-base-build.log >&2
    exit 1
}

say "checking that the image runs under QEMU"
docker run --rm --platform linux/arm64 "$image" uname -m | grep -qx aarch64 \
    || { say "$image does not run as aarch64 here" >&2; exit 1; }
if [ -n "$native" ]; then
    docker run --rm --platform linux/amd64 "$image" uname -m | grep -qx x86_64 \
        || { say "$image has no linux/amd64 variant" >&2; exit 1; }
else
        arch="$(docker image inspect --format '{{.Os}}/{{.Architecture}}' "$image")"
        [ "$arch" = "linux/arm64" ] || { say "$image records $arch, not linux/arm64" >&2; exit 1; }
fi
say "$image ready: $(docker image inspect --format '{{.Id}} {{.Size}} bytes' "$image")"
