#!/usr/bin/env bash
# Make the tool image that runs Podman 5 (Debian 13's, containers/storage 1.57) for the tests:
# tests/test_podman5_partial.py pulls zstd:chunked layers with it, as containers/storage's
# newest reader, in a privileged container. Debian 12 cannot install it (it needs libc6 >= 2.38).
# The image: BASE (Debian 13) + podman, trusting CA_FILE (a PEM bundle: this site's proxy CA) as
# SSL_CERT_FILE, which Go's TLS (Podman's) reads; update-ca-certificates would skip a bundle.
# Idempotent: does nothing when NAME:TAG exists and was made by this script as it is now (its
# hash in a label: a changed script makes the image again).
# Usage: .ci/podman5-image.sh NAME:TAG BASE CA_FILE
# env PODMAN5_PACKAGES: the packages to install (default "podman"; the first-install test gives
# a small one: the make path, not Debian's package, is what it checks).
set -euo pipefail

say() { echo "podman5-image: $*"; }

if [ $# -ne 3 ]; then
    echo "usage: $0 NAME:TAG BASE CA_FILE" >&2
    exit 2
fi

made_as() {  # made_as IMAGE: the script hash in IMAGE's label ("" when IMAGE is missing)
    local image=$1
    docker image inspect --format '{{index .Config.Labels "imagebuilder.ci.podman5-image"}}' "$image" 2>/dev/null || true
}

make_image() {
    local image=$1 base=$2 ca=$3 packages=${PODMAN5_PACKAGES:-podman} hash old cid log tmp
    hash=$( (cat "$0"; echo "$packages") | sha256sum | cut -d' ' -f1)
    if [ "$(made_as "$image")" = "$hash" ]; then
        say "$image already made by this script; nothing to do"
        return
    fi
    if ! docker image inspect "$base" >/dev/null 2>&1; then
        say "$base is missing: .ci/setup --tests makes it (.ci/base-image.sh)" >&2
        return 1
    fi
    if [ ! -r "$ca" ]; then
        say "cannot read the CA file $ca" >&2
        return 1
    fi
    old=$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
    say "making $image from $base: $packages (Debian's packages, ~1 min)"
    # A container of the base, committed: no builder at all, so neither BuildKit's cache (the
    # CI's image builds own it) nor the classic builder's step images (left dangling in the
    # containerd store) are touched.
    cid=$(docker create --label org.imagebuilder.run=1 -e DEBIAN_FRONTEND=noninteractive "$base" sh -c \
        "apt-get update -qq && apt-get install -y -qq --no-install-recommends $packages >/dev/null \
         && rm -rf /var/lib/apt/lists/*")
    tmp=$(mktemp -d /tmp/podman5-image.XXXXXX)
    # shellcheck disable=SC2064 # both are known now; EXIT: set -e exits before a RETURN trap would run
    trap "docker rm -f '$cid' >/dev/null 2>&1 || true; rm -rf '$tmp'" EXIT
    # As a tar stream: the minbase has no /etc/ssl, which `docker cp FILE` would need.
    mkdir -p "$tmp/etc/ssl" && cp "$ca" "$tmp/etc/ssl/imagebuilder-ca-bundle.crt"
    tar -C "$tmp" -c etc | docker cp - "$cid:/" >/dev/null
    if ! log=$(docker start --attach "$cid" 2>&1); then
        say "installing $packages in a container of $base failed:" >&2
        tail -n 30 <<<"$log" >&2
        return 1
    fi
    docker commit --change "ENV SSL_CERT_FILE=/etc/ssl/imagebuilder-ca-bundle.crt" \
        --change "LABEL imagebuilder.ci.podman5-image=$hash" --change 'CMD ["bash"]' "$cid" "$image" >/dev/null
    if [ -n "$old" ] && [ "$old" != "$(docker image inspect --format '{{.Id}}' "$image")" ]; then
        docker rmi "$old" >/dev/null 2>&1 || true  # the image this one replaces (made by an older script)
    fi
    say "$image ready: $(docker run --rm "$image" sh -c 'command -v podman >/dev/null && podman --version || echo "no podman"')"
}

make_image "$@"
