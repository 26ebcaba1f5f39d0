#!/usr/bin/env bash
# Make sure a Docker Engine the tests can use answers on this machine (Docker >= 26 with the
# buildx plugin); start one when none does, and refuse one that is older or lacks buildx
# (a Docker 20.10 answers too, and every BuildKit test would fail later for it).
# Idempotent: only checks when a suitable engine already answers.
# Usage: .ci/docker-up.sh            (env DOCKERD_WAIT_S: seconds to wait, default 60)
set -euo pipefail

wait_s="${DOCKERD_WAIT_S:-60}"
log=/tmp/dockerd.log
sock=/var/run/docker.sock
min_major=26

say() { echo "docker-up: $*"; }

suitable() {  # the answering engine is Docker >= $min_major and the CLI has buildx; else say why
    local version major buildx
    version=$(docker version --format '{{.Server.Version}}')
    major=${version%%.*}
    case $major in ''|*[!0-9]*) major=0 ;; esac
    if [ "$major" -lt "$min_major" ]; then
        say "the Docker Engine answering on this machine is $version; the tests need Docker >= $min_major" \
            "(.ci/docker-install.sh installs it): stop that engine, or run CI on a machine without one" >&2
        return 1
    fi
    if ! buildx=$(docker buildx version 2>&1); then
        say "Docker $version answers but the docker CLI has no buildx plugin ($buildx); the tests need it" \
            "(.ci/docker-install.sh installs docker-buildx)" >&2
        return 1
    fi
    say "Docker Engine $version answers on $sock (storage driver $(docker info --format '{{.Driver}}')); $buildx"
}

if docker info >/dev/null 2>&1; then
    say "a Docker Engine already answers"
    suitable
    exit
fi

if [ "$(id -u)" -ne 0 ]; then
    say "no Docker Engine answers and starting one needs root; run this script as root" >&2
    exit 1
fi

bash "$(dirname "$0")/docker-install.sh"

if pgrep -x dockerd >/dev/null 2>&1; then
    say "dockerd is already running (pid $(pgrep -x dockerd | head -1)); waiting for it"
else
    say "starting dockerd in the background, log in $log"
    # setsid: a Ctrl-C in the calling terminal must not take the daemon down with it
    setsid nohup dockerd >"$log" 2>&1 </dev/null &
    echo $! >/tmp/dockerd.pid
fi

deadline=$((SECONDS + wait_s))
until [ -S "$sock" ] && docker info >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        say "dockerd did not answer on $sock within ${wait_s}s; last lines of $log:" >&2
        tail -n 30 "$log" >&2 || true
        exit 1
    fi
    sleep 1
done
suitable
