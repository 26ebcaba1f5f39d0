#!/usr/bin/env bash
# Benchmark: what the images' entrypoint (tini + the sh script) adds to `docker run IMAGE python -c 1`.
#   bench/bench_entrypoint.sh IMAGE [RUNS]
# Runs the same python either through the image's ENTRYPOINT or with --entrypoint python3
# (neither tini nor the script) and prints mean and median per arm. Uses hyperfine when
# installed (Debian: apt-get install hyperfine), else a loop that alternates the two arms so
# that a busy host slows both alike. Reports; never judges (exits 0).
set -euo pipefail
image="${1:?usage: $0 IMAGE [RUNS]}"
runs="${2:-30}"
with=(docker run --rm "$image" python3 -c 1)
without=(docker run --rm --entrypoint python3 "$image" -c 1)

if command -v hyperfine >/dev/null 2>&1; then
    report="$(mktemp)"
    trap 'rm -f "$report"' EXIT
    hyperfine --warmup 3 --runs "$runs" --style none -N --export-json "$report" \
        --command-name "with entrypoint" "${with[*]}" \
        --command-name "without (--entrypoint python3)" "${without[*]}"
    python3 - "$report" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print(f"{r['command']:32} mean {r['mean'] * 1000:6.1f} ms  median {r['median'] * 1000:6.1f} ms  sd {r['stddev'] * 1000:5.1f} ms")
PY
    exit 0
fi

declare -A total=()
for ((i = 0; i < runs; i++)); do
    for arm in with without; do
        declare -n cmd="$arm"
        start=$(date +%s%N)
        "${cmd[@]}" >/dev/null
        total[$arm]=$(( ${total[$arm]:-0} + $(date +%s%N) - start ))
    done
done
for arm in with without; do
    echo "$arm entrypoint: mean $(( total[$arm] / runs / 1000000 )) ms over $runs runs"
done
