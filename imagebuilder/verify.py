"""Will PyTorch jobs in this image work on this machine? Preflight the host, run smoke_tests/.

Two steps, each a pure function beside a thin I/O wrapper:

- preflight(): HostFacts (daemon, image, NVIDIA runtime, GPUs, driver) -> items that pass,
  fail or skip; collect_facts() gathers the facts from the daemon's host, never from this
  client (DOCKER_HOST may be another machine): the runtimes from the daemon's info, the GPUs
  and driver from nvidia-smi in a short container of the image itself. A failed preflight
  stops there: the smoke tests would only fail again, slower and less clearly.
- the smoke tests run in a container with every GPU (verify_image) or in this Python
  environment (verify_local), always under a time limit; parse_output() reads their JSON
  report out of whatever else the process printed. An image imagebuilder did not build is
  lent this imagebuilder's smoke tests, copied in through the API, with the versions its own
  torch reports as the expectations.

Both return a VerifyReport; the CLI prints it and `raise_if_failed()` turns a failure into
VerificationFailed (exit 1). `publish` calls verify_image() once per image.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import smoke_tests
from smoke_tests.driver import FAIL as DRIVER_FAIL
from smoke_tests.driver import judge_driver
from smoke_tests.expected import DEFAULT_MANIFEST, ManifestError, load_expected
from smoke_tests.report import check_line, format_table, read_progress, summary
from smoke_tests.result import FAIL, PASS, SKIP, Result

from .engine.errors import (ContainerFailed, DaemonUnavailable, GpuUnavailable, ImageMissing, PullFailed,
                            names_nothing, refuses_gpus)
from .errors import BadRequest, ImageBuilderError
from .engine.export import cannot_pull, compression_of
from . import labels
from .provenance import BuiltFrom, built_from
from .reference import names_domain, parse_reference
from .matrix import driver_key

if TYPE_CHECKING:
    from .engine.api import Runner, RunResult
    from .signing import Cosign, SignatureCheck, Store

DEFAULT_TIMEOUT = 1800.0
"""Seconds for the whole smoke-test run; smoke_tests gives each check 300s of its own."""
SHM_SIZE = "1g"
"""NCCL's shared-memory transport needs more than Docker's 64 MiB default."""
NVIDIA_SMI_TIMEOUT = 30.0
"""nvidia-smi hangs rather than fails on some broken drivers; also covers the container start."""
NVIDIA_SMI = ("nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader")
PROBE_TIMEOUT = 120.0
"""Seconds for the torch probe of an image without a manifest (importing torch takes a few)."""
TAIL_LINES = 40
CONTAINER_SMOKE_TESTS = "/opt/imagebuilder/host"
"""Where this imagebuilder's smoke_tests package goes in a container of an image that is lent them."""
LENT_MANIFEST = f"{CONTAINER_SMOKE_TESTS}/manifest.json"

MIN_DRIVER_LABEL = labels.MIN_DRIVER
MIN_DRIVER_COMPAT_LABEL = labels.MIN_DRIVER_COMPAT
CUDA_LABEL = labels.CUDA
BUILT_LABEL = labels.INPUTS_HASH
"""Every image imagebuilder builds carries it, and with it smoke_tests and a manifest."""


class VerificationFailed(ImageBuilderError):
    """The image (or this environment) did not pass; `failures` is (name, reason) pairs."""

    target: str
    failures: Sequence[tuple[str, str]]

    def describe(self) -> str:
        what = "; ".join(f"{name}: {reason}" for name, reason in self.fields["failures"])
        return f"{self.fields['target']} failed verification: {what}"


class NotVerifiable(VerificationFailed, BadRequest):
    """Nothing to verify as asked: the image exists nowhere, or is not a PyTorch image (exit 2)."""


# --------------------------------------------------------------------------- preflight


@dataclass(frozen=True)
class Gpu:
    name: str
    driver: str


@dataclass(frozen=True)
class HostFacts:
    """What preflight() judges; collect_facts() gathers it. None errors mean "fine"."""

    gpus: tuple[Gpu, ...] = ()
    gpu_error: str | None = None
    """Why no GPU is listed: no GPU runtime, nvidia-smi missing, failing or hanging."""
    min_driver: str | None = None
    """The image's (or manifest's) minimum NVIDIA driver; None: not declared."""
    min_driver_compat: str | None = None
    """Its floor through CUDA minor-version compatibility; None: not declared (min_driver rules)."""
    cuda: str | None = None
    """The image's CUDA version, to say what needs the driver."""
    in_container: bool = True
    """False for --local: no daemon, image or container runtime involved."""
    daemon_error: str | None = None
    image_error: str | None = None
    image_not_found: bool = False
    """The registry says there is no such image: the request's mistake, not the world's."""
    pulled: bool = False
    nvidia_runtime: str | None = None
    """How the daemon gives containers GPUs: its nvidia runtime, a CDI device, or device requests."""
    built_by_imagebuilder: bool = True
    """The image carries imagebuilder's labels, and so its own smoke_tests and manifest."""
    compression: str | None = None
    """The registry image's layer compression ("zstd", "gzip"); None: local or unknown."""
    compression_error: str | None = None
    """Why the daemon cannot pull that compression (export.cannot_pull); None: it can."""


@dataclass(frozen=True)
class PreflightItem:
    name: str
    status: str
    """PASS, FAIL or SKIP, as the smoke tests' results."""
    detail: str

    @property
    def failed(self) -> bool:
        return self.status == FAIL

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail}


@dataclass(frozen=True)
class Preflight:
    items: tuple[PreflightItem, ...]
    use_gpus: bool
    """Pass every GPU into the container and require them in the smoke tests."""

    @property
    def ok(self) -> bool:
        return not any(item.failed for item in self.items)

    @property
    def problems(self) -> tuple[PreflightItem, ...]:
        return tuple(item for item in self.items if item.failed)


INSTALL_TOOLKIT = (
    "install the NVIDIA Container Toolkit on the Docker daemon's host, then `sudo nvidia-ctk "
    "runtime configure --runtime=docker && sudo systemctl restart docker`"
)
NO_RUNTIME = (
    "no NVIDIA container runtime: the daemon's info lists no `nvidia` runtime and no CDI device "
    f"nvidia.com/gpu, and it refused a GPU device request; {INSTALL_TOOLKIT}"
)


def preflight(facts: HostFacts, *, allow_no_gpu: bool) -> Preflight:
    """Judge the host: every item that can be judged, so all problems show at once.

    In a container the GPUs are read through the daemon from the image, so nothing past a
    failed daemon or image item can be judged.
    """
    items: list[PreflightItem] = []
    if facts.in_container:
        items += _container_items(facts)
        if any(item.failed for item in items):
            return Preflight(tuple(items), use_gpus=False)
    gpus = facts.gpus
    if gpus:
        names = sorted({gpu.name for gpu in gpus})
        items.append(PreflightItem("gpu", PASS, f"{len(gpus)} GPU(s): {', '.join(names)}"))
    else:
        why = facts.gpu_error or "nvidia-smi lists none"
        host = "the Docker daemon's host" if facts.in_container else "this host"
        if allow_no_gpu:
            items.append(PreflightItem("gpu", SKIP, f"no NVIDIA GPU visible ({why}); "
                                                    "--allow-no-gpu: running the CPU mode"))
        else:
            items.append(PreflightItem("gpu", FAIL, f"no NVIDIA GPU visible on {host} ({why}); run "
                                                    "on a GPU host, or pass --allow-no-gpu for the CPU "
                                                    "mode (CI runners)"))
    if facts.in_container:
        items.append(_runtime_item(facts))
    items.append(_driver_item(facts))
    return Preflight(tuple(items), use_gpus=bool(gpus))


def _container_items(facts: HostFacts) -> list[PreflightItem]:
    if facts.daemon_error is not None:
        return [PreflightItem("daemon", FAIL, facts.daemon_error)]
    items = [PreflightItem("daemon", PASS, "the Docker daemon answers")]
    if facts.compression_error is not None:
        return [*items, PreflightItem("compression", FAIL, facts.compression_error)]
    if facts.image_error is not None:
        items.append(PreflightItem("image", FAIL, facts.image_error))
    else:
        items.append(PreflightItem("image", PASS, "pulled" if facts.pulled else "present locally"))
    return items


def _runtime_item(facts: HostFacts) -> PreflightItem:
    if facts.nvidia_runtime is not None:
        return PreflightItem("runtime", PASS, facts.nvidia_runtime)
    if not facts.gpus:
        return PreflightItem("runtime", SKIP, "no GPU to pass into the container")
    return PreflightItem("runtime", FAIL, NO_RUNTIME)


def _driver_item(facts: HostFacts) -> PreflightItem:
    if not facts.gpus:
        return PreflightItem("driver", SKIP, "no GPU, no driver to check")
    host = min(facts.gpus, key=lambda gpu: _driver_or_zero(gpu.driver)).driver
    if facts.min_driver is None:
        return PreflightItem("driver", SKIP, f"host driver {host}; the image declares no minimum "
                                             f"({MIN_DRIVER_LABEL} label or manifest min_driver)")
    try:
        verdict = judge_driver(host, facts.min_driver, facts.min_driver_compat, facts.cuda)
    except ValueError:
        return PreflightItem("driver", FAIL, f"cannot compare host driver {host!r} with the image's "
                                             f"minimum {facts.min_driver!r}: not a dotted number")
    # Between the compatibility floor and min_driver the image runs without PTX JIT; only
    # the smoke tests' cuda check knows whether a GPU needs it (it has torch's arch list).
    return PreflightItem("driver", FAIL if verdict.status == DRIVER_FAIL else PASS, verdict.detail)


def _driver_or_zero(version: str) -> tuple[int, ...]:
    try:
        return driver_key(version)
    except ValueError:
        return (0,)


# --------------------------------------------------------------------------- host facts (I/O)


def parse_nvidia_smi(text: str) -> tuple[Gpu, ...]:
    """`nvidia-smi --query-gpu=name,driver_version --format=csv,noheader` -> GPUs."""
    gpus = []
    for line in text.splitlines():
        name, sep, driver = line.rpartition(",")
        if sep and name.strip() and driver.strip():
            gpus.append(Gpu(name.strip(), driver.strip()))
    return tuple(gpus)


def host_gpus() -> tuple[tuple[Gpu, ...], str | None]:
    """The GPUs nvidia-smi lists on this host, or why there are none."""
    command = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT,
                              check=False)
    except FileNotFoundError:
        return (), "nvidia-smi not found: no NVIDIA driver installed"
    except subprocess.TimeoutExpired:
        return (), f"nvidia-smi did not answer within {NVIDIA_SMI_TIMEOUT:g}s: the driver is stuck"
    if done.returncode != 0:
        said = " ".join((done.stdout + done.stderr).split())[:200]
        return (), f"nvidia-smi failed with exit code {done.returncode}: {said}"
    gpus = parse_nvidia_smi(done.stdout)
    return gpus, None if gpus else "nvidia-smi lists none"


def daemon_runtime(info: Mapping[str, Any]) -> str | None:
    """How the daemon says it gives containers GPUs, from its info (None: it does not say).

    The daemon's host may be another machine: its info is the only view of its runtimes and
    CDI devices (DiscoveredDevices, Engine API 1.50+); the CDI spec files are not ours to read.
    """
    if "nvidia" in (info.get("Runtimes") or {}):
        return "the daemon lists the nvidia runtime"
    for device in info.get("DiscoveredDevices") or ():
        name = str(device.get("ID", "")) if isinstance(device, Mapping) else ""
        if name.startswith("nvidia.com/gpu"):
            return f"the daemon lists the CDI device {name}"
    return None


@dataclass(frozen=True)
class GpuProbe:
    """What nvidia-smi said in a container of the image run with every GPU."""

    gpus: tuple[Gpu, ...]
    error: str | None
    accepted: bool
    """The daemon started a container with a GPU device request."""


def read_gpu_probe(outcome: RunResult | str) -> GpuProbe:
    """Pure: the GPU probe's run, or the daemon's refusal to start it with GPUs -> GPUs or why none."""
    if isinstance(outcome, str):
        if "executable file not found" in outcome:
            return GpuProbe((), "the NVIDIA runtime mounted no nvidia-smi into the container: no "
                                "NVIDIA driver on the daemon's host?", accepted=True)
        if not refuses_gpus(outcome):
            return GpuProbe((), f"the daemon could not start any container ({outcome}): not a GPU "
                                "problem; `docker run --rm IMAGE true` shows the same, fix the daemon",
                            accepted=False)
        return GpuProbe((), f"the daemon could not start a container with GPUs ({outcome}): no GPU "
                            f"there, or {INSTALL_TOOLKIT}", accepted=False)
    if outcome.timed_out:
        return GpuProbe((), f"nvidia-smi did not answer within {NVIDIA_SMI_TIMEOUT:g}s: the driver is "
                            "stuck", accepted=True)
    if outcome.exit_code != 0:
        said = " ".join(outcome.output.split())[:200]
        return GpuProbe((), f"nvidia-smi failed with exit code {outcome.exit_code}: {said}", accepted=True)
    gpus = parse_nvidia_smi(outcome.output)
    return GpuProbe(gpus, None if gpus else "nvidia-smi lists none", accepted=True)


def probe_gpus(engine: Runner, ref: str) -> GpuProbe:
    """nvidia-smi in a container of `ref` with every GPU: the NVIDIA runtime mounts it in, so
    this sees the GPUs and driver of the daemon's host, whatever image and client."""
    try:
        run = engine.run(ref, list(NVIDIA_SMI), timeout=NVIDIA_SMI_TIMEOUT, gpus=True)
    except (GpuUnavailable, ContainerFailed) as e:
        return read_gpu_probe(e.detail)
    return read_gpu_probe(run)


def collect_facts(engine: Runner, ref: str) -> HostFacts:
    """The I/O half of preflight for an image: ask the daemon, pull if needed, probe the GPUs."""
    try:
        engine.ping()
    except DaemonUnavailable as e:
        return HostFacts(daemon_error=str(e))
    pulled = False
    if not engine.image_exists(ref):
        # Before the pull: a daemon that cannot pull zstd fails it with an obscure error.
        compression = registry_compression(ref)
        version = str(engine.info().get("ServerVersion") or "") or None
        why = cannot_pull(compression, version)
        if why is not None:
            return HostFacts(compression=compression, compression_error=why)
        try:
            engine.pull(ref)
            pulled = True
        except PullFailed as e:
            return HostFacts(image_error=f"image {ref} is not here and could not be pulled: {e.detail}; "
                                         "build it or check the reference and `docker login`",
                             image_not_found=names_nothing(e.detail))
    labels = engine.image_labels(ref)
    info: Mapping[str, Any] = engine.info()
    probe = probe_gpus(engine, ref)
    runtime = daemon_runtime(info)
    if runtime is None and probe.accepted:
        runtime = "the daemon accepted a GPU device request"
    return HostFacts(
        gpus=probe.gpus, gpu_error=probe.error,
        min_driver=labels.get(MIN_DRIVER_LABEL), min_driver_compat=labels.get(MIN_DRIVER_COMPAT_LABEL),
        cuda=labels.get(CUDA_LABEL),
        pulled=pulled, nvidia_runtime=runtime, built_by_imagebuilder=BUILT_LABEL in labels,
    )


def registry_compression(ref: str) -> str | None:
    """The layer compression of `ref` in its registry; None: not a registry image, or unknown."""
    from .registry import HttpRegistry, RegistryError

    try:
        if "/" not in ref or not names_domain(parse_reference(ref).host):
            return None
        return compression_of(media for _, media in HttpRegistry().blobs(ref).values())
    except (RegistryError, ValueError, OSError):
        return None


def registry_built_from(ref: str) -> BuiltFrom | None:
    """Where the registry image `ref` was built from, per its provenance; None: none readable."""
    from .registry import HttpRegistry, RegistryError

    try:
        if "/" not in ref or not names_domain(parse_reference(ref).host):
            return None
        predicate = HttpRegistry().provenance(ref)
    except (RegistryError, ValueError, OSError):
        return None
    return built_from(predicate) if predicate else None


def collect_local_facts(manifest: str | None) -> HostFacts:
    try:
        expected = load_expected(manifest)
    except ManifestError as e:
        raise BadRequest(f"{e}; pass --manifest with the image's manifest.json, or none") from e
    gpus, gpu_error = host_gpus()
    return HostFacts(gpus=gpus, gpu_error=gpu_error, min_driver=expected.min_driver,
                     min_driver_compat=expected.min_driver_compat, cuda=expected.image_cuda,
                     in_container=False)


# --------------------------------------------------------------------------- lent smoke tests


PROBE_PREFIX = "IMAGEBUILDER_PROBE "
TORCH_PROBE = f"""
import json, sys
found = {{"python": ".".join(map(str, sys.version_info[:3]))}}
try:
    import torch
    found.update(torch=torch.__version__, torch_cuda=torch.version.cuda)
except Exception as e:
    found["error"] = repr(e)
print({PROBE_PREFIX!r} + json.dumps(found))
"""


def expected_from_torch(output: str) -> dict[str, Any] | None:
    """Pure: the torch probe's output -> a manifest of what the image's own torch reports.

    Without a manifest that is the best statement of what the image is; None when the probe
    found no torch (the smoke tests then say why, in their own words).
    """
    for line in reversed(output.splitlines()):
        if line.startswith(PROBE_PREFIX):
            try:
                found = json.loads(line[len(PROBE_PREFIX):])
            except ValueError:
                return None
            if not isinstance(found, dict) or not found.get("torch"):
                return None
            return {"torch": found["torch"], "torch_cuda": found.get("torch_cuda"), "python": found.get("python")}
    return None


def not_pytorch(outcome: RunResult | str) -> str | None:
    """Pure: why the torch probe's run (or the daemon's refusal to start it) shows an image
    that is not a PyTorch image at all; None when it may be one."""
    text = outcome if isinstance(outcome, str) else outcome.output
    if re.search(r'executable file not found|exec: "python3"|python3: not found', text):
        return "it has no python3 on its PATH"
    if re.search(r"No module named .?torch.?[\"')]", text):
        return "its python3 cannot import torch"
    return None


def probe_torch(engine: Runner, ref: str, timeout: float) -> tuple[dict[str, Any] | None, str | None]:
    """What the image's own torch reports (None: not read), and why it is not a PyTorch image."""
    try:
        run = engine.run(ref, ["python3", "-c", TORCH_PROBE], timeout=min(PROBE_TIMEOUT, timeout))
    except ContainerFailed as e:
        return None, not_pytorch(e.detail)
    if run.timed_out:
        return None, None
    return expected_from_torch(run.output), not_pytorch(run)


def smoke_tests_archive(manifest: Mapping[str, Any] | None) -> bytes:
    """This imagebuilder's smoke_tests package, and the lent manifest, as a tar to unpack at /.

    Copied into the container through the API rather than bind-mounted: a remote daemon
    (DOCKER_HOST=ssh://...) has no such host path. Files only, so that unpacking creates
    what is missing and changes no directory the image has.
    """
    package = Path(smoke_tests.__file__).resolve().parent
    root = CONTAINER_SMOKE_TESTS.lstrip("/")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(package.rglob("*.py")):
            _add_file(tar, f"{root}/smoke_tests/{path.relative_to(package).as_posix()}", path.read_bytes())
        if manifest is not None:
            _add_file(tar, LENT_MANIFEST.lstrip("/"), json.dumps(manifest, indent=2).encode())
    return buffer.getvalue()


def _add_file(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    # Readable by whatever user the image runs as.
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
    tar.addfile(info, io.BytesIO(data))


def lend_notice(ref: str, expected: Mapping[str, Any] | None, *, asked: bool) -> str:
    why = "--mount-smoke-tests" if asked else "it carries no imagebuilder labels"
    if expected is not None:
        cuda = f"CUDA {expected['torch_cuda']}" if expected.get("torch_cuda") else "CPU build"
        expecting = f"expecting what its own torch reports: torch {expected['torch']} ({cuda})"
    elif asked:
        expecting = f"expecting what its manifest ({DEFAULT_MANIFEST}) says"
    else:
        expecting = "its torch could not be read, so there are no expectations"
    return (f"notice: {ref}: {why}, so it is verified with this imagebuilder's smoke tests, copied into "
            f"the container; {expecting}")


# --------------------------------------------------------------------------- smoke test output


@dataclass(frozen=True)
class SmokeOutput:
    """What one smoke-test process left: its report, or why there is none."""

    checks: tuple[Result, ...]
    torch: str | None = None
    gpu_count: int | None = None
    error: str | None = None


# Recognisable ways the run dies before printing its report, and what to say.
_DEATHS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"No module named smoke_tests|No module named 'smoke_tests'"),
     "the image has no smoke_tests package although it carries imagebuilder's labels; verify it "
     "with this imagebuilder's smoke tests (--mount-smoke-tests)"),
    (re.compile(r"No module named 'torch'"),
     "torch is not importable in {python}; {fix}"),
    (re.compile(r"executable file not found|python3: not found|No such file or directory.*python3"),
     "the image has no python3 on its PATH"),
)
_EXIT_MEANINGS = {137: "killed (out of memory?)", 139: "segmentation fault", 134: "aborted"}


IN_IMAGE = ("the image's Python", "install torch into the Python on its PATH")


def in_local(python: str) -> tuple[str, str]:
    return (f"{python} (the Python `verify --local` checks)",
            "install torch into it, or run verify --local with the Python that has torch "
            "(`/path/to/python -m imagebuilder verify --local`)")


def parse_output(output: str, exit_code: int | None, *, timed_out: bool = False,
                 timeout: float | None = None, python: tuple[str, str] = IN_IMAGE) -> SmokeOutput:
    """The smoke tests' JSON report from everything the process printed (warnings included).

    The last JSON object with a "checks" list wins: a report is printed last, and library
    warnings on the same stream must not break the parse.
    """
    if timed_out:
        return SmokeOutput((), error=f"the smoke tests did not finish within {timeout:g}s and were "
                                     "killed; raise --timeout or look at the output below")
    document = _last_report(output)
    if document is None:
        for pattern, meaning in _DEATHS:
            if pattern.search(output):
                return SmokeOutput((), error=meaning.format(python=python[0], fix=python[1]))
        how = _EXIT_MEANINGS.get(exit_code or 0, "")
        return SmokeOutput((), error=f"the smoke tests exited with code {exit_code}"
                                     f"{f' ({how})' if how else ''} without a report; see the output below")
    try:
        checks = tuple(Result.from_dict(check) for check in document["checks"])
    except (KeyError, TypeError, ValueError) as e:
        return SmokeOutput((), error=f"the smoke tests' report is malformed: {e}")
    gpu_count = document.get("gpu_count")
    result = SmokeOutput(checks, torch=document.get("torch"),
                         gpu_count=gpu_count if isinstance(gpu_count, int) else None)
    if exit_code not in (0, None) and not any(check.failed for check in checks):
        return SmokeOutput(checks, result.torch, result.gpu_count,
                           error=f"the smoke tests exited with code {exit_code} although no check failed")
    return result


def _last_report(output: str) -> dict[str, Any] | None:
    decoder = json.JSONDecoder()
    starts = [m.start(1) for m in re.finditer(r"(?m)^[ \t]*(\{)", output)]
    for start in reversed(starts):
        try:
            document, _ = decoder.raw_decode(output, start)
        except ValueError:
            continue
        if isinstance(document, dict) and isinstance(document.get("checks"), list):
            return document
    return None


def tail(output: str, lines: int = TAIL_LINES) -> tuple[str, ...]:
    return tuple(output.rstrip("\n").splitlines()[-lines:]) if output.strip() else ()


# --------------------------------------------------------------------------- report


NOT_RUN = "not run: preflight failed"
SIGNATURE_ONLY = "signature"
"""The mode of a report that checked the image's signature and started no container."""


# The live lines' name column: smoke_tests.checks (which imports torch) names them; the longest is 11.
CHECK_WIDTH = len("environment")


@dataclass
class Live:
    """verify's report while it is made, for people: the header and the preflight at once, then
    a line per check as it ends (the smoke tests' progress lines); format(live) prints the rest.
    An image whose smoke tests print no progress (an older build) gets its table at the end."""

    echo: Callable[[str], None]
    head_shown: bool = False
    checks_shown: int = 0

    def head(self, report: VerifyReport) -> None:
        for line in [*report.head_lines(), ""]:
            self.echo(line)
        self.head_shown = True

    def output(self, line: str) -> None:
        result = read_progress(line)
        if result is not None:
            if not self.checks_shown:
                self.echo(f"{'CHECK':<{CHECK_WIDTH}}  STATUS  REASON")
            self.echo(check_line(result, CHECK_WIDTH))
            self.checks_shown += 1


@dataclass(frozen=True)
class VerifyReport:
    target: str
    """The image reference, or "local <python>"."""
    mode: str
    """"docker" or "local"."""
    preflight: tuple[PreflightItem, ...]
    checks: tuple[Result, ...] = ()
    error: str | None = None
    """Why the smoke tests gave no verdict (not run, timed out, crashed); None when they did."""
    output_tail: tuple[str, ...] = ()
    """The run's last output lines when it went wrong, for the reader to see why."""
    torch: str | None = None
    gpu_count: int | None = None
    seconds: float = 0.0
    require_gpu: bool = True
    notices: tuple[str, ...] = ()
    """What the reader should know about how the image was judged (lent smoke tests)."""
    built_from: BuiltFrom | None = None
    """Where the image was built from, per its registry provenance attestation."""
    signature: SignatureCheck | None = None
    """The signature check of the digest the tag names (signing.check_image); None: not asked."""
    bad_request: bool = False
    """The failure is the request's (the image exists nowhere, is not a PyTorch image): exit 2."""

    @property
    def ok(self) -> bool:
        if self.signature is not None and not self.signature.ok:
            return False
        if self.mode == SIGNATURE_ONLY:
            return self.signature is not None
        return (self.error is None and bool(self.checks)
                and not any(item.failed for item in self.preflight)
                and not any(check.failed for check in self.checks))

    @property
    def failures(self) -> tuple[tuple[str, str], ...]:
        """(name, reason) of every failed preflight item and check, and of a run that died."""
        found = [(item.name, item.detail) for item in self.preflight if item.failed]
        if self.signature is not None and not self.signature.ok:
            found.append(("signature", self.signature.detail))
        if self.mode == SIGNATURE_ONLY:
            return tuple(found)
        if self.error is not None and self.error != NOT_RUN:
            found.append(("smoke tests", self.error))
        found += [(check.name, check.reason) for check in self.checks if check.failed]
        if not found and not self.checks:
            found.append(("smoke tests", "no check ran"))
        return tuple(found)

    def raise_if_failed(self) -> None:
        if not self.ok:
            error = NotVerifiable if self.bad_request else VerificationFailed
            raise error(target=self.target, failures=tuple(self.failures))

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "target": self.target,
            "mode": self.mode,
            "require_gpu": self.require_gpu,
            "torch": self.torch,
            "gpu_count": self.gpu_count,
            "seconds": round(self.seconds, 2),
            "preflight": [item.to_dict() for item in self.preflight],
            "checks": [check.to_dict() for check in self.checks],
            "error": self.error,
            "output_tail": list(self.output_tail),
            "notices": list(self.notices),
            "built_from": self.built_from.to_json() if self.built_from else None,
            "signature": self.signature.to_json() if self.signature is not None else None,
        }

    def head_lines(self) -> list[str]:
        """What is known before the smoke tests start: the header and the preflight table."""
        width = max([len("PREFLIGHT")] + [len(item.name) for item in self.preflight])
        lines = [f"verify {self.target} ({self.mode}"
                 f"{', GPUs required' if self.require_gpu else ', CPU mode allowed'})"]
        if self.signature is not None:
            lines.append(self.signature.line())
        lines.append(f"{'PREFLIGHT':<{width}}  STATUS  DETAIL")
        return lines + [f"{item.name:<{width}}  {item.status.upper():<6}  {item.detail}" for item in self.preflight]

    def format(self, live: Live | None = None) -> str:
        """For people: the preflight table, then the checks' table (or why there is none).
        After `live` showed the head and a line per check, the rest: the summary, the verdict."""
        verdict = f"{'OK' if self.ok else 'FAILED'}: {self.target} ({self.seconds:.1f}s)"
        if self.mode == SIGNATURE_ONLY:
            return "\n".join([self.signature.line() if self.signature else "signature: not checked", verdict])
        lines = [] if live is not None and live.head_shown else self.head_lines()
        if self.built_from is not None:
            lines += self.built_from.lines()
        if self.checks and not (live is not None and live.checks_shown == len(self.checks)):
            # The smoke tests' table without its own OK line: the verdict below is the one.
            lines += ["", *format_table(list(self.checks)).splitlines()[:-1]]
        lines.append(f"checks: {summary(list(self.checks))}" if self.checks else "")
        if self.error is not None:
            lines.append(f"smoke tests: {self.error}")
        if self.output_tail:
            lines.append(f"last {len(self.output_tail)} lines of output:")
            lines += [f"  | {line}" for line in self.output_tail]
        lines.append(verdict)
        return "\n".join(lines)


# --------------------------------------------------------------------------- pipelines


def smoke_command(python: str, *, require_gpu: bool, manifest: str | None = None) -> list[str]:
    command = [python, "-m", "smoke_tests", "--json"]
    if manifest:
        command += ["--manifest", manifest]
    # Explicit both ways: in an image built for CUDA the smoke tests require a GPU by default.
    command.append("--require-gpu" if require_gpu else "--allow-no-gpu")
    return command


def verify_image(engine: Runner, ref: str, *, allow_no_gpu: bool = False,
                 timeout: float = DEFAULT_TIMEOUT, mount_smoke_tests: bool = False,
                 read_provenance: bool = True, live: Live | None = None) -> VerifyReport:
    """Preflight the daemon's host for `ref`, then run the smoke tests in a container from it.
    A registry image's provenance (where it was built from) is read from the registry.

    The container gets every GPU, a 1 GiB /dev/shm and `timeout` seconds; it is removed
    afterwards in every case (the engine's run() guarantees it, Ctrl-C included).
    An image without imagebuilder's labels (a plain `pip install torch` image, pytorch/pytorch)
    has no smoke tests of its own: it is lent this imagebuilder's, with what its own torch
    reports as the expectations, and the report carries a notice saying so. mount_smoke_tests
    lends them to any image, e.g. one an older imagebuilder built.
    """
    started = time.monotonic()
    parse_reference(ref, "verify")  # an invalid one is refused before the daemon is asked
    facts = collect_facts(engine, ref)
    checked = preflight(facts, allow_no_gpu=allow_no_gpu)
    require_gpu = checked.use_gpus or not allow_no_gpu
    if live is not None:
        live.head(VerifyReport(ref, "docker", checked.items, require_gpu=require_gpu))
    if not checked.ok:
        return VerifyReport(ref, "docker", checked.items, error=NOT_RUN, require_gpu=require_gpu,
                            seconds=time.monotonic() - started, bad_request=facts.image_not_found)
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
    try:
        run = engine.run(ref, smoke_command("python3", require_gpu=require_gpu, manifest=manifest),
                         timeout=timeout, gpus=checked.use_gpus, shm_size=SHM_SIZE,
                         environment=environment, archives=archives or None,
                         on_output=live.output if live is not None else None)
    except GpuUnavailable as e:
        items = checked.items + (PreflightItem("runtime", FAIL, str(e)),)
        return VerifyReport(ref, "docker", items, error=NOT_RUN, require_gpu=require_gpu,
                            seconds=time.monotonic() - started, notices=notices)
    except (ContainerFailed, ImageMissing) as e:
        return VerifyReport(ref, "docker", checked.items, error=str(e), require_gpu=require_gpu,
                            seconds=time.monotonic() - started, notices=notices)
    parsed = parse_output(run.output, run.exit_code, timed_out=run.timed_out, timeout=timeout)
    report = _report(ref, "docker", checked, parsed, run.output, require_gpu, time.monotonic() - started)
    return replace(report, notices=notices, built_from=registry_built_from(ref) if read_provenance else None)


def verify_published(engine: Runner, tag: str, *, key: str | None, signature_only: bool = False,
                     store: Store | None = None, cosign: Cosign | None = None, allow_no_gpu: bool = False,
                     timeout: float = DEFAULT_TIMEOUT, mount_smoke_tests: bool = False,
                     live: Live | None = None) -> VerifyReport:
    """The signature of the digest `tag` names in its registry first (signed by `key`, with its
    SBOM attested), before any container starts; then, unless that failed or `signature_only`,
    verify_image() on that very digest (on `tag` when no key pinned one). Without a key the
    report only says whether the image is signed."""
    from .registry import HttpRegistry
    from .signing import Cosign, check_image, key_reference

    started = time.monotonic()
    if key is not None:
        key = key_reference(key, "--key")
        cosign = (cosign or Cosign()).require()
    signature = check_image(tag, key=key, store=store or HttpRegistry(), cosign=cosign or Cosign())
    if signature_only or not signature.ok:
        return VerifyReport(tag, SIGNATURE_ONLY, (), signature=signature, seconds=time.monotonic() - started)
    ref = signature.pinned if key is not None and signature.pinned else tag
    if live is not None:
        live.echo(signature.line())  # the head verify_image shows knows no signature
    report = verify_image(engine, ref, allow_no_gpu=allow_no_gpu, timeout=timeout,
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

