"""One all-reduce worker process: `python -m smoke_tests.allreduce --rank R ...`.

The nccl check starts one of these per GPU (two over gloo without a GPU) and kills
them at its deadline, which is why they are processes and not threads.

Test-only fault injection: SMOKE_TESTS_FAULT=hang makes rank 0 never join the
all-reduce (the others block in it); SMOKE_TESTS_FAULT=wrong-value corrupts one
element of the last rank's input so that the sum is wrong in one place;
SMOKE_TESTS_FAULT=crash makes the last rank exit at once after the rendezvous, so that
the others fail after it, in their all-reduce. The tests
use these to prove that the check notices; nothing else should set them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from typing import List, Optional

from .child import RESULT_PREFIX

FAULT_ENV = "SMOKE_TESTS_FAULT"
FAULTS = ("hang", "wrong-value", "crash")
CRASH_EXIT = 3


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m smoke_tests.allreduce")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", choices=("nccl", "gloo"), required=True)
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=300.0)
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    fault = os.environ.get(FAULT_ENV, "")

    import torch
    import torch.distributed as dist

    if args.backend == "nccl":
        torch.cuda.set_device(args.rank)
        device = torch.device("cuda", args.rank)
    else:
        device = torch.device("cpu")

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    dist.init_process_group(
        args.backend,
        init_method=f"tcp://127.0.0.1:{args.port}",
        rank=args.rank,
        world_size=args.world_size,
        timeout=timedelta(seconds=args.timeout),
    )
    # float32 holds small integer sums exactly, so the result can be compared with ==.
    numel = args.bytes // 4
    expected = float(args.world_size * (args.world_size + 1) // 2)
    buffer = torch.full((numel,), float(args.rank + 1), dtype=torch.float32, device=device)
    if fault == "wrong-value" and args.rank == args.world_size - 1:
        buffer[numel // 2] += 1
    if fault == "hang" and args.rank == 0:
        time.sleep(10**6)
    if fault == "crash" and args.rank == args.world_size - 1:
        os._exit(CRASH_EXIT)

    dist.all_reduce(buffer)
    wrong = (buffer != expected).nonzero()
    mismatches = int(wrong.numel())
    first_wrong = None
    if mismatches:
        index = int(wrong[0, 0])
        first_wrong = {"index": index, "value": float(buffer[index]), "expected": expected}

    # Timing reuses the buffer; its values no longer matter once checked.
    for _ in range(args.warmup):
        dist.all_reduce(buffer)
    synchronize()
    start = time.perf_counter()
    for _ in range(args.iterations):
        dist.all_reduce(buffer)
    synchronize()
    seconds = (time.perf_counter() - start) / args.iterations

    dist.destroy_process_group()
    report = {
        "rank": args.rank,
        "mismatches": mismatches,
        "first_wrong": first_wrong,
        "seconds_per_iteration": seconds,
    }
    print(RESULT_PREFIX + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
