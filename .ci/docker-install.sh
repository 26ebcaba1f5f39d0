#!/usr/bin/env bash
# Install the Docker Engine users run: dockerd >= 26 with the containerd image store and the
# buildx plugin (>= 0.13), from Debian's own packages.
#   - Debian 13 (trixie): its own docker.io, docker-cli, docker-buildx, containerd.
#   - Debian 12 (bookworm): those four packages from Debian 13's suite, apt-pinned at priority
#     100 so nothing else moves; libc and runc stay Debian 12's (trixie's runc needs glibc 2.38,
#     and dockerd 26 runs containers with bookworm's runc 1.1.5).
# The trixie source reuses the Debian mirror this machine's apt already uses (read from its
# sources), so no host name is written here.
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

. /etc/os-release
export DEBIAN_FRONTEND=noninteractive
packages=(docker.io docker-cli docker-buildx containerd)
case "${VERSION_CODENAME:-}" in
    trixie|forky|sid)
        say "Debian ${VERSION_ID:-$VERSION_CODENAME}: installing its own ${packages[*]}"
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${packages[@]}"
        ;;
    bookworm)
        # The Debian mirror apt already uses (deb822 or one-line sources), never a fixed host.
        mirror=$( (grep -rhoE 'https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null || true) \
            | grep -v -- '-security' | head -n 1 | tr -d ' ')
        if [ -z "$mirror" ]; then
            say "no Debian mirror found in /etc/apt/sources.list*; add one for bookworm first" >&2
            exit 1
        fi
        say "Debian 12: ${packages[*]} from Debian 13's suite at $mirror (pinned; nothing else moves)"
        cat >/etc/apt/sources.list.d/imagebuilder-trixie.sources <<EOF
Types: deb
URIs: $mirror
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
        cat >/etc/apt/preferences.d/imagebuilder-trixie <<EOF
Package: *
Pin: release n=trixie
Pin-Priority: 100
EOF
        apt-get update -qq
        # pkg/trixie picks only these four from trixie; their dependencies (libc, runc: trixie's
        # runc needs glibc 2.38) stay bookworm's. `-t trixie` would upgrade libc, dpkg, base-files.
        apt-get install -y -qq --no-install-recommends "${packages[@]/%//trixie}"
        ;;
    *)
        say "unsupported OS ${PRETTY_NAME:-unknown}: install Docker >= $min_major with buildx yourself" >&2
        exit 1
        ;;
esac

# The containerd image store: zstd pulls, cache export and attestations with buildx's docker driver.
mkdir -p /etc/docker
if [ ! -s /etc/docker/daemon.json ]; then
    echo '{"features": {"containerd-snapshotter": true}}' >/etc/docker/daemon.json
fi
# The package's service may have started a daemon; docker-up.sh starts ours in the foreground log.
systemctl stop docker.service docker.socket >/dev/null 2>&1 || true
say "installed: $(dockerd --version); buildx $(/usr/libexec/docker/cli-plugins/docker-buildx version | cut -d' ' -f2)"
