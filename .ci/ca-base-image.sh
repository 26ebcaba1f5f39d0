#!/usr/bin/env bash
# Derive a base image whose CA store trusts a site's CA, as corporate mirrors of ubuntu/debian
# images do: imagebuilder then needs no --ca-bundle and builds in a single stage.
# Idempotent: does nothing when NAME:TAG already exists.
# Usage: .ci/ca-base-image.sh NAME:TAG BASE_IMAGE CA_FILE
set -euo pipefail
if [ $# -ne 3 ]; then
    echo "usage: $0 NAME:TAG BASE_IMAGE CA_FILE" >&2
    exit 2
fi
image="$1" base="$2" ca="$3"
if docker image inspect "$image" >/dev/null 2>&1; then
    echo "ca-base-image: $image already exists; nothing to do"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$ca" "$tmp/site-ca.crt"
# ca-certificates' update-ca-certificates adds /usr/local/share/ca-certificates/*.crt to the
# system bundle when the package is installed in a build.
printf 'FROM %s\nCOPY site-ca.crt /usr/local/share/ca-certificates/site-ca.crt\n' "$base" >"$tmp/Dockerfile"
DOCKER_BUILDKIT=0 docker build --quiet --tag "$image" "$tmp" >/dev/null
echo "ca-base-image: created $image from $base trusting $ca"
