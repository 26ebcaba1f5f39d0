"""The BuildKit builder: the docker CLI in a subprocess, its `--progress=plain` output parsed.

docker-py drives only the classic builder, which cannot take a secret, share a cache or
build for another platform (docker/docker-py#2230). So BuildKit builds run the docker CLI
(`docker buildx build --load`, or `docker build` with BuildKit built in, as Debian's 20.10
CLI has), and the Docker SDK stays the way to inspect, run and push what it built.

The plain progress is parsed by buildkit_progress.py into the `Progress` events the classic
builder gives, and the whole output goes to the log file. A Ctrl-C or a timeout ends the CLI, which makes the
daemon cancel the solve: BuildKit tags only a finished image and runs no containers that
outlive the build, so nothing is left behind.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .api import BuilderKind, BuildRequest, BuildResult, ImageInspector, OnProgress, Progress, check_request
from .background import BackgroundBuild, stop
from .buildkit_progress import PlainProgress
from .errors import LOST_RECORD, BuildFailed, BuildTimedOut, EngineError
from .export import Export, output_args

# Said as the build's activity (a progress line shows 90 characters of it) and in its log.
RETRY_NOTE = "BuildKit lost a record of this build (another job's prune?): building it again"


@dataclass(frozen=True)
class BuildKitCli:
    """How to run a BuildKit build here: `command` + options + the context folder."""

    command: tuple[str, ...]
    """("docker", "buildx", "build") or ("/usr/bin/docker", "build")."""
    buildkit_env: bool = False
    """True: the CLI's built-in BuildKit, switched on by DOCKER_BUILDKIT=1."""
    description: str = ""

    @property
    def buildx(self) -> bool:
        """buildx: the image goes to the image store by `--load` or an `--output`; the
        built-in BuildKit of an old CLI loads it itself and knows none of these options."""
        return not self.buildkit_env


class BuildKitBuilder:
    """Builds with BuildKit through the docker CLI; inspects with the SDK."""

    kind: BuilderKind = "buildkit"

    def __init__(self, cli: BuildKitCli, engine: ImageInspector) -> None:
        self.cli = cli
        self.engine = engine

    def describe(self) -> str:
        return f"BuildKit ({self.cli.description or ' '.join(self.cli.command)})"

    def command(self, req: BuildRequest, iidfile: Path | None) -> list[str]:
        args = [*self.cli.command]
        if self.cli.buildx:
            args += output_args(req.export)
        elif req.export is not None and req.export != Export():
            raise EngineError(f"{self.describe()} cannot choose compression, attach provenance or use a "
                              "registry cache; install the buildx plugin (docker-buildx)")
        args += ["--progress=plain", "--file", str(req.context / req.dockerfile)]
        if iidfile is not None:
            args += ["--iidfile", str(iidfile)]
        if req.export is None or req.export.image:  # a cache-only build names no image
            for tag in req.tags:
                args += ["--tag", tag]
        for key, value in sorted(req.labels.items()):
            args += ["--label", f"{key}={value}"]
        for key, value in sorted(req.buildargs.items()):
            args += ["--build-arg", f"{key}={value}"]
        for secret_id, path in sorted(req.secrets.items()):
            args += ["--secret", f"id={secret_id},src={path}"]
        if req.contexts and not self.cli.buildx:
            raise EngineError(f"{self.describe()} cannot take named build contexts; install the buildx plugin "
                              "(docker-buildx)")
        for name, path in sorted(req.contexts.items()):
            args += ["--build-context", f"{name}={path}"]
        if req.platform:
            args += ["--platform", req.platform]
        if req.nocache:
            args.append("--no-cache")
        if req.pull:
            args.append("--pull")
        return [*args, str(req.context)]

    def build(self, req: BuildRequest, on_progress: OnProgress | None = None) -> BuildResult:
        """The build; once more where BuildKit lost a record of it (LOST_RECORD), which a shared
        daemon's prune by another job causes: the second try is mostly cached."""
        check_request(req)
        self.engine.ping()
        try:
            return self._build(req, on_progress)
        except BuildFailed as e:
            if e.fields["cause"] != LOST_RECORD:
                raise
            if on_progress is not None:
                on_progress(Progress(0, 0, "", 0.0, False, None, activity=RETRY_NOTE))
        return self._build(req, on_progress, again=True)

    def _build(self, req: BuildRequest, on_progress: OnProgress | None, again: bool = False) -> BuildResult:
        started = time.monotonic()
        note = ""
        if req.export is not None and req.export.compression is not None:
            note = req.export.compression.kind
        elif self.cli.buildx:
            note = "the builder's default compression"
        state = PlainProgress((req.context / req.dockerfile).read_text(), started, on_progress, note)
        env = {**os.environ, "DOCKER_BUILDKIT": "1"} if self.cli.buildkit_env else None
        log: IO[str] | None = None
        if req.log_path is not None:
            req.log_path.parent.mkdir(parents=True, exist_ok=True)
            log = req.log_path.open("a" if again else "w", encoding="utf-8")
            if again:
                log.write(f"\n[imagebuilder] {RETRY_NOTE}\n")
        with tempfile.TemporaryDirectory(prefix="imagebuilder-iid-") as tmp:
            iidfile = Path(tmp) / "iid"
            try:
                rc = self._run(self.command(req, iidfile), env, state, log, req)
            finally:
                if log:
                    log.close()
            image_id = iidfile.read_text().strip() if iidfile.is_file() else ""
        if rc != 0 or not image_id:
            raise state.error(rc, req.log_path)
        # The image store's own id, read through the tag: an `--output type=image` build into
        # Docker's containerd store writes the config digest to the iidfile, while the store
        # names the image by its manifest (or index) digest, the one a push stores.
        attrs = self.engine.inspect_image(req.tags[0] if req.export is not None else image_id)
        return BuildResult(
            image_id=str(attrs.get("Id") or image_id),
            tags=req.tags,
            size=int(attrs.get("Size", 0)),
            seconds=time.monotonic() - started,
            steps=state.total,
            cached_steps=state.cached_steps,
            executed_steps=state.executed_steps,
            log_path=req.log_path,
            export_seconds=state.export_seconds,
        )

    def can_start(self) -> bool:
        return self.cli.buildx

    def start(self, req: BuildRequest) -> BackgroundBuild:
        """Start the build and return at once: its output goes to req.log_path only, no image id
        is read back (a cache-only build makes none), and it is stopped after req.timeout."""
        check_request(req)
        if not self.cli.buildx:
            raise EngineError(f"{self.describe()} cannot run a build in the background; install the buildx "
                              "plugin (docker-buildx)")
        argv = self.command(req, None)
        log_path = req.log_path or Path(os.devnull)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("w", encoding="utf-8") as log:
            log.write("$ " + " ".join(argv) + "\n")
            log.flush()
            try:
                proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
            except OSError as e:
                raise EngineError(f"could not run {argv[0]}: {e.strerror}; install the docker CLI") from e
        return BackgroundBuild(proc, time.monotonic() + req.timeout)

    def _run(self, argv: Sequence[str], env: dict[str, str] | None, state: PlainProgress,
             log: IO[str] | None, req: BuildRequest) -> int:
        """Run the CLI, feeding its output to `state` and the log; its exit code."""
        if log:
            log.write("$ " + " ".join(argv) + "\n")
        try:
            # Its own session: the terminal's Ctrl-C reaches us, and we stop the CLI in order.
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, text=True,
                                    encoding="utf-8", errors="replace", start_new_session=True)
        except OSError as e:
            raise EngineError(f"could not run {argv[0]}: {e.strerror}; install the docker CLI "
                              "or build with --builder classic") from e
        timed_out = threading.Event()

        def stop_for_timeout() -> None:
            timed_out.set()
            stop(proc)

        timer = threading.Timer(req.timeout, stop_for_timeout)
        timer.daemon = True
        timer.start()
        finished = threading.Event()

        def beat() -> None:
            while not finished.wait(1.0):
                state.heartbeat()

        beating = threading.Thread(target=beat, name="imagebuilder-build-heartbeat", daemon=True)
        beating.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                if log:
                    log.write(line)
                    log.flush()
                state.feed(line)
            rc = proc.wait()
        except KeyboardInterrupt:
            stop(proc)
            if log:
                log.write("\n[imagebuilder] build interrupted; the docker CLI was stopped\n")
            raise
        finally:
            timer.cancel()
            finished.set()
            beating.join()
        if timed_out.is_set():
            if log:
                log.write(f"\n[imagebuilder] build stopped after {req.timeout:.0f}s\n")
            current = state.current
            raise BuildTimedOut(seconds=req.timeout, step=current.step if current else None,
                                instruction=current.instruction if current else None,
                                log_path=req.log_path)
        return rc
