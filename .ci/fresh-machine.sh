#!/usr/bin/env bash
# Time the README's first command on a fresh machine: a throwaway privileged container of the
# local Debian 12 base (with what a Debian 12 cloud image has: python3, ca-certificates, curl,
# iproute2, procps; and this site's CA bundle), holding a clean clone of REV. Inside it,
# `bash .ci/setup` installs Docker (its own dockerd, its storage in a folder of WORK), makes the
# venv from PyPI and debootstraps the base; then the main job builds. Nothing is cached.
# The container has a network namespace of its own, not the host's docker0 bridge: --network
# none, then a veth pair to this host, NATed out (its own iptables rules, removed after), so its
# dockerd makes its own docker0 that no other daemon sees.
# Usage: .ci/fresh-machine.sh [REV]      (root; REV defaults to HEAD; prints the two timings)
# Everything it made (the container, its image, the veth, the rules, WORK) is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -le 1 ] || { echo "usage: $0 [REV]" >&2; exit 2; }
rev=$(git rev-parse --verify "${1:-HEAD}^{commit}")

say() { echo "fresh-machine: $*"; }
tag=$(head -c 3 /dev/urandom | od -An -tx1 | tr -d ' \n')
name="ib-fresh-$tag" image="ib-fresh-machine:$tag" host_if="ibfh$tag" ns_if="ibfn$tag"
subnet="10.214.$((16#${tag:0:2})).0"
host_ip="${subnet%.0}.1" ns_ip="${subnet%.0}.2"
work=$(mktemp -d "/tmp/ib-fresh-$tag.XXXXXX")
rules=(
    "-t nat -A POSTROUTING -s $subnet/30 ! -o $host_if -j MASQUERADE"
    "-I DOCKER-USER -i $host_if -j ACCEPT"
    "-I DOCKER-USER -o $host_if -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT"
)
cleanup() {
    local rule undo
    docker rm -f "$name" >/dev/null 2>&1 || true
    docker rmi "$image" >/dev/null 2>&1 || true
    for rule in "${rules[@]}"; do
        undo=${rule/-A /-D }
        # shellcheck disable=SC2086  # a rule is words
        iptables ${undo/-I /-D } 2>/dev/null || true
    done
    ip link del "$host_if" 2>/dev/null || true
    # The inner engine's last mounts can outlive `docker rm` by a moment.
    rm -rf "$work" 2>/dev/null || { sleep 5; rm -rf "$work"; }
}
trap cleanup EXIT

say "the machine: imagebuilder-base:bookworm + python3, ca-certificates, curl, iproute2, procps, this site's CA"
cp "${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" "$work/ca-bundle.crt"
cat >"$work/Dockerfile" <<'DOCKERFILE'
FROM imagebuilder-base:bookworm
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        python3 ca-certificates curl iproute2 procps >/dev/null && rm -rf /var/lib/apt/lists/*
COPY ca-bundle.crt /etc/ssl/certs/ca-certificates.crt
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
DOCKERFILE
DOCKER_BUILDKIT=0 docker build --quiet --tag "$image" "$work" >/dev/null
git clone --quiet --no-local "$PWD" "$work/repo"
git -C "$work/repo" checkout --quiet "$rev"
mkdir -p "$work/docker" "$work/containerd"

say "starting $name (privileged, --network none; Docker's and containerd's storage in $work)"
docker run -d --name "$name" --privileged --network none \
    -v "$work/repo:/repo" -v "$work/docker:/var/lib/docker" -v "$work/containerd:/var/lib/containerd" \
    "$image" sleep infinity >/dev/null
pid=$(docker inspect --format '{{.State.Pid}}' "$name")
ip link add "$host_if" type veth peer name "$ns_if"
ip link set "$ns_if" netns "$pid"
ip addr add "$host_ip/30" dev "$host_if"
ip link set "$host_if" up
nsenter --net="/proc/$pid/ns/net" sh -c "ip addr add $ns_ip/30 dev $ns_if && ip link set $ns_if up \
    && ip route add default via $host_ip"
for rule in "${rules[@]}"; do
    # shellcheck disable=SC2086  # a rule is words
    iptables $rule
done
grep '^nameserver' /etc/resolv.conf | docker exec -i "$name" sh -c 'cat >/etc/resolv.conf'

say "timing, inside it: bash .ci/setup, then the main job (README.md)"
# shellcheck disable=SC2016  # expanded inside the machine
docker exec "$name" bash -c 'cd /repo && s=$SECONDS && bash .ci/setup && setup=$((SECONDS - s)) \
    && .venv/bin/imagebuilder build --torch 2.6 --cuda 12.1 --os debian12 --base-image imagebuilder-base:bookworm \
       ${SSL_CERT_FILE:+--ca-bundle "$SSL_CERT_FILE"} \
    && echo "fresh-machine: setup ${setup}s, build $((SECONDS - s - setup))s, the first command $((SECONDS - s))s"'
