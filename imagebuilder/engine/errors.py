"""What can go wrong with a container engine, and what to do about each; shared by builders.

The classic builder (classic.py) and BuildKit (buildkit.py) report the same errors, and the same causes
recognised in a failed step's output."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Sequence
from pathlib import Path

from ..errors import BadRequest, ImageBuilderError


class EngineError(ImageBuilderError):
    """A container-engine operation failed."""


class DaemonUnavailable(EngineError):
    base_url: str
    reason: str
    template = ("could not reach the Docker daemon at {base_url}: {reason}; start it with "
                "`sudo systemctl start docker` or `dockerd &`, or point DOCKER_HOST at a running one")

    def describe(self) -> str:
        url = urllib.parse.urlsplit(self.fields["base_url"])
        if url.scheme != "ssh":
            return super().describe()
        # docker-py logs in with paramiko: no ssh_config beyond Hostname, Port, User, IdentityFile and
        # ProxyCommand, and a host missing from known_hosts is refused, never asked about.
        login = f"-p {url.port} {url.netloc.rpartition(':')[0]}" if url.port else url.netloc
        return (f"could not reach the Docker daemon at {self.fields['base_url']} over ssh: {self.fields['reason']}; "
                f"check that `ssh {login} docker version` works from here without a prompt (the host in "
                "~/.ssh/known_hosts, the key in ssh-agent, ~/.ssh/id_* or an IdentityFile of ~/.ssh/config)")


class BadDaemonAddress(BadRequest):
    template = ("DOCKER_HOST={base_url} is not a Docker daemon address ({reason}); give unix:///PATH, "
                "tcp://HOST:PORT or ssh://[USER@]HOST, or unset it for the local daemon")


DAEMON_SCHEMES = ("unix", "tcp", "ssh", "http", "https", "npipe")


def daemon_address_problem(base_url: str) -> str | None:
    """Why `base_url` (DOCKER_HOST) cannot name a daemon, or None: a wrong request, not a daemon
    to start (which is what a connection that fails suggests)."""
    parts = urllib.parse.urlsplit(base_url)
    if parts.scheme not in DAEMON_SCHEMES:
        return f"no {', '.join(s + '://' for s in DAEMON_SCHEMES[:3])} scheme"
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0 and ":" in parts.netloc.rpartition("@")[2].rpartition("]")[2]:
        return "its port is not a number from 1 to 65535"
    if parts.scheme in ("unix", "npipe"):
        return None if parts.path else "it names no socket"
    return None if parts.hostname else "it names no host"


class BaseImageMissing(EngineError):
    """The registry could not be asked (exit 1: the world; retrying may help)."""

    image: str
    detail: str
    template = ("base image {image} is not available locally and could not be pulled ({detail}); "
                "build or pull it first, or pass --base-image with one that exists")


class BaseImageNotFound(BaseImageMissing, BadRequest):
    """The registry answered that there is no such image (exit 2: the request names nothing)."""


# A registry's (or the daemon's) words for "there is no such image": the request names
# nothing, unlike a registry that could not be reached.
_NOT_FOUND = re.compile(r"manifest unknown|not found|does not exist|pull access denied|no such image|"
                        r"name unknown|repository name not known|invalid reference format", re.I)


def names_nothing(detail: str) -> bool:
    return bool(_NOT_FOUND.search(detail))


def base_image_missing(image: str, detail: str) -> BaseImageMissing:
    """The error for a base image that could not be had: a bad request when the registry says
    it does not exist, the world's failure when the registry could not be asked."""
    return (BaseImageNotFound if names_nothing(detail) else BaseImageMissing)(image=image, detail=detail)


# What the daemon says when it cannot give a container GPUs (no NVIDIA Container Toolkit, no
# CDI spec, no nvidia runtime); any other refusal (a missing bridge, a full disk) is not a GPU's.
_GPU_REFUSAL = re.compile(r"could not select device driver|nvidia-container|unknown or invalid runtime name: "
                          r"nvidia|CDI device|unresolvable CDI devices|libnvidia-ml|NVIDIA driver", re.I)


def refuses_gpus(said: str) -> bool:
    return bool(_GPU_REFUSAL.search(said))


class BuildFailed(EngineError):
    """A build step failed. `cause` is "disk-full", "network" or None (the step itself).

    Fields: step, total, instruction, error, tail (the step's last lines), log_path, cause,
    hint (what to do about a network cause, from the build's own options)."""

    step: int | None
    total: int | None
    instruction: str | None
    error: str
    tail: tuple[str, ...]
    log_path: Path | None
    cause: str | None
    step_exit_code: int | None

    def __init__(self, *, step: int | None, total: int | None, instruction: str | None, error: str,
                 tail: tuple[str, ...], log_path: Path | None, cause: str | None = None,
                 hint: str | None = None) -> None:
        exit_code = re.search(r"returned a non-zero code: (\d+)|exit code: (\d+)", error)
        step_exit_code = int(exit_code[1] or exit_code[2]) if exit_code else None
        super().__init__(step=step, total=total, instruction=instruction, error=error, tail=tail,
                         log_path=log_path, cause=cause, hint=hint, step_exit_code=step_exit_code)

    def describe(self) -> str:
        f = self.fields
        where = f"step {f['step']}/{f['total']} `{f['instruction']}`" if f["step"] is not None else "the build"
        what = f"exit code {f['step_exit_code']}" if f["step_exit_code"] is not None else f["error"]
        log = f"full log: {f['log_path']}" if f["log_path"] else "rerun with a log file for the full output"
        hint = f["hint"] or (CAUSE_HINTS[f["cause"]] if f["cause"] else "")
        return f"{where} failed: {what}; {hint}{log}"

    @property
    def exit_status(self) -> int:
        return 2 if self.fields["cause"] in REQUEST_CAUSES else self.exit_code

    def details(self) -> list[str]:
        """The failing step's last output lines."""
        tail: tuple[str, ...] = self.fields["tail"]
        if not tail:
            return []
        return [f"last {len(tail)} lines of the failing step:", *(f"  | {line}" for line in tail)]

    def with_hint(self, hint: str) -> BuildFailed:
        f = self.fields
        return BuildFailed(step=f["step"], total=f["total"], instruction=f["instruction"], error=f["error"],
                           tail=f["tail"], log_path=f["log_path"], cause=f["cause"], hint=hint)

    def report(self) -> str:
        """The message plus the failing step's last output lines, for a terminal."""
        return "\n".join([str(self), *self.details()])


class BuildTimedOut(EngineError):
    seconds: float
    step: int | None
    instruction: str | None
    log_path: Path | None

    def describe(self) -> str:
        f = self.fields
        where = f" in step {f['step']} `{f['instruction']}`" if f["step"] is not None else ""
        return (f"the build was stopped after {f['seconds']:.0f}s{where}; its containers were removed; "
                f"raise the build timeout or make the step faster (log: {f['log_path'] or 'none'})")


class TagFailed(EngineError):
    image_id: str
    tag: str
    detail: str
    template = ("built {image_id} but could not tag it {tag} ({detail}); no tag was left applied; "
                "check the tag's spelling (lowercase repository, tag of [A-Za-z0-9_.-])")


class ImageMissing(EngineError):
    ref: str
    template = "image {ref} does not exist locally; build or pull it first"


class GpuUnavailable(EngineError):
    image: str
    detail: str
    template = ("could not start {image} with GPUs ({detail}); install the NVIDIA Container "
                "Toolkit and restart dockerd, or run without GPUs")


class ContainerFailed(EngineError):
    image: str
    detail: str
    template = "could not run a container from {image}: {detail}"


class PushFailed(EngineError):
    ref: str
    attempts: int
    detail: str

    def describe(self) -> str:
        # A login is the cure only where the registry refused one (401, 403); a 5xx or a reset
        # is the registry's or the network's, and a rerun skips what landed.
        todo = ("check that you are logged in (`docker login <registry>`) with an account that may push there"
                if _REFUSED.search(self.fields["detail"]) else
                "check that the registry answers, then rerun (what was pushed is skipped)")
        return (f"pushing {self.fields['ref']} failed after {self.fields['attempts']} attempt(s): "
                f"{self.fields['detail']}; {todo}")


_REFUSED = re.compile(r"denied|unauthorized|authentication required|\b40[13]\b|forbidden", re.I)
_URL_QUERY = re.compile(r"(\bhttps?://[^\s\"'?]+)\?[^\s\"']*")


def push_cause(message: str, limit: int = 300) -> str:
    """The daemon's words for a failed push, in one line that keeps its cause: an upload URL's
    query (its `_state` token runs to hundreds of characters) is dropped, so the status (500)
    or the reset that follows the URL survives the shortening."""
    text = " ".join(_URL_QUERY.sub(r"\1", message).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class PullFailed(EngineError):
    ref: str
    detail: str
    template = "pulling {ref} failed: {detail}; check the reference and that the registry answers"


# The recognisable failures inside a build step, and what to do about each.
_CAUSES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("disk-full", re.compile(r"no space left on device", re.I)),
    ("no-nvcc", re.compile(r"imagebuilder: no nvcc in --base-image")),
    ("network", re.compile(
        r"CERTIFICATE_VERIFY_FAILED|invalid peer certificate|Could not fetch URL|"
        r"Name or service not known|Temporary failure in name resolution|Connection reset|"
        r"Connection refused|Network is unreachable|ConnectTimeoutError|ReadTimeoutError|"
        r"Max retries exceeded|Failed to fetch http|dns error|error sending request for url",
        re.I,
    )),
)
# Causes that are the request's, not the build's: the build cannot succeed as asked (exit 2).
REQUEST_CAUSES = frozenset({"no-nvcc"})
# BuildKit's bare "not found" outside any step: a record of this build (a cache record, a layer
# it had just exported) vanished under it, as on a shared daemon when another job prunes.
LOST_RECORD = "lost-record"
_LOST_RECORD = re.compile(r"(?:^|: )not found$")


def lost_record(message: str) -> bool:
    """Whether a failure outside every step is BuildKit's lost record (a builder retries it once)."""
    return bool(_LOST_RECORD.search(message))


CAUSE_HINTS: dict[str, str] = {
    "no-nvcc": "the --base-image has no CUDA compiler: a devel image needs a base with nvcc under "
    "/usr/local/cuda (NVIDIA's nvidia/cuda:*-devel-* images), or leave --base-image out; ",
    LOST_RECORD: "BuildKit lost a record of this build under it, twice (on a shared daemon another job's "
    "`docker builder prune` removes records that builds still running need): build again when no prune runs "
    "beside it, and on a shared build host prune only while no build runs; ",
    "disk-full": "the Docker host ran out of disk space: free some with `docker system prune` "
    "or move Docker's data-root to a larger disk; ",
    "network": "pip inside the build could not reach the index: check the network and "
    "proxy of the Docker host; pass --ca-bundle $SSL_CERT_FILE behind a TLS-intercepting "
    "proxy; ",
}
_HOST = re.compile(r"\b(?:https?://|host=')([A-Za-z0-9.-]+(?::\d+)?)")


def network_hint(tail: Sequence[str], *, ca_bundle_given: bool) -> str:
    """What to do about a network failure, naming the host the step could not reach; no
    --ca-bundle advice to a build that already has one."""
    hosts = [m[1] for line in tail for m in _HOST.finditer(line)]
    where = hosts[-1] if hosts else "the package index"
    hint = (f"the build could not reach {where}: check that the Docker host reaches it (network, proxy), "
            "or point --index-url at an index it can reach; ")
    if not ca_bundle_given:
        hint += "behind a TLS-intercepting proxy pass --ca-bundle $SSL_CERT_FILE; "
    return hint


def classify_failure(error: str, tail: Sequence[str]) -> str | None:
    """The cause of a failed step, from its error and last output lines (None: the step)."""
    text = "\n".join([error, *tail])
    for cause, pattern in _CAUSES:
        if pattern.search(text):
            return cause
    return None
