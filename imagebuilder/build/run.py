"""Rendered images -> built, tagged images: the build pipeline over an Engine.

Only the engine talks to Docker; this module decides what to build, in which order, with
which build-time labels, and where the logs go.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from secrets import token_hex
from typing import Any

from ..atomic import write_json
from ..engine.api import BackgroundBuilder, Builder, BuildRequest, BuildResult, ImageStore, OnProgress, Progress
from ..engine.errors import BuildFailed, EngineError, network_hint
from ..engine.export import Compression, Export, gzip_ref
from ..engine.progress import ProgressPrinter, human_size
from ..trust.labels import SBOM_DIGEST
from ..trust.sbom import DIGEST_LINE
from ._build_labels import build_labels
from .cache_export import CacheExport, can_start, start_cache_export
from .image_contents import SBOM_PATH
from .render import RenderedImage


class BaseImageChanged(EngineError):
    image: str
    locked: str
    now: str | None
    template = ("base image {image} is {now}, but locks/base-images.json pins image id {locked}; "
                "run `imagebuilder lock --base-image {image}` to take the new one")


class SbomMissing(EngineError):
    ref: str
    path: str
    template = ("{ref} has no {path}: the image's SBOM step did not run; rebuild it with --no-cache")


def check_base(engine: ImageStore, image: RenderedImage) -> None:
    """A local base image pinned by image id (no registry digest to put in FROM) must still
    be that image: FROM takes the tag, so this check is the pin."""
    pin = image.base_pin
    if pin is None or pin.digest is not None or pin.image_id is None:
        return
    found = engine.image_identity(pin.image)
    if found is None or found[0] != pin.image_id:
        raise BaseImageChanged(image=pin.image, locked=pin.image_id,
                               now=found[0] if found else "not on this engine")




@dataclass(frozen=True)
class Built:
    image: RenderedImage
    result: BuildResult
    refs: tuple[str, ...]
    cache_export: CacheExport | None = field(default=None, compare=False)
    """The registry cache's export, still running (build_image's background_cache)."""
    gzip: BuildResult | None = None
    """--compression gzip+zstd: the same image exported as gzip, tagged gzip_ref(image.ref)."""

    def to_json(self) -> dict[str, Any]:
        spec = self.image.spec
        return {
            "image": spec.key,
            "spec": {
                "torch": str(spec.torch.version), "wheel": spec.wheel.name, "cuda": str(spec.cuda.version),
                "cudnn": str(spec.wheel.cudnn), "nccl": str(spec.wheel.nccl), "python": str(spec.python),
                "os": spec.os.name, "variant": spec.variant, "base_image": self.image.base_image,
                "min_driver": spec.min_driver,
            },
            "tags": list(self.refs),
            "image_id": self.result.image_id,
            "size_bytes": self.result.size,
            "seconds": round(self.result.seconds, 2),
            "export_seconds": None if self.result.export_seconds is None else round(self.result.export_seconds, 2),
            "steps": self.result.steps,
            "cached_steps": self.result.cached_steps,
            "log": str(self.result.log_path) if self.result.log_path else None,
            "removed": list(self.result.removed),
            "inputs_hash": self.image.inputs_hash,
        }


def log_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "imagebuilder" / "logs"


def build_image(
    engine: ImageStore,
    image: RenderedImage,
    *,
    builder: Builder,
    matrix_path: Path,
    nocache: bool = False,
    pull: bool = False,
    on_progress: OnProgress | None = None,
    logs: Path | None = None,
    timeout: float = 3 * 3600,
    platform: str | None = None,
    export: Export | None = None,
    gzip_too: bool = False,
    background_cache: bool = False,
) -> Built:
    """Build one image with `builder`; `engine` holds the images it builds on and makes.

    `export` (BuildKit): the final image's compression, provenance and registry caches; `gzip_too`
    (gzip+zstd, export_decision.ExportDecision.gzip_too): the image again as gzip, tagged gzip_ref().
    `background_cache`: the registry cache (export.cache_to) is exported by a build that is
    still running when this returns (Built.cache_export), where the builder can; the caller
    waits for it or stops it."""
    check_base(engine, image)
    log_path = run_log(logs or log_dir(), image.spec.key)
    # The registry cache goes up beside verify where the builder can (cache_export.py): the
    # image's builds export the image alone, and the context stays for the cache's own build.
    later = background_cache and export is not None and export.cache_to is not None and can_start(builder)
    image_export = replace(export, cache_to=None) if later and export is not None else export
    tmp = tempfile.mkdtemp(prefix="imagebuilder-context-")
    exporting: CacheExport | None = None
    try:
        context = Path(tmp) / "context"
        image.write(context)
        # Secrets (BuildKit's CA bundle) live beside the context, never in it.
        secrets = {}
        for secret_id, data in image.secrets.items():
            secrets[secret_id] = Path(tmp) / f"secret-{secret_id}"
            secrets[secret_id].write_bytes(data)
        # Written there by image.write, each file 0644 (write_tree's mode): the build's user (uid 1000) reads it.
        contexts = {name: context / name for name in image.contexts}
        labels = build_labels(engine, image, matrix_path)
        # The image's own tags go on the SBOM-labelled image only (below): had the unlabelled
        # image taken them, a rebuild would untag (and the engine remove) the labelled image
        # of the last build, and a rebuild of the same inputs would not be a cache hit.
        unlabelled = intermediate_tag(image.ref)
        try:
            result = builder.build(
                BuildRequest(
                    context=context,
                    tags=(unlabelled,),
                    labels=labels,
                    nocache=nocache,
                    pull=pull,
                    log_path=log_path,
                    timeout=timeout,
                    platform=platform,
                    secrets=secrets,
                    contexts=contexts,
                    # The layers compressed once, as the final image keeps them; caches imported.
                    export=None if export is None else Export(export.compression, cache_from=export.cache_from),
                ),
                on_progress=on_progress,
            )
        except KeyboardInterrupt:
            # Ctrl-C during the export: the daemon may name the image as the CLI stops.
            engine.remove_image(unlabelled, force=False)
            raise
        except BuildFailed as e:
            # BuildKit may have named the image before a step after the export failed.
            engine.remove_image(unlabelled, force=False)
            hint = python_download_hint(e.fields["tail"], image)
            if hint is None and e.fields["cause"] == "network":
                hint = network_hint(e.fields["tail"], ca_bundle_given=image.trusts_ca_bundle)
            if hint is None:
                raise
            raise e.with_hint(hint) from e
        # What the image's tags name before the builds that tag it (gzip+zstd's TAG-gzip too).
        dual = gzip_too and image_export is not None
        named = {ref: _image_id(engine, ref) for ref in (*image.refs, *((gzip_ref(image.ref),) if dual else ()))}
        try:
            sbom_log = log_path.with_name(log_path.stem + "-sbom.log")
            if builder.kind == "buildkit":
                # The same Dockerfile plus the label, every step cached: the final image's
                # provenance then describes the real build (its base, its steps), not a FROM
                # of an intermediate image; and its export writes the registry cache, unless a
                # build of the same in the background does (`later`).
                request = BuildRequest(context=context, dockerfile=SBOM_DOCKERFILE, tags=image.refs, labels=labels,
                                       timeout=timeout, platform=platform, secrets=secrets, contexts=contexts,
                                       log_path=sbom_log,
                                       export=image_export)
            else:
                request = BuildRequest(context=Path(tmp) / "sbom", tags=image.refs, labels=labels,
                                       nocache=False, pull=False, timeout=300, platform=platform, log_path=sbom_log,
                                       export=image_export)
            result = _label_sbom(engine, builder, image, unlabelled, result, request, on_progress)
            gzip = _export_gzip(builder, image, request, on_progress, result.seconds) if dual else None
        except BaseException:
            # A build that tagged and then failed or was interrupted (BuildKit's lost record after
            # the export, a Ctrl-C during the SBOM label or the gzip build) leaves no tag on what it
            # made: each tag it moved names again what it named before, or nothing.
            _restore_tags(engine, named)
            raise
        finally:
            engine.remove_image(unlabelled, force=False)  # untags: the labelled image is built on it
        if later and export is not None and isinstance(builder, BackgroundBuilder):
            # The labelled build again, every step cached: only its cache goes out.
            exporting = start_cache_export(builder, replace(
                request, export=replace(export, image=False, provenance=False), timeout=3600,
                log_path=log_path.with_name(log_path.stem + "-cache.log")), lambda: shutil.rmtree(tmp, ignore_errors=True))
    finally:
        if exporting is None:
            shutil.rmtree(tmp, ignore_errors=True)
    return Built(image, result, image.refs, exporting, gzip)


def _export_gzip(builder: Builder, image: RenderedImage, request: BuildRequest,
                 on_progress: OnProgress | None, offset: float) -> BuildResult | None:
    """gzip+zstd: the labelled build again, every step cached, exported as gzip under
    gzip_ref(); None without an export (the classic builder)."""
    export = request.export
    if export is None:
        return None
    log = request.log_path.with_name(request.log_path.stem + "-gzip.log") if request.log_path else None
    gzip_request = replace(request, tags=(gzip_ref(image.ref),), log_path=log,
                           export=replace(export, compression=Compression("gzip"), cache_to=None))
    return builder.build(gzip_request, None if on_progress is None else _activities_only(on_progress, offset))


def run_log(logs: Path, key: str) -> Path:
    """This run's build log (its -sbom, -gzip, -cache logs are named after it): its own, as
    intermediate_tag is, so two builds of one image in one second do not write into one file."""
    return logs / f"{key}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}-{token_hex(3)}.log"


def _restore_tags(engine: ImageStore, named: dict[str, str | None]) -> None:
    """Each tag names what it named before the build (`named`), or nothing; then the images the
    build made under them go, unless something else still names one (another run's tag)."""
    made = set()
    for ref, before in named.items():
        now = _image_id(engine, ref)
        if now in (None, before):
            continue
        made.add(now)
        if before is None:
            engine.remove_image(ref, force=False)
        else:
            engine.tag_image(before, ref)
    for image_id in made - set(named.values()):
        with contextlib.suppress(EngineError):
            engine.remove_image(image_id, force=False)


def _image_id(engine: ImageStore, ref: str) -> str | None:
    identity = engine.image_identity(ref)
    return identity[0] if identity is not None else None


def intermediate_tag(ref: str) -> str:
    """The tag of this run's unlabelled image: its own (the pid and a random suffix), so two
    builds of one tag at once neither collide on it nor remove each other's."""
    return f"{ref}-unlabelled-{os.getpid()}-{token_hex(4)}"


_UV_PYTHON_FAILED = "Failed to install cpython-"  # `uv python install`'s error line
_DOWNLOAD_URL = re.compile(r"Failed to download `(?:https?|file)://([^/`]+)")


def python_download_hint(tail: Iterable[str], image: RenderedImage) -> str | None:
    """What to do when `uv python install` could not fetch the image's CPython (a proxy that
    serves only the package index, a mirror that refuses); None for any other failure."""
    lines = list(tail)
    if not any(_UV_PYTHON_FAILED in line for line in lines):
        return None
    hosts = [m[1] for line in lines for m in _DOWNLOAD_URL.finditer(line)]
    spec = image.spec
    own = spec.os.python in (spec.wheel.pythons or spec.torch.pythons)
    return (f"`uv python install {spec.python}` could not download CPython from {hosts[-1] if hosts else 'GitHub'}: "
            "point --python-mirror URL (env IMAGEBUILDER_PYTHON_MIRROR) at a mirror of python-build-standalone's "
            "releases that the Docker host reaches"
            + (f", or build with {spec.os.name}'s own Python (--python {spec.os.python})" if own else "") + "; ")


def _label_sbom(engine: ImageStore, builder: Builder, image: RenderedImage, unlabelled: str,
                result: BuildResult, request: BuildRequest, on_progress: OnProgress | None = None) -> BuildResult:
    """Label the image with its SBOM's digest. The SBOM lists the OS packages the build
    installed, so its digest is known only after the build: a one-instruction build on top
    adds the label (no layer; served from the cache when nothing changed)."""
    digest = sbom_digest_in_log(result.log_path)
    if digest is None:  # the step was cached: its output is not in this build's log
        sbom = engine.read_file(result.image_id, SBOM_PATH)
        if sbom is None:
            raise SbomMissing(ref=image.ref, path=SBOM_PATH)
        digest = "sha256:" + hashlib.sha256(sbom).hexdigest()
    label = f'LABEL {SBOM_DIGEST}="{digest}"\n'
    if request.dockerfile == SBOM_DOCKERFILE:
        dockerfile = (request.context / "Dockerfile").read_text()
        (request.context / SBOM_DOCKERFILE).write_text(dockerfile.rstrip("\n") + "\n" + label)
    else:
        request.context.mkdir()
        (request.context / "Dockerfile").write_text(f"FROM {unlabelled}\n{label}")
    # Its steps are the cached ones just shown: only its export (new blobs, the unpack) is news.
    labelled = builder.build(request, None if on_progress is None else _activities_only(on_progress, result.seconds))
    export = (result.export_seconds or 0.0) + (labelled.export_seconds or 0.0)
    return replace(result, image_id=labelled.image_id, size=labelled.size, tags=labelled.tags,
                   seconds=result.seconds + labelled.seconds, export_seconds=export or result.export_seconds)


_SBOM_DIGEST_LINE = re.compile(rf"(?:^|\s){DIGEST_LINE} (sha256:[0-9a-f]{{64}})$", re.M)


def sbom_digest_in_log(log_path: Path | None) -> str | None:
    """The SBOM's digest as the step that wrote it printed it (sbom.py), or None when the
    log holds no such line (the step was cached, or a build without a log): the last one,
    if a log held several."""
    if log_path is None or not log_path.is_file():
        return None
    found = _SBOM_DIGEST_LINE.findall(log_path.read_text(encoding="utf-8", errors="replace"))
    return found[-1] if found else None


def _activities_only(on_progress: OnProgress, offset: float) -> OnProgress:
    """The events of the export, on the first build's clock (`offset`: its seconds)."""
    def forward(p: Progress) -> None:
        if p.activity is not None:
            on_progress(replace(p, elapsed=p.elapsed + offset))
    return forward


def build_all(plan: Sequence[tuple[str, RenderedImage]], *, engine: ImageStore, builder: Builder,
              matrix_path: Path, nocache: bool, pull: bool, quiet: bool, exports: Callable[[str], Export | None],
              report: Path | None, echo: Callable[[str], None], err: Callable[[str], None],
              gzip_too: bool = False) -> list[Built]:
    """`build`: every planned (platform, image) in order, progress on `err`, each result on
    `echo`; the --report written also when a build fails or is interrupted. `exports` and
    `gzip_too`: the export decision's (export_decision.ExportDecision.for_image, .gzip_too)."""
    done: list[Built] = []
    try:
        for n, (platform, image) in enumerate(plan, 1):
            if not quiet:
                err(f"building {image.ref} ({n}/{len(plan)})")
            printer = ProgressPrinter(image.spec.variant, stream=sys.stderr)
            try:
                built = build_image(engine, image, builder=builder, matrix_path=matrix_path, nocache=nocache,
                                    pull=pull, on_progress=None if quiet else printer, platform=platform,
                                    export=exports(image.spec.key), gzip_too=gzip_too)
            finally:
                printer.close()
            done.append(built)
            echo(built.refs[0] if quiet else format_built(built))
    finally:
        if report is not None:
            write_json(report, report_document(plan, done))
    return done


def report_document(planned: Sequence[tuple[str, RenderedImage]], done: Sequence[Built]) -> dict[str, Any]:
    """`build --report`: the images built (in plan order, each with its platform) and planned."""
    return {"ok": len(done) == len(planned),
            "images": [{**b.to_json(), "platform": platform} for b, (platform, _) in zip(done, planned)],
            "planned": [image.ref for _, image in planned]}


def report_plan(plan: Sequence[tuple[str, RenderedImage]], *, report: Path | None, echo: Callable[[str], None]) -> None:
    """`build --dry-run`: what would be built, in build order; with --report, the same as JSON
    (a build's report with nothing built yet, marked as a dry run)."""
    for platform, image in plan:
        echo(f"would build {image.ref} ({platform})")
    if report is not None:
        write_json(report, {**report_document(plan, []), "ok": True, "dry_run": True})


def format_built(built: Built) -> str:
    r = built.result
    return "\n".join([f"built {built.refs[0]}",
                      f"  image  {r.image_id} ({human_size(r.size)})",
                      f"  time   {r.seconds:.1f}s, {r.cached_steps}/{r.steps} steps cached"
                      + (f"; the export (compress, unpack) {r.export_seconds:.1f}s" if r.export_seconds else ""),
                      f"  tags   {', '.join(built.refs[1:])}",
                      f"  log    {r.log_path}"])


SBOM_DOCKERFILE = "Dockerfile.sbom"
