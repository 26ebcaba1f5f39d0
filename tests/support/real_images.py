"""Real images through the real CLI: the coordinates of the session's images, the CA bundle
every build of the session trusts, `imagebuilder` in a subprocess as a user runs it, and the
build of the README's main job (conftest's runtime_image and jupyter_image use it).
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_BASE_IMAGE = "imagebuilder-base:bookworm"
TEST_REPOSITORY_PREFIX = "imagebuilder-test"

# The session's images (conftest's fixtures): the README's main job (runtime_image, jupyter_image);
# the devel image (CUDA 13's nvcc comes from PyPI: a devel image on plain Debian; 2.13: its
# torchaudio needs torchcodec and the OS's FFmpeg, so test_torchcodec runs on this image, no image
# of its own); the image published and signed once (signed_publish).
E2E_TORCH, E2E_CUDA, E2E_OS = "2.6", "12.1", "debian12"
DEVEL_TORCH, DEVEL_CUDA = "2.13", "13.0"
SIGNED_TORCH, SIGNED_CUDA, SIGNED_OS = "2.6", "12.4", "debian12"

_SESSION_CA: list[tuple[Path, bytes]] = []


def session_ca() -> tuple[Path, bytes]:
    """The CA bundle every build of the session trusts, and its marker: the proxy's bundle
    ($SSL_CERT_FILE, else the system's) with a unique comment line appended (PEM readers skip
    text between certificates), so that a test can look for it in an image. One file for the
    whole session: through buildx the bundle is bind-mounted from a named context, so its bytes
    are in every install step's cache key, and the families' images share layers only when
    their builds trust the same bundle."""
    if not _SESSION_CA:
        import atexit
        import shutil
        import tempfile

        source = Path(os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt")
        marker = f"# imagebuilder-ca-marker-{uuid.uuid4().hex}".encode()
        folder = Path(tempfile.mkdtemp(prefix="imagebuilder-test-ca-"))
        atexit.register(shutil.rmtree, folder, True)
        (folder / "ca.pem").write_bytes(source.read_bytes() + b"\n" + marker + b"\n")
        _SESSION_CA.append((folder / "ca.pem", marker))
    return _SESSION_CA[0]


def session_ca_bundle() -> Path | None:
    """Behind a TLS-intercepting proxy (these machines) pip inside the build needs the host's
    CA: the session's marked copy of it (session_ca); None where there is no proxy's CA."""
    ca = os.environ.get("SSL_CERT_FILE")
    return session_ca()[0] if ca and Path(ca).is_file() else None


def ca_bundle_args() -> list[str]:
    """The CLI's `--ca-bundle` for the session's CA (session_ca_bundle), if any."""
    ca = session_ca_bundle()
    return ["--ca-bundle", str(ca)] if ca is not None else []


def installed_torch(log: Path | str) -> bool:
    """Whether a build log shows uv installing torch: its install step ran, not served from the cache."""
    return re.search(r"\+ torch==", Path(log).read_text()) is not None


def imagebuilder(*args: str, timeout: float = 3600,
                 env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess, as a user runs it (with `env_extra` in its environment)."""
    import sys

    # A fixed revision label: a commit made while the tests run must not change the images.
    env = {**os.environ, "GITHUB_SHA": "0" * 40, **(env_extra or {})}
    # The classic builder unless a test asks for another (--builder wins over the variable): the
    # session's images ask for auto, the builder users get.
    env.setdefault("IMAGEBUILDER_BUILDER", "classic")
    return subprocess.run([sys.executable, "-m", "imagebuilder", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO_ROOT, env=env)


def build_cli(base_image: str, repository: str, report: Path, *extra: str) -> dict:
    import json

    # No --os: it is read from the base image (Debian 12 here), as a user's build does; the
    # builder the user's engine gets (BuildKit on Docker 26 with buildx, classic on 20.10).
    done = imagebuilder("build", "--torch", E2E_TORCH, "--cuda", E2E_CUDA, "--builder", "auto",
                        "--base-image", base_image, "--repository", repository, *ca_bundle_args(),
                        "--report", str(report), *extra)
    assert done.returncode == 0, f"build failed:\n{done.stderr[-4000:]}"
    doc: dict = json.loads(report.read_text())
    doc["stderr"] = done.stderr  # what the user saw: the notices, the progress
    doc["stdout"] = done.stdout  # the summary of each image built
    return doc
