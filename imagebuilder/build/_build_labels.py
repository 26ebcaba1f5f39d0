"""The labels a build adds to what the render wrote: created and revision (left out of the render
to keep it deterministic), the matrix's and the lock's digests, and which CUDA is which."""

from __future__ import annotations

import hashlib
import os
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from ..engine.api import ImageStore
from ..trust.labels import CREATED, CUDA_RUNTIME, CUDA_TOOLKIT, INPUTS_HASH, LOCK, MATRIX, REVISION
from .render import RenderedImage


def _revision(matrix_path: Path) -> str | None:
    for var in ("GITHUB_SHA", "CI_COMMIT_SHA"):
        if os.environ.get(var):
            return os.environ[var]
    try:
        done = subprocess.run(["git", "-C", str(matrix_path.parent), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def build_labels(engine: ImageStore, image: RenderedImage, matrix_path: Path) -> dict[str, str]:
    """created and revision, the labels that rendering leaves out to stay deterministic.
    An image already built from the same inputs keeps its created date, so a rebuild with
    nothing changed is served whole from the layer cache."""
    labels: dict[str, str] = {}
    created = None
    if engine.image_exists(image.ref):
        existing = engine.image_labels(image.ref)
        if existing.get(INPUTS_HASH) == image.inputs_hash:
            created = existing.get(CREATED)
    if created is None and os.environ.get("SOURCE_DATE_EPOCH", "").isdigit():
        created = datetime.fromtimestamp(int(os.environ["SOURCE_DATE_EPOCH"]), timezone.utc).isoformat()
    labels[CREATED] = created or datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    revision = _revision(matrix_path)
    if revision:
        labels[REVISION] = revision
    # What the image was rendered from, by content: in the image's labels and (set at build
    # time) in its provenance attestation, which `verify` reads back.
    try:
        labels[MATRIX] = f"{matrix_path.name} sha256:{hashlib.sha256(matrix_path.read_bytes()).hexdigest()}"
    except OSError:
        pass
    if image.lock is not None:
        labels[LOCK] = f"locks/{image.lock.filename} sha256:{hashlib.sha256(image.lock.text().encode()).hexdigest()}"
    labels.update(cuda_labels(image))
    return labels


def cuda_labels(image: RenderedImage) -> dict[str, str]:
    """Which CUDA is which: the runtime the locked wheels bring, and in devel images the toolkit
    nvcc comes from. Build-time labels, like the lock's: they follow from inputs the inputs hash
    already covers. A jupyter image has none of its own: it is FROM its parent, whose it keeps."""
    labels: dict[str, str] = {}
    if image.spec.parent is not None:
        return labels
    runtime = image.lock.cuda_runtime() if image.lock is not None else None
    if runtime is not None:
        labels[CUDA_RUNTIME] = str(runtime)
    if image.spec.toolchain != "none":
        labels[CUDA_TOOLKIT] = str(image.spec.cuda.version)
    return labels
