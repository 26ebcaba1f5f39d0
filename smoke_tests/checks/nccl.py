"""An exactly checked all-reduce across every visible GPU, under a hard time limit.

Runs before the checks that keep a CUDA context in this process (compile, cuda_graph): on
GPUs in exclusive-process compute mode such a context would lock the workers out.
"""

from __future__ import annotations

import json
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import IO, Any, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from .. import driver
from ..child import RESULT_PREFIX, child_env, module_command
from ..context import Context, no_gpu_reason
from ..nccl_log import DEBUG_ENV, parse_transport
from ..result import Result, failed, passed, skipped

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


def _last_line(log: IO[str]) -> str:
    log.seek(0)
    lines = [line.strip() for line in log.read().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def worker_env(backend: str) -> Dict[str, str]:
    env = child_env()
    if backend == "nccl":
        # NCCL names the transport it chose only in its INFO log; the workers' stdout keeps it.
        env.update(DEBUG_ENV)
        env.pop("NCCL_DEBUG_FILE", None)
    return env


def _transport(stdouts: Sequence[IO[str]]) -> Dict[str, Any]:
    """{"transport": ...} when the workers' NCCL log names one, else nothing."""
    lines: List[str] = []
    for log in stdouts:
        log.seek(0)
        lines += log.read().splitlines()
    transport = parse_transport(lines)
    return {"transport": transport.to_dict()} if transport is not None else {}


Exit = Tuple[float, int]  # (monotonic time of the exit, exit code)


def first_failure(exits: Mapping[int, Exit]) -> Optional[Tuple[int, int]]:
    """(rank, exit code) of the first worker to exit non-zero, by time.

    Once one worker dies, the others fail in the collective after it, and the lowest
    rank is rarely the culprit; ties (one poll apart) go to the lower rank.
    """
    failures = sorted((when, rank, code) for rank, (when, code) in exits.items() if code != 0)
    return (failures[0][1], failures[0][2]) if failures else None


def crash_hint(last_line: str, devices: Sequence[driver.Device]) -> str:
    """What a worker's last words mean when the GPU itself refused it."""
    if "busy or unavailable" not in last_line:
        return ""
    exclusive = [device.index for device in devices if device.compute_mode == driver.EXCLUSIVE_PROCESS]
    if exclusive:
        return (f" (GPU(s) {exclusive} are in {driver.EXCLUSIVE_PROCESS} compute mode: another process "
                "holds them; nvidia-smi --query-compute-apps=pid,name --format=csv lists it)")
    return " (another process holds the GPU, or its compute mode is PROHIBITED: see nvidia-smi)"


def _watch(workers: Sequence["subprocess.Popen[Any]"]) -> Dict[int, Exit]:
    """Exit times as they happen: one waiting thread per worker, so that the order of
    exits is the order of deaths, not of a polling loop's visits."""
    exits: Dict[int, Exit] = {}

    def wait(rank: int, worker: "subprocess.Popen[Any]") -> None:
        code = worker.wait()
        exits[rank] = (time.monotonic(), code)

    for rank, worker in enumerate(workers):
        threading.Thread(target=wait, args=(rank, worker), daemon=True).start()
    return exits


def run_workers(plan: Plan, timeout: float, devices: Sequence[driver.Device] = ()) -> Result:
    env = worker_env(plan.backend)
    port = free_port()
    measurements: Dict[str, Any] = {
        "backend": plan.backend,
        "world_size": plan.world_size,
        "bytes": plan.nbytes,
        "iterations": plan.iterations,
    }
    logs: List[IO[str]] = []
    workers: List["subprocess.Popen[bytes]"] = []
    try:
        for rank in range(plan.world_size):
            out = tempfile.TemporaryFile("w+")
            err = tempfile.TemporaryFile("w+")
            logs += [out, err]
            args = [
                "--rank", str(rank), "--world-size", str(plan.world_size), "--port", str(port),
                "--backend", plan.backend, "--bytes", str(plan.nbytes),
                "--iterations", str(plan.iterations), "--timeout", str(timeout),
            ]
            command = module_command("smoke_tests.allreduce", args)
            workers.append(subprocess.Popen(command, stdout=out, stderr=err, env=env))
        exits = _watch(workers)

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(exits) < len(workers):
            if any(code != 0 for _, code in list(exits.values())):
                deadline = min(deadline, time.monotonic() + AFTER_FIRST_FAILURE_S)
            time.sleep(0.05)
        finished = dict(exits)  # before the kills below add the hung ones
        hung = [rank for rank in range(plan.world_size) if rank not in finished]
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
            worker.wait()
        measurements.update(_transport(logs[0::2]))

        first = first_failure(finished)
        if first is not None:
            rank, code = first
            measurements["exit_order"] = [r for _, r in sorted((when, r) for r, (when, _) in finished.items())]
            last = _last_line(logs[2 * rank + 1])
            others = sorted(r for r, (_, c) in finished.items() if c != 0 and r != rank)
            after = f"; then rank(s) {others} failed too" if others else ""
            return failed(
                NAME,
                f"worker rank {rank} exited {code} first: {last}{crash_hint(last, devices)}{after}",
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
        first_wrong = wrong[0]
        detail = first_wrong["first_wrong"]
        return failed(
            NAME,
            f"all-reduce result wrong on rank {first_wrong['rank']}: {first_wrong['mismatches']} element(s) differ, "
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
        if line.startswith(RESULT_PREFIX):
            report: Dict[str, Any] = json.loads(line[len(RESULT_PREFIX):])
            return report
    return None


ONE_GPU = (
    "one GPU: NCCL's single-rank all-reduce moves no data, so it proves nothing and its "
    "bandwidth would be meaningless; the all-reduce needs two or more GPUs"
)


def mig_reason(slices: Sequence[int], devices: Sequence[driver.Device]) -> str:
    buses = sorted({devices[i].pci_bus_id for i in slices if i < len(devices) and devices[i].pci_bus_id})
    where = f" (PCI bus {', '.join(buses)})" if buses else ""
    return (f"MIG: GPU(s) {list(slices)} are MIG slices of one GPU{where}; NCCL refuses slices that share a "
            "GPU (\"Duplicate GPU detected\") and one slice has no peer: the all-reduce needs whole GPUs")


def plan_for(ctx: Context, devices: Sequence[driver.Device] = ()) -> "Plan | Result":
    """What to run, or why not; devices are the driver's listing (for MIG), read by check()."""
    if not torch.distributed.is_available():
        return failed(NAME, "torch.distributed is not available in this torch build")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 0:
        if ctx.require_gpu:
            return failed(NAME, no_gpu_reason(torch.version.cuda))
        # Without a GPU the same rendezvous and exact check still run, over gloo.
        return Plan("gloo", CPU_WORLD_SIZE, CPU_BYTES, CPU_ITERATIONS)
    slices = driver.mig_devices(devices)
    if slices:
        return skipped(NAME, mig_reason(slices, devices), gpu_count=gpus, mig=slices)
    if gpus == 1:
        return skipped(NAME, ONE_GPU, gpu_count=1)
    if not torch.distributed.is_nccl_available():
        return failed(NAME, f"{gpus} GPU(s) visible but this torch build has no NCCL backend")
    return Plan("nccl", gpus, GPU_BYTES, GPU_ITERATIONS)


def check(ctx: Context) -> Result:
    # The driver API lists devices without creating a context (see driver.py).
    devices = driver.devices()[0] if torch.cuda.is_available() else []
    plan = plan_for(ctx, devices)
    if isinstance(plan, Result):
        return plan
    return run_workers(plan, ctx.timeout, devices)
