"""verify's pipelines: preflight, then the smoke tests in a container with every GPU
(verify_image, verify_published) or in this Python environment (verify_local), always
under a time limit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import smoke_tests
from smoke_tests.result import FAIL

from ..engine.api import NO_ACCESS, Runner
from ..engine.errors import ContainerFailed, GpuUnavailable, ImageMissing
from ..registry.reference import parse_reference
from ..trust.cosign import Cosign
from ..trust.signature_check import Store, check_image
from ..trust.signing import key_reference
from .facts import RegistryReader, collect_facts, collect_local_facts, registry_built_from
from .labels import check_labels
from .lend import CONTAINER_SMOKE_TESTS, LENT_MANIFEST, lend_notice, probe_torch, smoke_tests_archive
from .output import SmokeOutput, in_local, parse_output, tail
from .preflight import Preflight, PreflightItem, preflight
from .report import NOT_RUN, SIGNATURE_ONLY, Live, VerifyReport


class PublishedRegistry(Store, RegistryReader, Protocol):
    """verify_published's registry: the signature's store, and what verify_image reads."""

DEFAULT_TIMEOUT = 1800.0
"""Seconds for the whole smoke-test run; smoke_tests gives each check 300s of its own."""
SHM_SIZE = "1g"
"""NCCL's shared-memory transport needs more than Docker's 64 MiB default."""

# --------------------------------------------------------------------------- pipelines


def smoke_command(python: str, *, require_gpu: bool, manifest: str | None = None) -> list[str]:
    command = [python, "-m", "smoke_tests", "--json"]
    if manifest:
        command += ["--manifest", manifest]
    # Explicit both ways: in an image built for CUDA the smoke tests require a GPU by default.
    command.append("--require-gpu" if require_gpu else "--allow-no-gpu")
    return command


def verify_image(engine: Runner, ref: str, *, registry: RegistryReader | None = None, allow_no_gpu: bool = False,
                 timeout: float = DEFAULT_TIMEOUT, mount_smoke_tests: bool = False,
                 read_provenance: bool = True, live: Live | None = None) -> VerifyReport:
    """Preflight the daemon's host for `ref`, then run the smoke tests in a container from it.
    A registry image's provenance (where it was built from) is read from `registry`, which is
    also asked for the layers' compression of an image the daemon must pull; None: the image is
    this engine's (a candidate not yet pushed) and nothing is read from a registry.

    The container gets every GPU, a 1 GiB /dev/shm and `timeout` seconds; it is removed
    afterwards in every case (the engine's run() guarantees it, Ctrl-C included).
    An image without imagebuilder's labels (a plain `pip install torch` image, pytorch/pytorch)
    has no smoke tests of its own: it is lent this imagebuilder's, with what its own torch
    reports as the expectations, and the report carries a notice saying so. mount_smoke_tests
    lends them to any image, e.g. one an older imagebuilder built.
    """
    started = time.monotonic()
    parse_reference(ref, "verify")  # an invalid one is refused before the daemon is asked
    facts = collect_facts(engine, ref, registry)
    checked = preflight(facts, allow_no_gpu=allow_no_gpu)
    require_gpu = checked.use_gpus or not allow_no_gpu
    if live is not None:
        live.head(VerifyReport(ref, "docker", checked.items, require_gpu=require_gpu))
    if not checked.ok:
        return VerifyReport(ref, "docker", checked.items, error=NOT_RUN, require_gpu=require_gpu,
                            seconds=time.monotonic() - started, bad_request=facts.image_not_found, rdma=facts.rdma)
    environment = {"PYTHONDONTWRITEBYTECODE": "1"}
    archives: dict[str, bytes] = {}
    manifest: str | None = None
    notices: tuple[str, ...] = ()
    if mount_smoke_tests or not facts.built_by_imagebuilder:
        expected, not_torch = (None, None) if facts.built_by_imagebuilder else probe_torch(engine, ref, timeout)
        if not_torch is not None:
            return VerifyReport(ref, "docker", checked.items, require_gpu=require_gpu, bad_request=True,
                                error=f"not a PyTorch image: {not_torch}; verify an image with torch "
                                      "(`imagebuilder build` makes them)", seconds=time.monotonic() - started)
        archives["/"] = smoke_tests_archive(expected)
        # Ahead of the image's own copy, which a .pth file puts on sys.path.
        environment["PYTHONPATH"] = CONTAINER_SMOKE_TESTS
        manifest = LENT_MANIFEST if expected is not None else None
        notices = (lend_notice(ref, expected, asked=mount_smoke_tests),)
    rdma = facts.rdma
    command = smoke_command("python3", require_gpu=require_gpu, manifest=manifest)
    options: dict[str, Any] = dict(timeout=timeout, gpus=checked.use_gpus, shm_size=SHM_SIZE, environment=environment,
                                   archives=archives or None, on_output=live.output if live is not None else None)
    try:
        try:
            run = engine.run(ref, command, access=rdma.given if rdma is not None else NO_ACCESS, **options)
        except ContainerFailed as e:
            if rdma is None or not rdma.given:
                raise
            # A daemon that may not raise memlock (rootless) refuses the RDMA flags: verify the
            # image without them, and the warning says what the daemon said.
            rdma = replace(rdma, given=NO_ACCESS, refused=e.detail)
            run = engine.run(ref, command, **options)
    except GpuUnavailable as e:
        items = checked.items + (PreflightItem("runtime", FAIL, str(e)),)
        return VerifyReport(ref, "docker", items, error=NOT_RUN, require_gpu=require_gpu,
                            seconds=time.monotonic() - started, notices=notices, rdma=rdma)
    except (ContainerFailed, ImageMissing) as e:
        return VerifyReport(ref, "docker", checked.items, error=str(e), require_gpu=require_gpu,
                            seconds=time.monotonic() - started, notices=notices, rdma=rdma)
    parsed = parse_output(run.output, run.exit_code, timed_out=run.timed_out, timeout=timeout)
    report = _report(ref, "docker", checked, parsed, run.output, require_gpu, time.monotonic() - started)
    labelled = check_labels(facts.labels, parsed.checks)
    return replace(report, notices=notices, rdma=rdma, checks=report.checks + ((labelled,) if labelled else ()),
                   built_from=registry_built_from(registry, ref) if read_provenance else None)


def verify_published(engine: Runner, tag: str, *, key: str | None, signature_only: bool = False,
                     registry: PublishedRegistry, cosign: Cosign | None = None, allow_no_gpu: bool = False,
                     timeout: float = DEFAULT_TIMEOUT, mount_smoke_tests: bool = False,
                     live: Live | None = None) -> VerifyReport:
    """The signature of the digest `tag` names in its registry first (signed by `key`, with its
    SBOM attested), before any container starts; then, unless that failed or `signature_only`,
    verify_image() on that very digest (on `tag` when no key pinned one). Without a key the
    report only says whether the image is signed. `registry` holds the signature and the image."""
    started = time.monotonic()
    if key is not None:
        key = key_reference(key, "--key")
        cosign = (cosign or Cosign()).require()
    signature = check_image(tag, key=key, store=registry, cosign=cosign or Cosign())
    if signature_only or not signature.ok:
        return VerifyReport(tag, SIGNATURE_ONLY, (), signature=signature, seconds=time.monotonic() - started)
    ref = signature.pinned if key is not None and signature.pinned else tag
    if live is not None:
        live.echo(signature.line())  # the head verify_image shows knows no signature
    report = verify_image(engine, ref, registry=registry, allow_no_gpu=allow_no_gpu, timeout=timeout,
                          mount_smoke_tests=mount_smoke_tests, live=live)
    return replace(report, signature=signature, seconds=time.monotonic() - started)


def verify_local(*, allow_no_gpu: bool = False, timeout: float = DEFAULT_TIMEOUT,
                 manifest: str | None = None, python: str | None = None,
                 target: str | None = None, live: Live | None = None) -> VerifyReport:
    """The same checks in this Python environment (bare-metal hosts, pods), in a subprocess
    under `timeout`, so that a hung CUDA call or compile cannot hang verify."""
    started = time.monotonic()
    python = python or sys.executable
    target = target or f"local {python}"
    checked = preflight(collect_local_facts(manifest), allow_no_gpu=allow_no_gpu)
    require_gpu = checked.use_gpus or not allow_no_gpu
    if live is not None:
        live.head(VerifyReport(target, "local", checked.items, require_gpu=require_gpu))
    if not checked.ok:
        return VerifyReport(target, "local", checked.items, error=NOT_RUN, require_gpu=require_gpu,
                            seconds=time.monotonic() - started)
    command = smoke_command(python, require_gpu=require_gpu, manifest=manifest)
    output, exit_code, timed_out = run_process(command, timeout=timeout, env=_local_env(),
                                               on_output=live.output if live is not None else None)
    parsed = parse_output(output, exit_code, timed_out=timed_out, timeout=timeout, python=in_local(python))
    return _report(target, "local", checked, parsed, output, require_gpu, time.monotonic() - started)


def _local_env() -> dict[str, str]:
    # The smoke tests this imagebuilder ships, also when `python` has imagebuilder only on sys.path.
    root = str(Path(smoke_tests.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{path}" if path else root}


def run_process(command: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None,
                on_output: Callable[[str], None] | None = None) -> tuple[str, int | None, bool]:
    """(stdout then stderr, exit code, timed out). The process and everything it started
    (NCCL's workers, compiler jobs) is killed at the timeout and on Ctrl-C. `on_output` is
    told each line of stderr as it comes (the smoke tests' progress)."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               errors="replace", env=dict(env) if env is not None else None,
                               start_new_session=True)
    out: list[str] = []
    err: list[str] = []

    def drain(stream: Any, into: list[str], each: Callable[[str], None] | None) -> None:
        for line in stream:
            into.append(line)
            if each is not None:
                each(line.rstrip("\n"))

    readers = [threading.Thread(target=drain, args=(process.stdout, out, None), daemon=True),
               threading.Thread(target=drain, args=(process.stderr, err, on_output), daemon=True)]
    for reader in readers:
        reader.start()
    timed_out = False
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        process.wait()
        timed_out = True
    except BaseException:
        _kill_group(process)
        process.wait()
        raise
    for reader in readers:
        reader.join()
    return "".join(out) + "".join(err), None if timed_out else process.returncode, timed_out


def _kill_group(process: subprocess.Popen[str]) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _report(target: str, mode: str, checked: Preflight, parsed: SmokeOutput, output: str,
            require_gpu: bool, seconds: float) -> VerifyReport:
    went_wrong = parsed.error is not None or not parsed.checks
    return VerifyReport(
        target, mode, checked.items, checks=parsed.checks, error=parsed.error,
        output_tail=tail(output) if went_wrong else (), torch=parsed.torch,
        gpu_count=parsed.gpu_count, seconds=seconds, require_gpu=require_gpu,
    )


