#!/usr/bin/env bash
# Install cosign (>= 2.5) from Debian's own packages: `publish --sign-key` signs with it and
# `verify --key` checks with it.
# Debian 13's `cosign` (trixie-packages.sh; a static Go binary that depends only on libc6,
# which Debian 12's 2.36 satisfies).
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

bash "$(dirname "$0")/trixie-packages.sh" cosign-install cosign
say "installed: cosign $(installed)"
