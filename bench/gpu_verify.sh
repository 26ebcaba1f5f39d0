#!/usr/bin/env bash
# The GPU proof of the smoke tests, prepared for a GPU machine without Docker (the device
# tool's H200: PyTorch and Triton installed, nothing reachable, 15 minutes of device time
# in all, at most 10 minutes a command).
#
# Each check runs in its own `python -m smoke_tests --checks NAME` process under its own
# limit, so one hung check costs its limit, not the run; the total stays well under the
# machine's per-command limit; and every result is written the moment its check finishes
# (checks/NAME.json, and verify.json rebuilt from them), so a run cut short still brings
# back everything that finished.
#
# Usage: OUT=DIR bash bench/gpu_verify.sh
# Environment (defaults): GPU_VERIFY_CHECK_S=120 (one check's limit), GPU_VERIFY_TOTAL_S=420
# (all checks), GPU_VERIFY_CHECKS=environment,cuda,nccl,compile,cuda_graph,
# GPU_VERIFY_GPU_FLAG=--require-gpu (--allow-no-gpu for a dry run on a CPU host),
# GPU_VERIFY_PYTHON=python3.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-.}"
per_check="${GPU_VERIFY_CHECK_S:-120}"
total="${GPU_VERIFY_TOTAL_S:-420}"
checks="${GPU_VERIFY_CHECKS:-environment,cuda,nccl,compile,cuda_graph}"
gpu_flag="${GPU_VERIFY_GPU_FLAG:---require-gpu}"
python="${GPU_VERIFY_PYTHON:-python3}"
# A check killed with SIGTERM gets this long to go before SIGKILL.
kill_after=5
# smoke_tests' own deadline sits this far inside the process limit, so that a slow check
# reports itself (with its reason) before the process is killed from outside.
inner_margin=20
mkdir -p "$out/checks"
started=$SECONDS

# Host facts first, each under a limit of its own: a wedged driver must not stall the run.
{
    echo "# nvidia-smi"
    timeout -k 5 20 nvidia-smi --query-gpu=name,driver_version,compute_cap,compute_mode,mig.mode.current,pci.bus_id \
        --format=csv 2>&1 || echo "nvidia-smi: exit $?"
    echo "# torch and the driver as smoke_tests reads them (ctypes, no torch driver API)"
    timeout -k 5 60 "$python" - <<'PY' 2>&1 || echo "facts: exit $?"
import json, torch
from smoke_tests import driver
try:
    import triton
    triton_version = triton.__version__
except Exception as e:  # the compile check will say what this costs
    triton_version = f"not importable: {e}"
devices, error = driver.devices()
print(json.dumps({
    "torch": torch.__version__, "torch_cuda": torch.version.cuda, "triton": triton_version,
    "gpu_count": torch.cuda.device_count(),
    "cuda_driver_version": driver.cuda_driver_version(), "display_driver_version": driver.display_driver_version(),
    "devices": [d.__dict__ for d in devices], "devices_error": error, "mig": driver.mig_devices(devices),
}, indent=2))
PY
} | tee "$out/facts.txt"

# verify.json from whatever checks/*.json exist, replaced atomically after every check.
combine() {
    "$python" - "$out" "$checks" <<'PY'
import json, os, sys
sys.path.insert(0, ".")
from smoke_tests.report import ok
from smoke_tests.result import Result
out, order = sys.argv[1], sys.argv[2].split(",")
results = []
for name in order:
    path = os.path.join(out, "checks", f"{name}.json")
    if os.path.exists(path):
        with open(path) as handle:
            results += [Result.from_dict(check) for check in json.load(handle)["checks"]]
document = {"ok": ok(results) and len(results) == len(order), "checks": [r.to_dict() for r in results],
            "pending": [name for name in order if name not in {r.name for r in results}]}
with open(os.path.join(out, "verify.json.tmp"), "w") as handle:
    json.dump(document, handle, indent=2)
os.replace(os.path.join(out, "verify.json.tmp"), os.path.join(out, "verify.json"))
PY
}

# A result for a check that could not report one itself (killed, crashed, not run).
verdict() {  # name status reason
    "$python" - "$@" <<'PY'
import json, sys
name, status, reason = sys.argv[1:4]
print(json.dumps({"checks": [{"name": name, "status": status, "reason": reason, "measurements": {}}]}))
PY
}

for check in ${checks//,/ }; do
    result="$out/checks/$check.json"
    left=$(( total - (SECONDS - started) ))
    if (( left < 10 )); then
        verdict "$check" fail "not run: the run's total limit of ${total}s is spent" >"$result"
        combine
        continue
    fi
    limit=$(( per_check < left ? per_check : left ))
    inner=$(( limit > inner_margin + 5 ? limit - inner_margin : limit / 2 ))
    echo "== $check (limit ${limit}s, $(( SECONDS - started ))s into the run)"
    check_started=$SECONDS
    timeout -k "$kill_after" "$limit" "$python" -m smoke_tests --json "$gpu_flag" --checks "$check" \
        --timeout "$inner" >"$result.part" 2>"$out/checks/$check.err"
    status=$?
    if (( status == 124 || status == 137 )); then
        verdict "$check" fail "killed at the check's limit of ${limit}s (exit $status): it hung" >"$result"
    elif ! "$python" -c 'import json, sys; json.load(open(sys.argv[1]))["checks"]' "$result.part" 2>/dev/null; then
        verdict "$check" fail "exited $status without a report: $(tail -n 1 "$out/checks/$check.err")" >"$result"
    else
        mv "$result.part" "$result"
    fi
    rm -f "$result.part"
    combine
    "$python" - "$result" "$(( SECONDS - check_started ))" <<'PY'
import json, sys
for check in json.load(open(sys.argv[1]))["checks"]:
    print(f"{check['name']}: {check['status'].upper()} in {sys.argv[2]}s: {check['reason']}")
    for key, value in check["measurements"].items():
        print(f"    {key}: {json.dumps(value)}")
PY
done

"$python" - "$out/verify.json" <<'PY'
import json, sys
sys.path.insert(0, ".")
from smoke_tests.report import format_table
from smoke_tests.result import Result
doc = json.load(open(sys.argv[1]))
print(format_table([Result.from_dict(check) for check in doc["checks"]]))
PY
echo "total ${SECONDS}s of ${total}s; results in $out/verify.json and $out/checks/"
"$python" -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1]))["ok"] else 1)' "$out/verify.json"
