"""A training step captured in a CUDA Graph and replayed gives eager's parameters."""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List

import torch

from ..context import Context, no_gpu_reason
from ..result import Result, failed, passed, skipped

NAME = "cuda_graph"

WARMUP_STEPS = 3  # the CUDA Graphs docs warm up on a side stream before capture
REPLAYS = 5
BATCH, FEATURES, HIDDEN, OUTPUTS = 32, 64, 128, 10
# Replays run the very kernels eager runs; only nondeterministic reductions could differ.
ATOL, RTOL = 1e-5, 1e-4


def make_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor
) -> Callable[[], None]:
    def step() -> None:
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()

    return step


def check(ctx: Context) -> Result:
    if not torch.cuda.is_available():
        reason = no_gpu_reason(torch.version.cuda)
        return failed(NAME, reason) if ctx.require_gpu else skipped(NAME, reason)

    device = torch.device("cuda", 0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUTPUTS)
    ).to(device)
    twin = copy.deepcopy(model)
    batches = [
        (torch.randn(BATCH, FEATURES, device=device), torch.randn(BATCH, OUTPUTS, device=device))
        for _ in range(WARMUP_STEPS + REPLAYS)
    ]

    # capturable=True keeps Adam's step count on the GPU, which a graph requires; the
    # eager twin uses the same path so both run the same arithmetic.
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, capturable=True)
    static_in = torch.zeros(BATCH, FEATURES, device=device)
    static_target = torch.zeros(BATCH, OUTPUTS, device=device)
    step = make_step(model, optimizer, static_in, static_target)

    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for inputs, targets in batches[:WARMUP_STEPS]:
            static_in.copy_(inputs)
            static_target.copy_(targets)
            optimizer.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream(device).wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    # Gradients set to None are allocated inside the graph's private memory pool.
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        step()
    for inputs, targets in batches[WARMUP_STEPS:]:
        static_in.copy_(inputs)
        static_target.copy_(targets)
        graph.replay()
    torch.cuda.synchronize(device)

    twin_optimizer = torch.optim.Adam(twin.parameters(), lr=1e-2, capturable=True)
    for inputs, targets in batches:
        # Grads were None at capture, so the graph writes fresh grads on every replay
        # rather than accumulating: eager's equivalent is zeroing them every step.
        twin_optimizer.zero_grad(set_to_none=True)
        make_step(twin, twin_optimizer, inputs, targets)()
    torch.cuda.synchronize(device)

    differences: List[float] = [
        float((a - b).abs().max()) for a, b in zip(model.parameters(), twin.parameters())
    ]
    close = all(
        torch.allclose(a, b, atol=ATOL, rtol=RTOL) for a, b in zip(model.parameters(), twin.parameters())
    )
    measurements: Dict[str, Any] = {
        "replays": REPLAYS,
        "max_abs_diff": max(differences),
        "device": torch.cuda.get_device_name(device),
    }
    if not close:
        return failed(
            NAME,
            f"parameters after {REPLAYS} graph replays differ from eager by {max(differences):.3g} "
            f"(atol {ATOL}, rtol {RTOL})",
            **measurements,
        )
    return passed(NAME, f"training step captured and replayed {REPLAYS}x, parameters match eager", **measurements)
