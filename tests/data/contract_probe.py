"""Run inside an image by the run-contract tests (tests/test_cluster_runtimes.py): torch.compile
(Inductor's C++ kernels on the CPU, written to its cache) and one DDP step over gloo, as whatever
uid, HOME and root the runtime gave; prints one line `PROBE {json}` with what it saw."""

import getpass
import json
import os
import socket
import subprocess

import torch
import torch.distributed as dist


def compile_once() -> int:
    """The compiled kernels Inductor wrote to its cache (its FX graph cache off: a hit would
    skip code generation)."""
    torch._inductor.config.fx_graph_cache = False

    def fused(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x * 2.0 + 1.0).sum(dim=-1)

    x = torch.randn(32, 16)
    assert torch.allclose(torch.compile(fused)(x), fused(x), rtol=1e-4, atol=1e-5)
    cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    return sum(name.endswith(".so") for _, _, names in os.walk(cache) for name in names)


def ddp_step() -> bool:
    """One DistributedDataParallel step in a gloo group of one: whether the weights moved."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
    before = model.module.weight.detach().clone()
    model(torch.randn(4, 8)).sum().backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    moved = not torch.equal(before, model.module.weight.detach())
    dist.destroy_process_group()
    return moved


kernels = compile_once()
libraries = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
print("PROBE " + json.dumps({
    "uid": os.getuid(), "home": os.environ.get("HOME"), "user": getpass.getuser(), "kernels": kernels,
    "caches": {name: os.environ.get(name) for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")},
    "ddp_step": ddp_step(), "PYTORCH_VERSION": os.environ.get("PYTORCH_VERSION"), "torch": torch.__version__,
    "rdma": sorted({line.split()[0] for line in libraries.splitlines()
                    if any(name in line for name in ("libibverbs.so", "librdmacm.so", "libmlx5.so", "libefa.so"))}),
}), flush=True)
