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

from support.cleanup import local_tags
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
        try:  # one log folder, as two runs by one user share ~/.cache/imagebuilder/logs
            results[n] = build_image(engine, image, builder=ClassicBuilder(engine), nocache=True,
                                     matrix_path=REPO_ROOT / "matrix.yaml", logs=tmp_path)
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
    assert [t for t in local_tags(image_repo) if "-unlabelled" in t] == []
    # Each run wrote its own logs: a build log with its own run's output in each.
    logs = sorted(tmp_path.glob("*.log"))
    assert results[1].result.log_path != results[2].result.log_path, logs
    assert all(marker in Path(results[n].result.log_path).read_text() for n in (1, 2)), logs


def test_two_runs_of_one_image_in_one_second_name_nothing_alike(tmp_path: Path) -> None:
    """Every name a build makes comes from these two (its -sbom, -gzip, -cache, -2 logs are named
    after its log): two runs of one tag in one process and one second, as two threads are, differ."""
    from imagebuilder.build.run import intermediate_tag, run_log

    ref = "acme/torch:2.6.0-cuda12.1-runtime"
    tags = {intermediate_tag(ref) for _ in range(50)}
    logs = {run_log(tmp_path, "torch2.6-cu121") for _ in range(50)}
    assert len(tags) == 50 and len(logs) == 50
    assert all(t.startswith(f"{ref}-unlabelled-") for t in tags)
    assert all(p.parent == tmp_path and p.name.startswith("torch2.6-cu121-") and p.suffix == ".log" for p in logs)


@pytest.mark.docker
@pytest.mark.beside_builds  # the classic builder on the small base
@pytest.mark.parametrize("tagged_before", [True, False])
def test_an_interrupt_after_the_label_build_tagged_gives_each_tag_back_and_removes_what_it_made(
        docker_engine: Any, base_image: str, image_repo: str, tmp_path: Path, tagged_before: bool) -> None:
    """Ctrl-C just after the SBOM-labelled build tagged the image (the gzip build or the cache
    export would run next): the image's tags name what they named before (or nothing), and
    neither the new image nor the intermediate one is left."""
    from imagebuilder.build.run import build_image
    from imagebuilder.engine.api import BuildRequest, BuildResult, OnProgress
    from imagebuilder.engine.classic import ClassicBuilder

    image = render(resolve(MATRIX, E2E), MATRIX, RenderOptions(locks=load_locks(REPO_ROOT / "locks")))
    marker = uuid.uuid4().hex
    dockerfile = f"FROM {base_image}\nRUN mkdir -p {Path(SBOM_PATH).parent} && echo '{{\"run\": \"{marker}\"}}' > {SBOM_PATH}\n"
    image = replace(image, repository=image_repo, dockerfile=dockerfile, contexts=(), secrets={})
    before = None
    if tagged_before:  # the user's image of yesterday under the tag
        for ref in image.refs:
            docker_engine.tag_image(base_image, ref)
        before = docker_engine.image_identity(image.ref)[0]
    made: list[str] = []

    class InterruptedAfterLabelling(ClassicBuilder):
        def build(self, req: BuildRequest, on_progress: OnProgress | None = None) -> BuildResult:
            result = super().build(req, on_progress)
            made.append(result.image_id)
            if req.tags == image.refs:  # the labelled build: tagged, then Ctrl-C
                raise KeyboardInterrupt
            return result

    with pytest.raises(KeyboardInterrupt):
        build_image(docker_engine, image, builder=InterruptedAfterLabelling(docker_engine), nocache=True,
                    matrix_path=REPO_ROOT / "matrix.yaml", logs=tmp_path)
    assert len(made) == 2  # the unlabelled build, then the labelled one
    for ref in image.refs:
        identity = docker_engine.image_identity(ref)
        assert (identity[0] if identity else None) == before, ref
    assert not any(docker_engine.image_exists(image_id) for image_id in made)
    if tagged_before:
        assert docker_engine.image_exists(base_image)  # the image the tags gave back is whole
