#!/usr/bin/env bash
# Make sure a Docker Engine answers on this machine; start one when none does.
# Idempotent: does nothing when `docker info` already answers.
# Usage: .ci/docker-up.sh            (env DOCKERD_WAIT_S: seconds to wait, default 60)
set -euo pipefail

wait_s="${DOCKERD_WAIT_S:-60}"
log=/tmp/dockerd.log
sock=/var/run/docker.sock

say() { echo "docker-up: $*"; }

if docker info >/dev/null 2>&1; then
    say "Docker Engine already answers ($(docker version --format '{{.Server.Version}}'))"
    exit 0
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
say "Docker Engine $(docker version --format '{{.Server.Version}}') answers on $sock (storage driver $(docker info --format '{{.Driver}}'))"
