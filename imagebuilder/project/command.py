"""`imagebuilder project`: a team's project on a verified torch image, in the order that loses
nothing: read the project and the base, resolve the lock under the base (a conflict stops here,
before any build), build the project's layers over the base's, prove the image (the torch stack
byte-for-byte the base's, the base's smoke tests, the user's checks), then tag it, then push and
sign. An image that fails any proof is removed untagged.
"""

from __future__ import annotations

import json
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..engine.api import Builder, BuildRequest, Engine
from ..engine.progress import ProgressPrinter
from ..errors import BadRequest, ImageBuilderError
from ..platforms import AMD64, PLATFORMS
from ..registry.reference import parse_reference
from ..verify.report import Live
from ..verify.run import verify_image
from ..trust.signature_check import names_a_registry
from .base import find_base
from .lock import resolve
from .probe import family_differences, probe
from .rebase import RebasePlan, plan_rebase, push_rebased, rebased
from .render import render_project
from .source import Project, read_project

CHECK_TIMEOUT_S = 600


class ProofFailed(ImageBuilderError):
    template = "{tag}: not tagged: {what}"

    def details(self) -> list[str]:
        return list(self.fields.get("more", []))


class RebaseNeedsPush(BadRequest):
    template = "--rebase re-makes a published image in its registry: add --push (and a registry --tag)"


class NeedsRegistryBase(BadRequest):
    template = "--key checks a published base's signature: give --base as REGISTRY/REPOSITORY:TAG (got {ref})"


class Tagger(Protocol):
    def tag_image(self, source: str, ref: str) -> None: ...


class ProjectEngine(Engine, Tagger, Protocol):
    pass


@dataclass(frozen=True)
class ProjectRequest:
    path: Path
    base: str
    tag: str
    push: bool = False
    checks: tuple[str, ...] = ()
    allow_no_gpu: bool = False
    no_cache: bool = False
    key: str | None = None
    sign_key: str | None = None
    locked: bool = False
    rebase: str | None = None
    """A published project image to re-make on --base without rebuilding its layers, where sound."""
    report: Path | None = None
    ca_bundle: Path | None = None
    index_args: tuple[str, ...] = ()
    uv: str = "uv"
    project: Project | None = None
    """DIR as read_project read it (the command reads it before it reaches the engine); None: read here."""


@dataclass
class ProjectReport:
    tag: str
    base: str
    base_digest: str
    project: str
    lock: str
    lock_reused: bool
    image_id: str = ""
    build_seconds: float = 0.0
    executed_steps: int = 0
    cached_steps: int = 0
    proof: list[str] = field(default_factory=list)
    rebased: str | None = None
    """--rebase: the image re-made on the base ("" when it was not sound and the image was rebuilt)."""
    pushed_digest: str | None = None
    uploaded_blobs: int | None = None
    uploaded: list[str] = field(default_factory=list)
    """The short ids (12 hex digits) of the blobs the push uploaded."""
    uploaded_bytes: int | None = None
    signed: dict[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def project_command(req: ProjectRequest, *, engine: ProjectEngine, builder: Builder, registry: Any,
                    say: Callable[[str], None], signer: Any = None, cosign: Any = None) -> ProjectReport:
    parse_reference(req.tag, "--tag")  # refused before the daemon is asked
    if req.rebase is not None and not req.push:
        raise RebaseNeedsPush()
    project = req.project or read_project(req.path, req.uv)
    if req.key is not None and not names_a_registry(req.base):
        raise NeedsRegistryBase(ref=req.base)
    base, _labels = find_base(engine, req.base, say)
    if req.key is not None:
        from ..trust.signature_check import check_image

        checked = check_image(req.base, key=req.key, store=registry, cosign=cosign)
        say(checked.line())
        if not checked.ok:
            raise ProofFailed(tag=req.tag, what=f"the base's signature does not verify: {checked.detail}")
    say(f"base: {base.name} ({base.digest}), python {base.python}; reading its packages")
    base_venv = probe(engine, base.image_id)
    platform = next((p for p in PLATFORMS.values() if p.arch == _arch(engine, base.image_id)), AMD64).uv_platform
    lock = resolve(project, uv=req.uv, base_dists=base_venv.dists, base_name=base.name, python=base_venv.python,
                   platform=platform, index_args=req.index_args, locked=req.locked)
    say(f"lock: {'reused' if lock.reused else 'resolved and wrote'} {project.path / 'imagebuilder-project.lock'} "
        f"({len(lock.pins.pins)} package(s) beyond the base)")
    run = uuid.uuid4().hex[:12]  # never shared by two runs
    alias = f"imagebuilder-project-base:{run}"
    rendered = render_project(project, base, lock.pins, lock.digest, index_args=req.index_args,
                              ca=req.ca_bundle is not None, local_alias=alias)
    report = ProjectReport(tag=req.tag, base=base.name, base_digest=base.digest, project=str(project.path),
                           lock=lock.digest, lock_reused=lock.reused)
    if req.rebase is not None:
        plan = plan_rebase(registry, req.rebase, req.base, lock.digest)
        if isinstance(plan, RebasePlan):
            return _rebase(plan, req, engine, registry, base, base_venv, report, say, signer)
        say(f"rebase: not sound ({plan}); building the project's layers instead")
        report.rebased = ""
    candidate = f"imagebuilder-project-candidate:{run}"
    with tempfile.TemporaryDirectory(prefix="imagebuilder-project-") as tmp:
        root = Path(tmp)
        (root / "Dockerfile").write_text(rendered.dockerfile)
        files = root / "files"
        files.mkdir()
        for name, text in rendered.files.items():
            (files / name).write_text(text)
        contexts = {"imagebuilder-project": files}
        if req.ca_bundle is not None:
            (root / "ca").mkdir()
            (root / "ca" / "ca.pem").write_bytes(req.ca_bundle.read_bytes())
            contexts["imagebuilder-ca"] = root / "ca"
        say(f"build: {project.kind} project on {base.name}")
        aliased = alias in rendered.dockerfile
        printer = ProgressPrinter("project")
        if aliased:
            engine.tag_image(base.image_id, alias)
        try:
            built = builder.build(BuildRequest(context=project.path, tags=(candidate,),
                                               dockerfile=str(root / "Dockerfile"), contexts=contexts,
                                               nocache=req.no_cache), printer)
        except BaseException:
            engine.remove_image(candidate, force=True)  # an export that failed after naming it, Ctrl-C
            raise
        finally:
            printer.close()
            if aliased:
                engine.remove_image(alias, force=False)  # the name only: the base stays
    report.image_id, report.build_seconds = built.image_id, round(built.seconds, 1)
    report.executed_steps, report.cached_steps = built.executed_steps, built.cached_steps
    try:
        report.proof = _prove(engine, candidate, base_venv, req, say)
        engine.tag_image(candidate, req.tag)
    except BaseException:
        engine.remove_image(candidate, force=True)  # proven or nothing: no tag, no image left
        raise
    engine.remove_image(candidate, force=False)  # the name only: the image stays under --tag
    say(f"tagged {req.tag}")
    if req.push:
        mounted = _mount_base(registry, base, req.tag)
        if mounted:
            say(f"push: {mounted} blob(s) of the base mounted into {parse_reference(req.tag).name}")
        pushed = engine.push_counted(req.tag)
        report.pushed_digest = pushed.digest
        report.uploaded_blobs = len(pushed.uploaded)
        report.uploaded = sorted(pushed.uploaded)
        report.uploaded_bytes = pushed.uploaded_bytes(registry.blobs(req.tag))
        say(f"pushed {req.tag} ({pushed.digest}); {len(pushed.uploaded)} layer(s) uploaded, the base's mounted or there")
        if signer is not None:
            target = f"{parse_reference(req.tag).name}@{pushed.digest}"
            signed = signer.sign(target, _sbom(engine, req.tag, base.digest, lock.digest))
            report.signed = signed.to_json()
            say(f"signed {target}")
    return _written(report, req)


def _written(report: ProjectReport, req: ProjectRequest) -> ProjectReport:
    if req.report is not None:
        tmp_report = req.report.with_name(f".{req.report.name}.tmp")
        tmp_report.write_text(json.dumps(report.to_json(), indent=2) + "\n")
        tmp_report.replace(req.report)
    return report


def _rebase(plan: RebasePlan, req: ProjectRequest, engine: ProjectEngine, registry: Any, base: Any, base_venv: Any,
            report: ProjectReport, say: Callable[[str], None], signer: Any) -> ProjectReport:
    """The project's layers from `plan.old` on the new base, in the registry; pulled and proven
    as a build is; tagged only then."""
    config, manifest = rebased(plan, base.name, base.digest)
    digest, uploaded = push_rebased(registry, plan, req.tag, config, manifest)
    pinned = f"{parse_reference(req.tag).name}@{digest}"
    say(f"rebase: {len(plan.own_layers)} layer(s) of {req.rebase} on {base.name}, mounted; {pinned}")
    engine.pull(pinned)
    try:
        report.proof = _prove(engine, pinned, base_venv, req, say)
    except BaseException:
        engine.remove_image(pinned, force=True)
        raise
    registry.put_tag(req.tag, digest)
    engine.tag_image(pinned, req.tag)
    report.rebased, report.pushed_digest, report.uploaded_blobs = req.rebase, digest, uploaded
    report.image_id = str(engine.inspect_image(req.tag).get("Id") or "")
    say(f"tagged and pushed {req.tag} ({digest}); {uploaded} blob(s) uploaded (the config), every layer mounted")
    if signer is not None:
        signed = signer.sign(pinned, _sbom(engine, req.tag, base.digest, report.lock))
        report.signed = signed.to_json()
        say(f"signed {pinned}")
    return _written(report, req)


def _prove(engine: ProjectEngine, image: str, base_venv: Any, req: ProjectRequest,
           say: Callable[[str], None]) -> list[str]:
    """Each proof that passed, one line each; the first that fails raises (the image is removed)."""
    done = []
    problems = family_differences(base_venv, probe(engine, image))
    if problems:
        raise ProofFailed(tag=req.tag, what="the torch stack is not the base's", more=problems)
    done.append(f"torch stack: {len(base_venv.family)} distribution(s) byte-for-byte the base's (RECORD and files)")
    say(f"proof: {done[-1]}")
    started = time.monotonic()
    verified = verify_image(engine, image, registry=_NoRegistry(), allow_no_gpu=req.allow_no_gpu,
                            read_provenance=False, live=Live(say))  # a line per check as it ends
    if not verified.ok:
        raise ProofFailed(tag=req.tag, what="the base's smoke tests failed in the project image",
                          more=verified.format(None).splitlines()[-12:])
    done.append(f"smoke tests: passed ({'GPU' if verified.require_gpu else 'CPU'}, {time.monotonic() - started:.0f} s)")
    say(f"proof: {done[-1]}")
    for check in req.checks:
        run = engine.run(image, ["/bin/sh", "-c", check], timeout=CHECK_TIMEOUT_S)
        if run.exit_code != 0 or run.timed_out:
            tail = run.output.strip().splitlines()[-5:]
            why = "timed out" if run.timed_out else f"exit {run.exit_code}"
            raise ProofFailed(tag=req.tag, what=f"--check {check!r} failed ({why})", more=tail)
        done.append(f"check: {check}")
        say(f"proof: {done[-1]}")
    return done


def _mount_base(registry: Any, base: Any, tag: str) -> int:
    """The base's blobs linked into `tag`'s repository before the push, where both are in one
    registry: the engine then finds them there and uploads only the project's. (The engine
    mounts on its own only blobs it knows came from that registry, which a base built here and
    published by imagebuilder's own writer are not.)"""
    if not names_a_registry(base.name) or parse_reference(base.name).host != parse_reference(tag).host:
        return 0
    source = f"{parse_reference(base.name).name}@{base.digest}"
    mounted = 0
    for digest in registry.blobs(source):
        if not registry.has_blob(tag, digest) and registry.mount(tag, digest, source):
            mounted += 1
    return mounted


def _arch(engine: Engine, image: str) -> str:
    return str(engine.inspect_image(image).get("Architecture") or AMD64.arch)


def _sbom(engine: ProjectEngine, image: str, base_digest: str, lock_digest: str) -> bytes:
    run = engine.run(image, ["python3", "/opt/imagebuilder/sbom.py", "/opt/venv", "/dev/stdout"], timeout=300)
    doc, _ = json.JSONDecoder().raw_decode(run.output[run.output.index("{"):])  # its digest line follows
    metadata = doc.setdefault("metadata", {})
    metadata.setdefault("properties", []).extend([
        {"name": "io.imagebuilder.project.base.digest", "value": base_digest},
        {"name": "io.imagebuilder.project.lock", "value": lock_digest}])
    return json.dumps(doc, sort_keys=True).encode()


class _NoRegistry:
    """A local candidate image has no registry: verify reads nothing from one."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None
