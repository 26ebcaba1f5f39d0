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
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from .. import __version__
from ..engine.api import Builder, BuildRequest, Engine
from ..engine.progress import ProgressPrinter
from ..errors import BadRequest, ImageBuilderError
from ..platforms import AMD64, platform_of_arch
from ..registry.reference import parse_reference
from ..verify.report import Live
from ..verify.run import verify_image
from ..trust.provenance import ProjectBuild, project_provenance
from ..trust.signature_check import names_a_registry
from ..trust.signing import Signed
from .base import find_base
from .lock import ProjectLock, resolve
from .probe import Venv, family_differences, probe
from .rebase import RebasePlan, plan_rebase, push_rebased, rebased
from .render import BaseFacts, render_project
from .report import BUILD, PROVE, PUSH, RESOLVE, SIGN, TAG, ProjectReport, kept
from .source import LOCK_FILE, Project, read_project

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


class ProjectSigner(Protocol):
    """Signs a pushed project image, its SBOM and provenance attested (trust.signing.KeySigner)."""

    def sign(self, target: str, sbom: bytes | None, provenance: bytes | None = None) -> Signed: ...


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


def project_command(req: ProjectRequest, *, engine: ProjectEngine, builder: Builder, registry: Any,
                    say: Callable[[str], None], signer: ProjectSigner | None = None,
                    cosign: Any = None) -> ProjectReport:
    """The run; its --report is written however it ends (project/report.py)."""
    parse_reference(req.tag, "--tag")  # refused before the daemon is asked
    if req.rebase is not None and not req.push:
        raise RebaseNeedsPush()
    project = req.project or read_project(req.path, req.uv)
    if req.key is not None and not names_a_registry(req.base):
        raise NeedsRegistryBase(ref=req.base)
    report = ProjectReport(tag=req.tag, project=str(project.path), base=req.base)
    run = uuid.uuid4().hex[:12]  # never shared by two runs
    started = _now()
    with kept(report, req.report):
        base, _labels = find_base(engine, req.base, say)
        report.base, report.base_digest = base.name, base.digest
        if req.key is not None:
            from ..trust.signature_check import check_image

            checked = check_image(req.base, key=req.key, store=registry, cosign=cosign)
            say(checked.line())
            if not checked.ok:
                raise ProofFailed(tag=req.tag, what=f"the base's signature does not verify: {checked.detail}")
        say(f"base: {base.name} ({base.digest}), python {base.python}; reading its packages")
        report.phase = RESOLVE
        base_venv = probe(engine, base.image_id)
        platform = (platform_of_arch(_arch(engine, base.image_id)) or AMD64).uv_platform
        lock = resolve(project, uv=req.uv, base_dists=base_venv.dists, base_name=base.name, python=base_venv.python,
                       platform=platform, index_args=req.index_args, locked=req.locked)
        report.lock, report.lock_reused = lock.digest, lock.reused
        say(f"lock: {'reused' if lock.reused else 'resolved and wrote'} {project.path / LOCK_FILE} "
            f"({len(lock.pins.pins)} package(s) beyond the base)")
        provenance = _Provenance(req, project.name or project.path.name, base, lock, run, started)
        if req.rebase is not None:
            plan = plan_rebase(registry, req.rebase, req.base, lock.digest)
            if isinstance(plan, RebasePlan):
                _rebase(plan, req, engine, registry, base, base_venv, report, say, signer, provenance)
                return report
            say(f"rebase: not sound ({plan}); building the project's layers instead")
            report.rebased = ""
        _build_and_prove(req, project, base, base_venv, lock, run, engine, builder, report, say)
        if req.push:
            report.phase = PUSH
            mounted = _mount_base(registry, base, req.tag)
            if mounted:
                say(f"push: {mounted} blob(s) of the base mounted into {parse_reference(req.tag).name}")
            pushed = engine.push_counted(req.tag)
            report.pushed_digest = pushed.digest
            report.uploaded_blobs = len(pushed.uploaded)
            report.uploaded = sorted(pushed.uploaded)
            report.uploaded_bytes = pushed.uploaded_bytes(registry.blobs(req.tag))
            say(f"pushed {req.tag} ({pushed.digest}); {len(pushed.uploaded)} layer(s) uploaded, the base's mounted "
                "or there")
            if signer is not None:
                report.phase = SIGN
                target = f"{parse_reference(req.tag).name}@{pushed.digest}"
                report.signed = signer.sign(target, _sbom(engine, req.tag, base.digest, lock.digest),
                                            provenance.document()).to_json()
                say(f"signed {target} (its SBOM and provenance attested)")
    return report


def _build_and_prove(req: ProjectRequest, project: Project, base: BaseFacts, base_venv: Venv, lock: ProjectLock,
                     run: str, engine: ProjectEngine, builder: Builder, report: ProjectReport,
                     say: Callable[[str], None]) -> None:
    """The project's layers built under a name of this run's, proven, then tagged --tag (or removed)."""
    report.phase = BUILD
    alias = f"imagebuilder-project-base:{run}" if base.local else ""
    rendered = render_project(project, base, lock.pins, lock.digest, index_args=req.index_args,
                              ca=req.ca_bundle is not None, local_alias=alias)
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
        printer = ProgressPrinter("project")
        if alias:
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
            if alias:
                engine.remove_image(alias, force=False)  # the name only: the base stays
    report.image_id, report.build_seconds = built.image_id, round(built.seconds, 1)
    report.executed_steps, report.cached_steps = built.executed_steps, built.cached_steps
    report.phase = PROVE
    try:
        report.proof = _prove(engine, candidate, base_venv, req, say)
        report.phase = TAG
        engine.tag_image(candidate, req.tag)
    except BaseException:
        engine.remove_image(candidate, force=True)  # proven or nothing: no tag, no image left
        raise
    engine.remove_image(candidate, force=False)  # the name only: the image stays under --tag
    say(f"tagged {req.tag}")


@dataclass(frozen=True)
class _Provenance:
    """What the project image's provenance says (trust/provenance.py), finished when it is asked for."""

    req: ProjectRequest
    project: str
    base: BaseFacts
    lock: ProjectLock
    run: str
    started: str

    def document(self) -> bytes:
        repository = parse_reference(self.base.name).name if not self.base.local else self.base.name
        build = ProjectBuild(project=self.project, tag=self.req.tag, base_name=self.base.name,
                             base_repository=repository, base_digest=self.base.digest, lock_file=LOCK_FILE,
                             lock_digest=self.lock.digest, checks=self.req.checks, builder_version=__version__,
                             invocation=self.run, started=self.started, finished=_now())
        return json.dumps(project_provenance(build), sort_keys=True).encode()


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _rebase(plan: RebasePlan, req: ProjectRequest, engine: ProjectEngine, registry: Any, base: BaseFacts,
            base_venv: Venv, report: ProjectReport, say: Callable[[str], None], signer: ProjectSigner | None,
            provenance: _Provenance) -> None:
    """The project's layers from `plan.old` on the new base, in the registry; pulled and proven
    as a build is; tagged only then."""
    report.phase = PUSH
    config, manifest = rebased(plan, base.name, base.digest)
    digest, uploaded = push_rebased(registry, plan, req.tag, config, manifest)
    pinned = f"{parse_reference(req.tag).name}@{digest}"
    say(f"rebase: {len(plan.own_layers)} layer(s) of {req.rebase} on {base.name}, mounted; {pinned}")
    engine.pull(pinned)
    report.phase = PROVE
    try:
        report.proof = _prove(engine, pinned, base_venv, req, say)
    except BaseException:
        engine.remove_image(pinned, force=True)
        raise
    report.phase = TAG
    registry.put_tag(req.tag, digest)
    engine.tag_image(pinned, req.tag)
    report.rebased, report.pushed_digest, report.uploaded_blobs = req.rebase, digest, uploaded
    report.image_id = str(engine.inspect_image(req.tag).get("Id") or "")
    say(f"tagged and pushed {req.tag} ({digest}); {uploaded} blob(s) uploaded (the config), every layer mounted")
    if signer is not None:
        report.phase = SIGN
        report.signed = signer.sign(pinned, _sbom(engine, req.tag, base.digest, report.lock),
                                    provenance.document()).to_json()
        say(f"signed {pinned} (its SBOM and provenance attested)")


def _prove(engine: ProjectEngine, image: str, base_venv: Venv, req: ProjectRequest,
           say: Callable[[str], None]) -> list[str]:
    """Each proof that passed, one line each; the first that fails raises (the image is removed)."""
    done = []
    problems = family_differences(base_venv, probe(engine, image))
    if problems:
        raise ProofFailed(tag=req.tag, what="the torch stack is not the base's", more=problems)
    done.append(f"torch stack: {len(base_venv.family)} distribution(s) byte-for-byte the base's (RECORD and files)")
    say(f"proof: {done[-1]}")
    started = time.monotonic()
    # No registry: the candidate is this engine's (a rebased image is pulled already).
    verified = verify_image(engine, image, registry=None, allow_no_gpu=req.allow_no_gpu,
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


def _mount_base(registry: Any, base: BaseFacts, tag: str) -> int:
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
