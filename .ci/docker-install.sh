#!/usr/bin/env bash
# Install the Docker Engine users run: dockerd >= 26 with the containerd image store and the
# buildx plugin (>= 0.13), from Debian's own packages.
# docker.io, docker-cli, docker-buildx and containerd at Debian 13's versions (trixie-packages.sh:
# on Debian 12 only these four move; libc and runc stay Debian 12's, and dockerd 26 runs
# containers with bookworm's runc 1.1.5).
# Idempotent: does nothing when dockerd >= 26 and the buildx plugin are installed.
# Usage: .ci/docker-install.sh        (root)
set -euo pipefail

say() { echo "docker-install: $*"; }

min_major=26
have_major() {
    command -v dockerd >/dev/null 2>&1 || return 1
    local v
    v=$(dockerd --version 2>/dev/null | sed -nE 's/^Docker version ([0-9]+)\..*/\1/p')
    [ -n "$v" ] && [ "$v" -ge "$min_major" ]
}
have_buildx() { [ -x /usr/libexec/docker/cli-plugins/docker-buildx ]; }

if have_major && have_buildx; then
    say "dockerd $(dockerd --version | cut -d' ' -f3 | tr -d ,) and buildx already installed"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    say "installing Docker needs root; run this script as root" >&2
    exit 1
fi

bash "$(dirname "$0")/trixie-packages.sh" docker-install docker.io docker-cli docker-buildx containerd

# The containerd image store: zstd pulls, cache export and attestations with buildx's docker driver.
mkdir -p /etc/docker
if [ ! -s /etc/docker/daemon.json ]; then
    echo '{"features": {"containerd-snapshotter": true}}' >/etc/docker/daemon.json
fi
# The package's service may have started a daemon; docker-up.sh starts ours in the foreground log.
systemctl stop docker.service docker.socket >/dev/null 2>&1 || true
say "installed: $(dockerd --version); buildx $(/usr/libexec/docker/cli-plugins/docker-buildx version | cut -d' ' -f2)"
