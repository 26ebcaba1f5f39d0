"""The floor image: a venv and torch's pinned wheels on the same base, nothing else.

The build benchmark measures imagebuilder against it; the e2e tests use it as the plain,
compiler-less `pip install torch` image that `imagebuilder verify` must fail.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from imagebuilder.engine import Builder, BuildRequest, BuildResult
from imagebuilder.matrix.model import Matrix

HERE = Path(__file__).resolve().parent
# A lock installed by uv on a base with `packages`, nothing else (bench_build, bench_publish).
LOCK_FLOOR_DOCKERFILE = """\
FROM {base}
RUN apt-get update && apt-get install -y --no-install-recommends {packages} && rm -rf /var/lib/apt/lists/*
COPY lock.txt /lock.txt
RUN --mount=type=secret,id=ca,target=/run/secrets/ca \\
    export SSL_CERT_FILE=/run/secrets/ca PIP_CERT=/run/secrets/ca \\
 && python3 -m venv /tmp/uv && /tmp/uv/bin/pip install --no-cache-dir uv=={uv} \\
 && /tmp/uv/bin/uv venv --python /usr/bin/python3.11 /opt/venv \\
 && /tmp/uv/bin/uv pip install --no-cache --python /opt/venv/bin/python --require-hashes --no-deps -r /lock.txt \\
 && rm -rf /tmp/uv
"""


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
