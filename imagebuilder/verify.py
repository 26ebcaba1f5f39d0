"""Will PyTorch jobs in this image work on this machine? Preflight the host, run smoke_tests/.

Two steps, each a pure function beside a thin I/O wrapper:

- preflight(): HostFacts (daemon, image, NVIDIA runtime, GPUs, driver) -> items that pass,
  fail or skip; collect_facts() gathers the facts. A failed preflight stops there: the
  smoke tests would only fail again, slower and less clearly.
- the smoke tests run in a container with every GPU (verify_image) or in this Python
  environment (verify_local), always under a time limit; parse_output() reads their JSON
  report out of whatever else the process printed.

Both return a VerifyReport; the CLI prints it and `raise_if_failed()` turns a failure into
VerificationFailed (exit 1). `publish` calls verify_image() once per image.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import smoke_tests
from smoke_tests.driver import FAIL as DRIVER_FAIL
from smoke_tests.driver import judge_driver
from smoke_tests.expected import ManifestError, load_expected
from smoke_tests.report import format_table
from smoke_tests.result import FAIL, PASS, SKIP, Result

from .errors import BadRequest, ImageBuilderError
from .matrix import driver_key
from .tags import LABEL_PREFIX

if TYPE_CHECKING:
    from .engine import Engine

DEFAULT_TIMEOUT = 1800.0
"""Seconds for the whole smoke-test run; smoke_tests gives each check 300s of its own."""
SHM_SIZE = "1g"
"""NCCL's shared-memory transport needs more than Docker's 64 MiB default."""
NVIDIA_SMI_TIMEOUT = 30.0
"""nvidia-smi hangs rather than fails on some broken drivers."""
TAIL_LINES = 40
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
CONTAINER_SMOKE_TESTS = "/opt/imagebuilder/host"
"""Where mount_smoke_tests puts this imagebuilder's smoke_tests package in the container."""

MIN_DRIVER_LABEL = f"{LABEL_PREFIX}.min-driver"
MIN_DRIVER_COMPAT_LABEL = f"{LABEL_PREFIX}.min-driver-compat"
CUDA_LABEL = f"{LABEL_PREFIX}.cuda"


class VerificationFailed(ImageBuilderError):
    """The image (or this environment) did not pass; `failures` is (name, reason) pairs."""

    def describe(self) -> str:
        what = "; ".join(f"{name}: {reason}" for name, reason in self.fields["failures"])
        return f"{self.fields['target']} failed verification: {what}"


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
    """Why no GPU is listed: nvidia-smi missing, failing or hanging."""
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
    pulled: bool = False
    nvidia_runtime: str | None = None
    """How containers get GPUs: "runtime nvidia", a CDI spec's path, or the runtime hook."""


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


NO_RUNTIME = (
    "no NVIDIA container runtime: docker info lists no `nvidia` runtime, no CDI spec for "
    "nvidia.com/gpu is in /etc/cdi or /var/run/cdi, and nvidia-container-runtime-hook is not "
    "installed; install the NVIDIA Container Toolkit, then `sudo nvidia-ctk runtime configure "
    "--runtime=docker && sudo systemctl restart docker`"
)


def preflight(facts: HostFacts, *, allow_no_gpu: bool) -> Preflight:
    """Judge the host: every item that can be judged, so all problems show at once."""
    items: list[PreflightItem] = []
    if facts.in_container:
        items += _container_items(facts)
    gpus = facts.gpus
    if gpus:
        names = sorted({gpu.name for gpu in gpus})
        items.append(PreflightItem("gpu", PASS, f"{len(gpus)} GPU(s): {', '.join(names)}"))
    else:
        why = facts.gpu_error or "nvidia-smi lists none"
        if allow_no_gpu:
            items.append(PreflightItem("gpu", SKIP, f"no NVIDIA GPU visible ({why}); "
                                                    "--allow-no-gpu: running the CPU mode"))
        else:
            items.append(PreflightItem("gpu", FAIL, f"no NVIDIA GPU visible on this host ({why}); run "
                                                    "on a GPU host, or pass --allow-no-gpu for the CPU "
                                                    "mode (CI runners)"))
    if facts.in_container and facts.daemon_error is None:
        items.append(_runtime_item(facts))
    items.append(_driver_item(facts))
    return Preflight(tuple(items), use_gpus=bool(gpus))


def _container_items(facts: HostFacts) -> list[PreflightItem]:
    if facts.daemon_error is not None:
        return [PreflightItem("daemon", FAIL, facts.daemon_error)]
    items = [PreflightItem("daemon", PASS, "the Docker daemon answers")]
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


def nvidia_runtime(info: Mapping[str, Any]) -> str | None:
    """How the daemon can hand GPUs to containers, from `docker info` and this host's files."""
    if "nvidia" in (info.get("Runtimes") or {}):
        return "docker info lists the nvidia runtime"
    for directory in info.get("CDISpecDirs") or CDI_DIRS:
        for spec in sorted(Path(directory).glob("*")):
            if spec.suffix in (".yaml", ".yml", ".json") and _mentions_gpu(spec):
                return f"CDI spec for nvidia.com/gpu in {spec}"
    # dockerd serves --gpus device requests itself when it finds this hook on its PATH.
    hook = shutil.which("nvidia-container-runtime-hook")
    if hook:
        return f"the daemon accepts GPU device requests ({hook})"
    return None


def _mentions_gpu(spec: Path) -> bool:
    try:
        return "nvidia.com/gpu" in spec.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False


def _docker_info(engine: Engine) -> Mapping[str, Any]:
    import docker

    try:
        return engine.info()
    except docker.errors.DockerException:
        return {}


def collect_facts(engine: Engine, ref: str) -> HostFacts:
    """The I/O half of preflight for an image: ask the daemon and the host; pull if needed."""
    from .engine import DaemonUnavailable, PullFailed

    gpus, gpu_error = host_gpus()
    try:
        engine.ping()
    except DaemonUnavailable as e:
        return HostFacts(gpus=gpus, gpu_error=gpu_error, daemon_error=str(e))
    image_error, pulled, labels = None, False, {}
    if not engine.image_exists(ref):
        try:
            engine.pull(ref)
            pulled = True
        except PullFailed as e:
            image_error = f"image {ref} is not here and could not be pulled: {e.detail}; build it " \
                          "or check the reference and `docker login`"
    if image_error is None:
        labels = engine.image_labels(ref)
    return HostFacts(
        gpus=gpus, gpu_error=gpu_error,
        min_driver=labels.get(MIN_DRIVER_LABEL), min_driver_compat=labels.get(MIN_DRIVER_COMPAT_LABEL),
        cuda=labels.get(CUDA_LABEL),
        image_error=image_error, pulled=pulled, nvidia_runtime=nvidia_runtime(_docker_info(engine)),
    )


def collect_local_facts(manifest: str | None) -> HostFacts:
    try:
        expected = load_expected(manifest)
    except ManifestError as e:
        raise BadRequest(f"{e}; pass --manifest with the image's manifest.json, or none") from e
    gpus, gpu_error = host_gpus()
    return HostFacts(gpus=gpus, gpu_error=gpu_error, min_driver=expected.min_driver,
                     min_driver_compat=expected.min_driver_compat, cuda=expected.image_cuda,
                     in_container=False)


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
     "the image has no smoke_tests package (not built by imagebuilder?); rebuild it with "
     "imagebuilder, or verify it with this imagebuilder's smoke tests (--mount-smoke-tests)"),
    (re.compile(r"No module named 'torch'"),
     "torch is not importable in the image's Python; install torch into the Python on its PATH"),
    (re.compile(r"executable file not found|python3: not found|No such file or directory.*python3"),
     "the image has no python3 on its PATH"),
)
_EXIT_MEANINGS = {137: "killed (out of memory?)", 139: "segmentation fault", 134: "aborted"}


def parse_output(output: str, exit_code: int | None, *, timed_out: bool = False,
                 timeout: float | None = None) -> SmokeOutput:
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
                return SmokeOutput((), error=meaning)
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

    @property
    def ok(self) -> bool:
        return (self.error is None and bool(self.checks)
                and not any(item.failed for item in self.preflight)
                and not any(check.failed for check in self.checks))

    @property
    def failures(self) -> tuple[tuple[str, str], ...]:
        """(name, reason) of every failed preflight item and check, and of a run that died."""
        found = [(item.name, item.detail) for item in self.preflight if item.failed]
        if self.error is not None and self.error != NOT_RUN:
            found.append(("smoke tests", self.error))
        found += [(check.name, check.reason) for check in self.checks if check.failed]
        if not found and not self.checks:
            found.append(("smoke tests", "no check ran"))
        return tuple(found)

    def raise_if_failed(self) -> None:
        if not self.ok:
            raise VerificationFailed(target=self.target, failures=tuple(self.failures))

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
        }

    def format(self) -> str:
        """For people: the preflight table, then the checks' table (or why there is none)."""
        width = max([len("PREFLIGHT")] + [len(item.name) for item in self.preflight])
        lines = [f"verify {self.target} ({self.mode}"
                 f"{', GPUs required' if self.require_gpu else ', CPU mode allowed'})",
                 f"{'PREFLIGHT':<{width}}  STATUS  DETAIL"]
        lines += [f"{item.name:<{width}}  {item.status.upper():<6}  {item.detail}" for item in self.preflight]
        lines.append("")
        if self.checks:
            lines.append(format_table(list(self.checks)))
        if self.error is not None:
            lines.append(f"smoke tests: {self.error}")
        if self.output_tail:
            lines.append(f"last {len(self.output_tail)} lines of output:")
            lines += [f"  | {line}" for line in self.output_tail]
        lines.append(f"{'OK' if self.ok else 'FAILED'}: {self.target} ({self.seconds:.1f}s)")
        return "\n".join(lines)


# --------------------------------------------------------------------------- pipelines


def smoke_command(python: str, *, require_gpu: bool, manifest: str | None = None) -> list[str]:
    command = [python, "-m", "smoke_tests", "--json"]
    if manifest:
        command += ["--manifest", manifest]
    # Explicit both ways: in an image built for CUDA the smoke tests require a GPU by default.
    command.append("--require-gpu" if require_gpu else "--allow-no-gpu")
    return command


def verify_image(engine: Engine, ref: str, *, allow_no_gpu: bool = False,
                 timeout: float = DEFAULT_TIMEOUT, mount_smoke_tests: bool = False) -> VerifyReport:
    """Preflight this host for `ref`, then run the smoke tests in a container from it.

    The container gets every GPU, a 1 GiB /dev/shm and `timeout` seconds; it is removed
    afterwards in every case (the engine's run() guarantees it, Ctrl-C included).
    mount_smoke_tests runs this imagebuilder's smoke_tests instead of the image's own copy:
    for images imagebuilder did not build (a plain `pip install torch` image).
    """
    from .engine import ContainerFailed, GpuUnavailable, ImageMissing

    started = time.monotonic()
    checked = preflight(collect_facts(engine, ref), allow_no_gpu=allow_no_gpu)
    require_gpu = checked.use_gpus or not allow_no_gpu
    if not checked.ok:
        return VerifyReport(ref, "docker", checked.items, error=NOT_RUN, require_gpu=require_gpu,
                            seconds=time.monotonic() - started)
    environment = {"PYTHONDONTWRITEBYTECODE": "1"}
    volumes: dict[str, str] = {}
    if mount_smoke_tests:
        package = Path(smoke_tests.__file__).resolve().parent
        volumes[str(package)] = f"{CONTAINER_SMOKE_TESTS}/smoke_tests"
        environment["PYTHONPATH"] = CONTAINER_SMOKE_TESTS
    try:
        run = engine.run(ref, smoke_command("python3", require_gpu=require_gpu), timeout=timeout,
                         gpus=checked.use_gpus, shm_size=SHM_SIZE, environment=environment,
                         volumes=volumes or None)
    except GpuUnavailable as e:
        items = checked.items + (PreflightItem("runtime", FAIL, str(e)),)
        return VerifyReport(ref, "docker", items, error=NOT_RUN, require_gpu=require_gpu,
                            seconds=time.monotonic() - started)
    except (ContainerFailed, ImageMissing) as e:
        return VerifyReport(ref, "docker", checked.items, error=str(e), require_gpu=require_gpu,
                            seconds=time.monotonic() - started)
    parsed = parse_output(run.output, run.exit_code, timed_out=run.timed_out, timeout=timeout)
    return _report(ref, "docker", checked, parsed, run.output, require_gpu, time.monotonic() - started)


def verify_local(*, allow_no_gpu: bool = False, timeout: float = DEFAULT_TIMEOUT,
                 manifest: str | None = None, python: str | None = None,
                 target: str | None = None) -> VerifyReport:
    """The same checks in this Python environment (bare-metal hosts, pods), in a subprocess
    under `timeout`, so that a hung CUDA call or compile cannot hang verify."""
    started = time.monotonic()
    python = python or sys.executable
    target = target or f"local {python}"
    checked = preflight(collect_local_facts(manifest), allow_no_gpu=allow_no_gpu)
    require_gpu = checked.use_gpus or not allow_no_gpu
    if not checked.ok:
        return VerifyReport(target, "local", checked.items, error=NOT_RUN, require_gpu=require_gpu,
                            seconds=time.monotonic() - started)
    command = smoke_command(python, require_gpu=require_gpu, manifest=manifest)
    output, exit_code, timed_out = run_process(command, timeout=timeout, env=_local_env())
    parsed = parse_output(output, exit_code, timed_out=timed_out, timeout=timeout)
    return _report(target, "local", checked, parsed, output, require_gpu, time.monotonic() - started)


def _local_env() -> dict[str, str]:
    # The smoke tests this imagebuilder ships, also when `python` has imagebuilder only on sys.path.
    root = str(Path(smoke_tests.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{path}" if path else root}


def run_process(command: Sequence[str], *, timeout: float,
                env: Mapping[str, str] | None = None) -> tuple[str, int | None, bool]:
    """(stdout then stderr, exit code, timed out). The process and everything it started
    (NCCL's workers, compiler jobs) is killed at the timeout and on Ctrl-C."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               errors="replace", env=dict(env) if env is not None else None,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        stdout, stderr = process.communicate()
        return stdout + stderr, None, True
    except BaseException:
        _kill_group(process)
        process.wait()
        raise
    return stdout + stderr, process.returncode, False


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

