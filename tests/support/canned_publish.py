"""publish's runs over the canned engine and registry: the images they publish (from the small
matrix), a verifier with a canned verdict, and an eStargz publisher whose work is canned."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from imagebuilder.build.per_platform import Reading, each_platform
from imagebuilder.build.render import RenderedImage
from imagebuilder.build.render_options import RenderOptions
from imagebuilder.estargz.profile import StartProfile
from imagebuilder.matrix.load import load_matrix
from imagebuilder.matrix.selection import Selection
from imagebuilder.publish.estargz import Converted, EstargzPublisher
from imagebuilder.publish.plan import Outcome, RunOptions, Step
from imagebuilder.publish.run import publish
from imagebuilder.verify.preflight import PreflightItem
from imagebuilder.verify.report import VerifyReport
from smoke_tests.result import FAIL, PASS, Result

from .canned_engine import CannedEngine
from .canned_registry import CannedRegistry

SMALL = Path(__file__).resolve().parent.parent / "data" / "matrix-small.yaml"
M = load_matrix(SMALL)
OPTIONS = RunOptions(matrix_path=SMALL, push_retries=1, push_backoff=0)


def images(variant: str | None = "runtime") -> list[RenderedImage]:
    """The small matrix's torch 2.6 / CUDA 12.4 images of `variant` (None: every variant), in build order."""
    opts = RenderOptions(repository="127.0.0.1:5999/ml/pytorch")
    selection = Selection(torch="2.6", cuda="12.4", os="ubuntu22.04", variant=variant)
    (selected,) = each_platform(M, selection, opts, ["linux/amd64"], Reading(request=False), read_os_release=None,
                                note=print, host="linux/amd64")
    return list(selected.images)


def verdict(ok: bool) -> Callable[[Any, Any, str, RunOptions], VerifyReport]:
    """A verifier that runs nothing: every image passes, or every image fails its compile check."""
    def verifier(engine: Any, registry: Any, ref: str, options: RunOptions) -> VerifyReport:
        check = Result("compile", PASS) if ok else Result("compile", FAIL, "no C++ compiler on PATH")
        return VerifyReport(ref, "docker", (PreflightItem("daemon", PASS, "answers"),), (check,))

    return verifier


def run(steps: Sequence[Step], engine: CannedEngine, registry: CannedRegistry, ok: bool = True,
        **options: Any) -> list[Outcome]:
    """publish's outcomes for `steps` over the canned engine (also the builder) and registry,
    with OPTIONS changed by `options` and every verification's verdict `ok`."""
    return list(publish(steps, engine=engine, builder=engine, registry=registry,
                        options=replace(OPTIONS, **options), verifier=verdict(ok)))


class NoSaves:
    """publish/estargz.py's ImageSaver for the canned eStargz push, which reads no image."""

    def save_image(self, ref: str) -> Iterator[bytes]:
        raise AssertionError("the canned eStargz push saves no image")

    def inspect_image(self, ref: str) -> dict[str, Any]:
        raise AssertionError("the canned eStargz push inspects no image")


@dataclass(frozen=True)
class CannedEstargz(EstargzPublisher):
    """publish's eStargz push with its work canned: it 'puts' `digest` under the refs by
    telling the canned registry, which may answer something else for one of them."""

    digest: str = "sha256:" + "5" * 64
    calls: list[tuple[str, tuple[str, ...], str | None, bool]] = field(default_factory=list)

    def push(self, ref: str, refs: Sequence[str], platform: str | None) -> Converted:
        self.calls.append((ref, tuple(refs), platform, self.start is not None))
        registry = self.registry
        assert isinstance(registry, CannedRegistry)
        for tag in refs:
            registry.answers.setdefault(tag, self.digest)
        profile = StartProfile(("/opt/venv/bin/python3", "/opt/venv/lib/torch/lib/libtorch_cpu.so"),
                               ("python3", "-c", "import torch"), "1000", 12.5)
        return Converted(self.digest, "sha256:" + "6" * 64, 1234, profile, (), {"estargz_s": 3.0})
