#!/usr/bin/env bash
# Benchmark: what the images' entrypoint (tini + the sh script) adds to `docker run IMAGE python -c 1`.
#   bench/bench_entrypoint.sh IMAGE [RUNS]
# Runs the same python either through the image's ENTRYPOINT or with --entrypoint python3
# (neither tini nor the script) and prints mean and median per arm. Uses hyperfine when
# installed (Debian: apt-get install hyperfine), else a loop that alternates the two arms so
# that a busy host slows both alike (BENCH_LOOP=1 picks the loop). Reports; never judges.
set -euo pipefail
image="${1:?usage: $0 IMAGE [RUNS]}"
runs="${2:-30}"
with=(docker run --rm "$image" python3 -c 1)
without=(docker run --rm --entrypoint python3 "$image" -c 1)

if [ -z "${BENCH_LOOP:-}" ] && command -v hyperfine >/dev/null 2>&1; then
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

times="$(mktemp)"
trap 'rm -f "$times"' EXIT
for ((i = 0; i < runs; i++)); do
    for arm in with without; do
        declare -n cmd="$arm"
        start=$(date +%s%N)
        "${cmd[@]}" >/dev/null
        echo "$arm $(( $(date +%s%N) - start ))" >> "$times"
    done
done
python3 - "$times" <<'PY'
import statistics, sys
arms = {}
for line in open(sys.argv[1]):
    arm, ns = line.split()
    arms.setdefault(arm, []).append(int(ns) / 1e6)
for arm, ms in arms.items():
    print(f"{arm + ' entrypoint':32} mean {statistics.mean(ms):6.1f} ms  median {statistics.median(ms):6.1f} ms  ({len(ms)} runs, alternating)")
PY
