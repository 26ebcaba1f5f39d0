#!/usr/bin/env bash
# Install cosign (>= 2.5) from Debian's own packages: `publish --sign-key` signs with it and
# `verify --key` checks with it.
#   - Debian 13 (trixie) and later: its own `cosign` package.
#   - Debian 12 (bookworm): Debian 13's `cosign` (a static Go binary: it depends only on libc6,
#     which bookworm's 2.36 satisfies) from the trixie source docker-install.sh adds, picked by
#     cosign/trixie so that nothing else moves.
# Idempotent: does nothing when cosign >= 2.5 is installed.
# Usage: .ci/cosign-install.sh        (root)
set -euo pipefail

say() { echo "cosign-install: $*"; }

# Debian's build reports `GitVersion: devel`: the package's version is the one to read.
installed() { dpkg-query -W -f='${Version}' cosign 2>/dev/null || true; }
have_cosign() {
    command -v cosign >/dev/null 2>&1 || return 1
    local v
    v=$(installed)
    [ -n "$v" ] && dpkg --compare-versions "$v" ge 2.5
}

if have_cosign; then
    say "cosign $(installed) already installed"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    say "installing cosign needs root; run this script as root" >&2
    exit 1
fi

. /etc/os-release
export DEBIAN_FRONTEND=noninteractive
case "${VERSION_CODENAME:-}" in
    trixie|forky|sid)
        say "Debian ${VERSION_ID:-$VERSION_CODENAME}: installing its own cosign"
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends cosign
        ;;
    bookworm)
        if [ ! -s /etc/apt/sources.list.d/imagebuilder-trixie.sources ]; then
            say "no trixie source: run .ci/docker-install.sh first (it adds the pinned one)" >&2
            exit 1
        fi
        say "Debian 12: cosign from Debian 13's suite (pinned; nothing else moves)"
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends cosign/trixie
        ;;
    *)
        say "unsupported OS ${PRETTY_NAME:-unknown}: install cosign >= 2.5 yourself" >&2
        exit 1
        ;;
esac
say "installed: cosign $(installed)"
