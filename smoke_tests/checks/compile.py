"""torch.compile with Inductor: one graph, generated kernels, same numbers as eager."""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List

import torch

from ..context import Context
from ..result import Result, failed, passed, skipped
from ..toolchain import CompilerProblem, find_cxx

NAME = "compile"

# Small on purpose: the check proves the toolchain, not throughput.
ROWS, INNER, COLS = 64, 64, 32
RTOL = 1e-3  # float32 vs float32 with a different summation order (TF32 if enabled)

# A hit in the FX graph cache skips code generation, leaving nothing to inspect; the
# compiled kernel binaries may still come from Inductor's on-disk cache.
CACHE_SWITCHES = {"fx_graph_cache": False}


def fused(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.gelu(x @ weight + bias).sum(dim=-1)


def count_kernels(sources: List[str], device: str) -> int:
    """Kernels in Inductor's output code: async_compile.triton(...) or async_compile.cpp...(...)."""
    marker = "async_compile.triton(" if device == "cuda" else "async_compile.cpp"
    return sum(source.count(marker) for source in sources)


def graph_breaks() -> int:
    """Graph breaks dynamo has counted in this process (dynamo.reset() keeps them)."""
    try:
        from torch._dynamo.utils import counters

        return int(sum(counters["graph_break"].values()))
    except Exception:  # noqa: BLE001 - the counter's home has moved before; the graph count still proves it
        return 0


def counting_inductor(graphs: List[int]) -> Callable[..., Any]:
    """Inductor, recording each FX graph it is handed: more than one means a graph break."""
    from torch._inductor.compile_fx import compile_fx

    def backend(gm: torch.fx.GraphModule, example_inputs: List[torch.Tensor]) -> Any:
        graphs.append(len(gm.graph.nodes))
        return compile_fx(gm, example_inputs)

    return backend


def dynamo_unsupported() -> "str | None":
    """Dynamo's own reason why torch.compile cannot run on this Python (torch 2.5 on
    Python 3.13, a free-threaded build, ...), or None when it can."""
    try:
        from torch._dynamo.eval_frame import check_if_dynamo_supported
    except ImportError:  # private API moved: the public predicate, without its reason
        supported = getattr(getattr(torch, "_dynamo", None), "is_dynamo_supported", None)
        return None if supported is None or supported() else "torch._dynamo.is_dynamo_supported() is False"
    try:
        check_if_dynamo_supported()
    except Exception as e:  # noqa: BLE001 - Dynamo raises RuntimeError with the reason
        return str(e).strip() or type(e).__name__
    return None


def check(ctx: Context) -> Result:
    unsupported = dynamo_unsupported()
    if unsupported is not None:
        # A limit of this torch on this Python, not a broken image: every such image
        # would fail, and the other checks still say whether it works.
        return skipped(NAME, f"torch.compile is not supported here: {unsupported}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # Inductor's CPU kernels are C++; without a compiler torch.compile dies deep in a
    # traceback, so say it plainly. (On a GPU Triton looks for its own C compiler and
    # raises a clear error of its own, which becomes the reason.)
    if device == "cpu":
        compiler = find_cxx()
        if isinstance(compiler, CompilerProblem):
            return failed(NAME, compiler.reason, device=device)

    from torch._inductor import config as inductor_config

    try:
        from torch._inductor.utils import run_and_get_code
    except ImportError:  # private API: without it the kernels go uncounted, not unchecked
        run_and_get_code = None

    generator = torch.Generator().manual_seed(0)
    x, weight, bias = (
        torch.randn(*shape, generator=generator).to(device)
        for shape in ((ROWS, INNER), (INNER, COLS), (COLS,))
    )
    graphs: List[int] = []
    switches = {k: v for k, v in CACHE_SWITCHES.items() if hasattr(inductor_config, k)}
    torch._dynamo.reset()
    breaks_before = graph_breaks()
    compiled = torch.compile(fused, backend=counting_inductor(graphs))
    start = time.perf_counter()
    with inductor_config.patch(switches):
        if run_and_get_code is not None:
            # It resets dynamo itself and returns Inductor's output code.
            out, sources = run_and_get_code(compiled, x, weight, bias)
        else:
            out, sources = compiled(x, weight, bias), []
    if device == "cuda":
        torch.cuda.synchronize()
    compile_s = time.perf_counter() - start
    eager = fused(x, weight, bias)
    breaks = graph_breaks() - breaks_before
    # No output code at all means the hook moved (a torch we do not know), not that
    # Inductor generated nothing: a missing kernel would have raised before here.
    kernels = count_kernels(sources, device) if sources else None
    error = float((out - eager).abs().max() / eager.abs().max().clamp_min(1e-12))
    measurements: Dict[str, Any] = {
        "device": device,
        "compile_s": round(compile_s, 2),
        "graphs": len(graphs),
        "graph_breaks": breaks,
        "kernels": kernels,
        "rel_error": error,
    }

    problems = []
    if len(graphs) != 1 or breaks:
        problems.append(f"expected one graph and no graph break, got {len(graphs)} graph(s), {breaks} break(s)")
    kind = "Triton" if device == "cuda" else "C++"
    if kernels == 0:
        problems.append(f"Inductor generated no {kind} kernel ({len(sources)} output module(s))")
    if not error < RTOL:
        problems.append(f"compiled result differs from eager by {error:.3g} relative (limit {RTOL})")
    if problems:
        return failed(NAME, "; ".join(problems), **measurements)
    counted = f"{kernels} {kind} kernel(s)" if kernels is not None else "output code not inspectable"
    return passed(
        NAME,
        f"Inductor on {device}: 1 graph, {counted}, matches eager, compiled in {compile_s:.1f}s",
        **measurements,
    )
