#!/usr/bin/env bash
# The GPU proof of the smoke tests, in one prepared run for a GPU machine without Docker
# (the device tool's H200 has torch and Triton, and no network): `imagebuilder verify
# --local` when imagebuilder's own dependencies import there, else the smoke tests directly
# with GPUs required. Writes the JSON report to ${OUT:-.}/verify.json and prints the table.
# Usage: bash bench/gpu_verify.sh [TIMEOUT_S]
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-.}"
timeout_s="${1:-600}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
if python3 -c "import click, jinja2, yaml, packaging, docker" 2>/dev/null; then
    python3 -m imagebuilder verify --local --json --timeout "$timeout_s" >"$out/verify.json"
    status=$?
else
    echo "imagebuilder's dependencies are missing here; running the smoke tests directly"
    python3 -m smoke_tests --json --require-gpu --timeout "$timeout_s" >"$out/verify.json"
    status=$?
fi
python3 - "$out/verify.json" <<'PY'
import json, sys
sys.path.insert(0, ".")
from smoke_tests.report import from_json, format_table
text = open(sys.argv[1]).read()
doc = json.loads(text)
for item in doc.get("preflight", []):
    print(f"preflight {item['name']}: {item['status']} {item.get('detail', '')}")
print(format_table(from_json(text)))
print("verdict:", "OK" if doc.get("ok") else "FAILED")
for check in doc["checks"]:
    if check["name"] == "nccl":
        print("nccl:", json.dumps(check["measurements"]))
PY
exit $status
