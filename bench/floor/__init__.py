"""The floor image: a venv and torch's pinned wheels on the same base, nothing else.

The build benchmark measures imagebuilder against it; the e2e tests use it as the plain,
compiler-less `pip install torch` image that `imagebuilder verify` must fail.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from imagebuilder.engine import Builder, BuildRequest, BuildResult
from imagebuilder.matrix import Matrix

HERE = Path(__file__).resolve().parent


def build_floor(builder: Builder, matrix: Matrix, torch_key: str, base_image: str, tag: str,
                ca_bundle: Path | None, nocache: bool = True) -> BuildResult:
    release = matrix.torches[torch_key]
    reqs = [f"torch=={release.version}", f"torchvision=={release.torchvision}"]
    if release.torchaudio:
        reqs.append(f"torchaudio=={release.torchaudio}")
    with tempfile.TemporaryDirectory() as tmp:
        context = Path(tmp)
        shutil.copy(HERE / "Dockerfile", context / "Dockerfile")
        (context / "ca-bundle.pem").write_bytes(ca_bundle.read_bytes() if ca_bundle else b"")
        return builder.build(BuildRequest(
            context=context, tags=(tag,), nocache=nocache,
            buildargs={"BASE_IMAGE": base_image, "REQUIREMENTS": " ".join(reqs), "UV_VERSION": matrix.tools.uv},
        ))
