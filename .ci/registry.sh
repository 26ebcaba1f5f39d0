#!/usr/bin/env bash
# Run Debian's docker-registry on 127.0.0.1:PORT, in the background, with its own config
# and storage in a temp dir, so tests can push without any remote registry.
# Docker treats 127.0.0.0/8 as an insecure registry by default: no daemon config needed.
# Usage: .ci/registry.sh start [PORT]   prints the address (127.0.0.1:PORT) on its last line
#        .ci/registry.sh stop  [PORT]   stops it and removes its storage
# PORT defaults to 5000. Idempotent: start on a running registry and stop on a stopped one do nothing.
set -euo pipefail

usage() { echo "usage: $0 start|stop [PORT]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
action="$1"
port="${2:-5000}"
case "$port" in ''|*[!0-9]*) usage ;; esac

state="${TMPDIR:-/tmp}/imagebuilder-registry-$port"
pidfile="$state/registry.pid"
log="$state/registry.log"
bin=/usr/bin/docker-registry
wait_s="${REGISTRY_WAIT_S:-30}"

say() { echo "registry: $*" >&2; }

running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

start() {
    if running; then
        say "already running on 127.0.0.1:$port (pid $(cat "$pidfile"))"
        echo "127.0.0.1:$port"
        return
    fi
    if [ ! -x "$bin" ]; then
        say "installing docker-registry"
        DEBIAN_FRONTEND=noninteractive apt-get update
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends docker-registry
    fi
    mkdir -p "$state/data"
    # Debian's /etc/docker/registry/config.yml listens on :5000 with htpasswd auth;
    # ours listens on loopback only, without auth, with storage we can throw away.
    cat >"$state/config.yml" <<YAML
version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: $state/data
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$port
YAML
    say "starting $bin on 127.0.0.1:$port (state in $state, log in $log)"
    setsid nohup "$bin" serve "$state/config.yml" >"$log" 2>&1 </dev/null &
    echo $! >"$pidfile"
    local deadline=$((SECONDS + wait_s))
    until curl -fsS "http://127.0.0.1:$port/v2/" >/dev/null 2>&1; do
        if ! running || [ "$SECONDS" -ge "$deadline" ]; then
            say "registry did not answer on http://127.0.0.1:$port/v2/ within ${wait_s}s; last lines of $log:"
            tail -n 20 "$log" >&2 || true
            stop
            exit 1
        fi
        sleep 0.2
    done
    say "answering on http://127.0.0.1:$port/v2/"
    echo "127.0.0.1:$port"
}

stop() {
    if running; then
        local pid
        pid="$(cat "$pidfile")"
        say "stopping pid $pid on 127.0.0.1:$port"
        kill "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null || true
    else
        say "not running on 127.0.0.1:$port"
    fi
    rm -rf "$state"
}

case "$action" in
    start) start ;;
    stop) stop ;;
    *) usage ;;
esac
