"""An exactly checked all-reduce across every visible GPU, under a hard time limit."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import IO, Any, Dict, List, Optional

import torch

from .. import allreduce
from ..context import Context, no_gpu_reason
from ..result import Result, failed, passed

NAME = "nccl"

GPU_BYTES = 64 * 2**20
CPU_BYTES = 8 * 2**20
CPU_WORLD_SIZE = 2
GPU_ITERATIONS = 20
CPU_ITERATIONS = 5
# Once one worker has died the others block in the collective; wait this long for
# them to notice before killing them.
AFTER_FIRST_FAILURE_S = 5.0

HANG_HINT = (
    "likely a hang: a too-small /dev/shm (docker run --shm-size=1g or --ipc=host), "
    "broken GPU peer-to-peer (try NCCL_P2P_DISABLE=1), or a blocked localhost port; "
    "rerun with NCCL_DEBUG=WARN to see NCCL's own diagnosis"
)


@dataclass(frozen=True)
class Plan:
    backend: str
    world_size: int
    nbytes: int
    iterations: int


def free_port() -> int:
    # The port is free now; another process could take it before rank 0 binds it,
    # a small window the check accepts rather than depend on a port-0 TCPStore API.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bus_bandwidth(algbw: float, world_size: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: algbw * 2(n-1)/n (0 for one rank)."""
    return algbw * 2 * (world_size - 1) / world_size


def _package_parent() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(allreduce.__file__)))


def _last_line(log: IO[str]) -> str:
    log.seek(0)
    lines = [line.strip() for line in log.read().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def run_workers(plan: Plan, timeout: float) -> Result:
    env = dict(os.environ)
    # Workers must import this very copy of smoke_tests, wherever it lives.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_package_parent(), env.get("PYTHONPATH")) if p)
    port = free_port()
    measurements: Dict[str, Any] = {
        "backend": plan.backend,
        "world_size": plan.world_size,
        "bytes": plan.nbytes,
        "iterations": plan.iterations,
    }
    logs: List[IO[str]] = []
    workers: List[subprocess.Popen] = []
    try:
        for rank in range(plan.world_size):
            out = tempfile.TemporaryFile("w+")
            err = tempfile.TemporaryFile("w+")
            logs += [out, err]
            command = [
                sys.executable, "-m", "smoke_tests.allreduce",
                "--rank", str(rank), "--world-size", str(plan.world_size), "--port", str(port),
                "--backend", plan.backend, "--bytes", str(plan.nbytes),
                "--iterations", str(plan.iterations), "--timeout", str(timeout),
            ]
            workers.append(subprocess.Popen(command, stdout=out, stderr=err, env=env))

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(w.poll() is None for w in workers):
            if any(w.returncode not in (None, 0) for w in workers):
                deadline = min(deadline, time.monotonic() + AFTER_FIRST_FAILURE_S)
            time.sleep(0.1)
        hung = [rank for rank, w in enumerate(workers) if w.poll() is None]
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
            worker.wait()

        crashed = [(rank, w.returncode) for rank, w in enumerate(workers) if w.returncode != 0 and rank not in hung]
        if crashed:
            rank, code = crashed[0]
            return failed(
                NAME,
                f"worker rank {rank} exited {code}: {_last_line(logs[2 * rank + 1])}",
                **measurements,
            )
        if hung:
            return failed(
                NAME,
                f"all-reduce did not finish within {timeout:g}s (ranks {hung} of {plan.world_size} "
                f"over {plan.backend} still running, killed): {HANG_HINT}",
                **measurements,
            )
        reports = [_read_report(logs[2 * rank]) for rank in range(plan.world_size)]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
        for log in logs:
            log.close()

    if any(report is None for report in reports):
        missing = [rank for rank, report in enumerate(reports) if report is None]
        return failed(NAME, f"workers {missing} exited 0 without reporting a result", **measurements)
    wrong = [r for r in reports if r and r["mismatches"]]
    if wrong:
        first = wrong[0]
        detail = first["first_wrong"]
        return failed(
            NAME,
            f"all-reduce result wrong on rank {first['rank']}: {first['mismatches']} element(s) differ, "
            f"element {detail['index']} is {detail['value']:g}, expected {detail['expected']:g}",
            **measurements,
        )
    seconds = max(r["seconds_per_iteration"] for r in reports if r)
    algbw = plan.nbytes / seconds / 1e9
    busbw = bus_bandwidth(algbw, plan.world_size)
    measurements.update(time_us=round(seconds * 1e6, 1), algbw_GBps=round(algbw, 3), busbw_GBps=round(busbw, 3))
    return passed(
        NAME,
        f"{plan.nbytes // 2**20} MiB all-reduce over {plan.backend} x{plan.world_size} exact; "
        f"algbw {algbw:.2f} GB/s, busbw {busbw:.2f} GB/s",
        **measurements,
    )


def _read_report(log: IO[str]) -> Optional[Dict[str, Any]]:
    log.seek(0)
    for line in log.read().splitlines():
        if line.startswith(allreduce.RESULT_PREFIX):
            report: Dict[str, Any] = json.loads(line[len(allreduce.RESULT_PREFIX):])
            return report
    return None


def plan_for(ctx: Context) -> "Plan | Result":
    if not torch.distributed.is_available():
        return failed(NAME, "torch.distributed is not available in this torch build")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 0:
        if ctx.require_gpu:
            return failed(NAME, no_gpu_reason(torch.version.cuda))
        # Without a GPU the same rendezvous and exact check still run, over gloo.
        return Plan("gloo", CPU_WORLD_SIZE, CPU_BYTES, CPU_ITERATIONS)
    if not torch.distributed.is_nccl_available():
        return failed(NAME, f"{gpus} GPU(s) visible but this torch build has no NCCL backend")
    return Plan("nccl", gpus, GPU_BYTES, GPU_ITERATIONS)


def check(ctx: Context) -> Result:
    plan = plan_for(ctx)
    if isinstance(plan, Result):
        return plan
    return run_workers(plan, ctx.timeout)
