"""What a jupyter image promises: the Jupyter server starts, and it answers only with its token."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from typing import IO, Any, Dict, Optional

from ..context import Context
from ..result import Result, failed, passed
from .nccl import _last_line as last_line
from .nccl import free_port

NAME = "jupyter"

START_TIMEOUT = 120.0
REQUEST_TIMEOUT = 5.0
# The URL Jupyter prints at start: http://127.0.0.1:8888/lab?token=<48 hex digits>
_TOKEN = re.compile(r"[?&]token=([0-9a-f]{16,})")
# An endpoint that needs authentication and no browser: the file listing.
PROTECTED = "/api/contents"


def token_in(log: str) -> Optional[str]:
    match = _TOKEN.search(log)
    return None if match is None else match.group(1)


# Straight to the server: an image's or host's HTTP(S)_PROXY must not carry loopback requests.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def status_of(url: str) -> Optional[int]:
    """The HTTP status `url` answers with; None while nothing listens."""
    try:
        with _DIRECT.open(url, timeout=REQUEST_TIMEOUT) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (urllib.error.URLError, OSError):
        return None


def _read(log: IO[str]) -> str:
    log.seek(0)
    return log.read()


def check(ctx: Context) -> Result:
    jupyter = shutil.which("jupyter")
    if jupyter is None:
        return failed(NAME, "no jupyter on PATH: a jupyter image must start JupyterLab")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    # As the image's CMD starts it, on a loopback port of our own; the token is the one the
    # server makes (or the image configures), read from its log as a user reads it.
    command = [jupyter, "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0"]
    deadline = time.monotonic() + min(START_TIMEOUT, ctx.timeout)
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        try:
            return _probe(process, log, base, deadline, started)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()


def _probe(process: "subprocess.Popen[str]", log: IO[str], base: str, deadline: float, started: float) -> Result:
    token: Optional[str] = None
    denied: Optional[int] = None
    # Wait for an answer, and for the token too unless the answer already shows the door open.
    while time.monotonic() < deadline and (denied is None or (denied == 403 and token is None)):
        if process.poll() is not None:
            return failed(NAME, f"jupyter lab exited {process.returncode} at start: {last_line(log)}")
        time.sleep(0.5)
        token = token or token_in(_read(log))
        denied = status_of(base + PROTECTED)
    if denied is None:
        return failed(NAME, f"the Jupyter server did not answer at {base} within {deadline - started:.0f}s: "
                            f"{last_line(log)}")
    measurements: Dict[str, Any] = {"start_s": round(time.monotonic() - started, 1), "without_token": denied}
    if denied != 403:
        return failed(NAME, f"{PROTECTED} without a token answered {denied}, expected 403: the server is open "
                            "to anyone who reaches its port", **measurements)
    if token is None:
        return failed(NAME, f"the server printed no token to log in with: {last_line(log)}", **measurements)
    allowed = status_of(f"{base}{PROTECTED}?token={token}")
    measurements["with_token"] = allowed
    if allowed != 200:
        return failed(NAME, f"{PROTECTED} with the token it printed answered {allowed}, expected 200",
                      **measurements)
    return passed(NAME, f"JupyterLab answered in {measurements['start_s']}s: 403 without its token, 200 with it",
                  **measurements)
