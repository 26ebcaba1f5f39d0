#!/usr/bin/env bash
# Install Debian packages at their Debian 13 (trixie) versions, moving nothing else:
#   - Debian 13 (trixie) and later: the release's own packages.
#   - Debian 12 (bookworm): the packages from Debian 13's suite, apt-pinned at priority 100 and
#     asked for as pkg/trixie, so that only they come from trixie; their dependencies (libc,
#     runc: trixie's runc needs glibc 2.38) stay bookworm's. `-t trixie` would upgrade libc,
#     dpkg and base-files: never use it here.
# The trixie source reuses the Debian mirror this machine's apt already uses (read from its
# sources), so no host name is written here.
# Usage: .ci/trixie-packages.sh NAME PKG...   (root; NAME prefixes the messages)
set -euo pipefail

name="$1"
shift
say() { echo "$name: $*"; }

. /etc/os-release
export DEBIAN_FRONTEND=noninteractive
case "${VERSION_CODENAME:-}" in
    trixie|forky|sid)
        say "Debian ${VERSION_ID:-$VERSION_CODENAME}: installing its own $*"
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "$@"
        ;;
    bookworm)
        # The Debian mirror apt already uses (deb822 or one-line sources), never a fixed host.
        mirror=$( (grep -rhoE 'https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null || true) \
            | grep -v -- '-security' | head -n 1 | tr -d ' ')
        if [ -z "$mirror" ]; then
            say "no Debian mirror found in /etc/apt/sources.list*; add one for bookworm first" >&2
            exit 1
        fi
        say "Debian 12: $* from Debian 13's suite at $mirror (pinned; nothing else moves)"
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
        apt-get install -y -qq --no-install-recommends "${@/%//trixie}"
        ;;
    *)
        say "unsupported OS ${PRETTY_NAME:-unknown}: install $* (Debian 13's versions or later) yourself" >&2
        exit 1
        ;;
esac
