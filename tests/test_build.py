"""The build pipeline's pure parts: order, progress display, sizes (the real builds are in test_e2e)."""

from __future__ import annotations

import io
from pathlib import Path

from imagebuilder.build.per_platform import render_spec as render
from imagebuilder.build.per_platform import build_order
from imagebuilder.engine.progress import ProgressPrinter, human_size
from imagebuilder.engine.api import Progress
from imagebuilder.matrix.load import load_matrix
from imagebuilder.matrix.resolve import Request, resolve

M = load_matrix(Path(__file__).parent / "data" / "matrix-small.yaml")


def test_runtime_is_built_before_the_jupyter_image_on_it():
    jupyter = render(resolve(M, Request("2.6", "12.4", variant="jupyter")), M)
    runtime = render(resolve(M, Request("2.6", "12.4", variant="runtime")), M)
    devel = render(resolve(M, Request("2.6", "12.4", variant="devel")), M)
    assert jupyter.depends_on == runtime.ref
    assert [i.spec.variant for i in build_order([jupyter, devel, runtime])] == ["devel", "runtime", "jupyter"]


def progress(step: int, elapsed: float, line: str | None = None, cached: bool = False) -> Progress:
    return Progress(step=step, total=3, instruction="RUN  uv pip   install torch", elapsed=elapsed, cached=cached, line=line)


def test_plain_progress_prints_one_line_per_step_and_a_heartbeat_for_long_steps():
    out = io.StringIO()
    printer = ProgressPrinter("runtime", stream=out, tty=False)
    for event in [progress(1, 0.1), progress(2, 0.2), progress(2, 5.0, "x"), progress(2, 15.0, "y"), progress(3, 16.0)]:
        printer(event)
    printer.close()
    assert out.getvalue().splitlines() == [
        "[runtime] step 1/3 RUN uv pip install torch at 0.1s",
        "[runtime] step 2/3 RUN uv pip install torch at 0.2s",
        "[runtime] step 2/3 RUN uv pip install torch still running at 15.0s",
        "[runtime] step 3/3 RUN uv pip install torch at 16.0s",
    ]


def test_plain_progress_names_the_export_and_beats_every_ten_seconds():
    out = io.StringIO()
    printer = ProgressPrinter("runtime", stream=out, tty=False)
    export = "exporting layers (zstd)"
    for event in [progress(3, 30.0), Progress(3, 3, export, 31.0, False, None, activity=export),
                  Progress(3, 3, export, 41.0, False, None, activity=export),
                  Progress(3, 3, "unpacking to x:1", 45.0, False, None, activity="unpacking to x:1")]:
        printer(event)
    assert out.getvalue().splitlines() == [
        "[runtime] step 3/3 RUN uv pip install torch at 30.0s",
        "[runtime] exporting layers (zstd) at 31.0s",
        "[runtime] exporting layers (zstd) still running at 41.0s",
        "[runtime] unpacking to x:1 at 45.0s",
    ]


def test_terminal_progress_updates_one_line_per_step():
    out = io.StringIO()
    printer = ProgressPrinter("devel", stream=out, tty=True)
    for event in [progress(1, 0.5), progress(1, 1.5, "x"), progress(2, 2.0, cached=True)]:
        printer(event)
    printer.close()
    lines = out.getvalue().split("\n")
    assert len(lines) == 3 and lines[-1] == ""
    assert lines[0].count("\r") == 2 and lines[0].rstrip().endswith("1.5s")
    assert "(cached)" in lines[1]


def test_human_size():
    assert [human_size(n) for n in (512, 1_500_000, 6_100_000_000)] == ["512 B", "1.5 MB", "6.1 GB"]


def test_a_dry_run_with_a_report_writes_the_plan_it_prints(tmp_path: Path) -> None:
    """`build --dry-run --report F` does what both say: builds nothing, reports what it would build."""
    import json

    from imagebuilder.build.run import report_plan

    runtime = render(resolve(M, Request("2.6", "12.4", variant="runtime")), M)
    printed: list[str] = []
    report_plan([("linux/amd64", runtime)], report=tmp_path / "r.json", echo=printed.append)
    assert printed == [f"would build {runtime.ref} (linux/amd64)"]
    document = json.loads((tmp_path / "r.json").read_text())
    assert document == {"ok": True, "dry_run": True, "images": [], "planned": [runtime.ref]}
    report_plan([("linux/amd64", runtime)], report=None, echo=printed.append)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
