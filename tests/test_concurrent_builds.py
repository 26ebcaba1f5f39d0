"""Two builds of one tag at once, on the real engine (issue 45, part 5): every build exported to
the one name `{ref}-unlabelled`, so the second failed ("already exists") and its clean-up removed
the first one's image. Each run now builds to a name of its own.

The image's Dockerfile is a seconds-long one on the suite's small base in place of the torch one:
what is tested is the names the two runs build, label and remove, through build_image itself."""

from __future__ import annotations

import threading
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from support.real_images import REPO_ROOT
from imagebuilder.build.image_contents import SBOM_PATH
from imagebuilder.build.per_platform import render_spec as render
from imagebuilder.build.render_options import RenderOptions
from imagebuilder.lock.lockfile import load_locks
from imagebuilder.matrix.load import load_matrix
from imagebuilder.matrix.resolve import Request, resolve

MATRIX = load_matrix(REPO_ROOT / "matrix.yaml")
E2E = Request("2.6", "12.1", None, "runtime", "debian12")


@pytest.mark.docker
def test_two_no_cache_builds_of_one_tag_at_once_both_succeed(docker_engine: Any, base_image: str, image_repo: str,
                                                              tmp_path: Path) -> None:
    from imagebuilder.build.run import build_image
    from imagebuilder.engine.classic import ClassicBuilder
    from imagebuilder.engine.docker import DockerEngine

    image = render(resolve(MATRIX, E2E), MATRIX, RenderOptions(locks=load_locks(REPO_ROOT / "locks")))
    marker = uuid.uuid4().hex
    # The overlap: each build holds its step for seconds, so both export while the other runs.
    dockerfile = (f"FROM {base_image}\nRUN mkdir -p {Path(SBOM_PATH).parent} && sleep 8 && "
                  f"echo '{{\"run\": \"{marker}\"}}' > {SBOM_PATH}\n")
    image = replace(image, repository=image_repo, dockerfile=dockerfile, contexts=(), secrets={})
    results: dict[int, Any] = {}

    def build(n: int) -> None:
        engine = DockerEngine()  # one client per run, as two processes have
        (tmp_path / str(n)).mkdir()
        try:
            results[n] = build_image(engine, image, builder=ClassicBuilder(engine), nocache=True,
                                     matrix_path=REPO_ROOT / "matrix.yaml", logs=tmp_path / str(n))
        except Exception as e:  # noqa: BLE001 (what the run ended with is the test's answer)
            results[n] = e

    threads = [threading.Thread(target=build, args=(n,)) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert all(not isinstance(r, Exception) for r in results.values()) and len(results) == 2, results
    assert results[1].result.image_id != results[2].result.image_id  # --no-cache: two builds, two images
    assert docker_engine.image_exists(image.ref)
    # Neither left its intermediate image, nor removed the other's before its label build used it.
    import docker

    client = docker.from_env()
    try:
        left = [t for i in client.images.list() for t in i.tags if t.startswith(image_repo) and "-unlabelled" in t]
    finally:
        client.close()
    assert left == []
