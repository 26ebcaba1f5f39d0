#!/usr/bin/env bash
# Create a minimal Debian arm64 base image without any registry, runnable here under QEMU.
# `docker import` records the host's platform, so the rootfs goes in through a BuildKit
# `FROM scratch` + `ADD rootfs.tar /` built with --platform linux/arm64, which records arm64.
# Idempotent: does nothing when NAME:TAG already exists.
# Usage: .ci/arm64-base.sh NAME:TAG [SUITE]      (SUITE: bookworm (default), trixie, ...)
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: $0 NAME:TAG [SUITE]" >&2
    exit 2
fi
image="$1"
suite="${2:-bookworm}"

say() { echo "arm64-base: $*"; }

if docker image inspect "$image" >/dev/null 2>&1; then
    say "$image already exists ($(docker image inspect --format '{{.Id}} {{.Architecture}}' "$image")); nothing to do"
    exit 0
fi

bash "$(dirname "$0")/qemu.sh"

work="$(mktemp -d /tmp/arm64-base.XXXXXX)"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"

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
FROM scratch
ADD rootfs.tar /
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
CMD ["bash"]
DOCKERFILE

say "importing the rootfs as $image (linux/arm64)"
# /usr/bin/docker: Debian's 20.10 CLI has BuildKit built in; a newer CLI first on PATH may not.
docker_cli=/usr/bin/docker
[ -x "$docker_cli" ] || docker_cli=docker
DOCKER_BUILDKIT=1 "$docker_cli" build --progress=plain --platform linux/arm64 --tag "$image" "$work" \
    >/tmp/arm64-base-build.log 2>&1 || {
    say "the image build failed; last lines of /tmp/arm64-base-build.log:" >&2
    tail -n 30 /tmp/arm64-base-build.log >&2
    exit 1
}

arch="$(docker image inspect --format '{{.Os}}/{{.Architecture}}' "$image")"
[ "$arch" = "linux/arm64" ] || { say "$image records $arch, not linux/arm64" >&2; exit 1; }
say "checking that the image runs under QEMU"
docker run --rm --platform linux/arm64 "$image" uname -m | grep -qx aarch64 \
    || { say "$image does not run as aarch64 here" >&2; exit 1; }
say "$image ready: $(docker image inspect --format '{{.Id}} {{.Size}} bytes' "$image")"
