"""The suite's policy tables: the markers a fixture needs, the families of real images that
share BuildKit's layers, every other real build (each a decision, with its cost in CI minutes),
and the order of modules that keeps a family's users together. conftest's hooks apply them;
tests/test_suite_rules.py checks the suite against them.
"""

from __future__ import annotations

from pathlib import Path

import pytest


# A fixture -> the markers every test using it (directly or through other fixtures) carries,
# so `-m "not docker and not slow and not network"` (the fast run, see docs/development.md)
# never starts a daemon, a registry, or a real image build.
FIXTURE_MARKERS: dict[str, frozenset[str]] = {
    "docker_engine": frozenset({"docker"}),
    "registry": frozenset({"registry"}),
    "local_registry": frozenset({"registry"}),
    "docs_registry": frozenset({"registry"}),
    # scan's one read of the real Debian security mirror, of the suite's base image.
    "real_scan": frozenset({"docker", "network"}),
    # Real torch images (GBs, minutes): built through the CLI once per module or session.
    **{name: frozenset({"slow"}) for name in (
        "runtime_image", "devel_image", "devel_jupyter_image", "jupyter_image", "buildkit_images",
        "arm64_image", "first_run", "signed_run", "bk_published", "devel_verdict")},
    "signed_publish": frozenset({"slow", "registry"}),
    # Every smoke test for real on this host's torch (a gloo all-reduce, an Inductor compile).
    "local_runs": frozenset({"slow"}),
    "full_run": frozenset({"slow"}),
}

# --- real torch images by family: the images of one lock share BuildKit's layers ------------

# A family: the fixtures whose images are built from one lock (so from the same BuildKit
# layers). The session's BuildKit records are pruned after every module and every released
# image (the disk is shared), except a family's own records while the family has users left:
# each image content is built once, and its later users are served from the cache. The
# modules that use a family run back to back (_group_the_families), so a family is open for as
# short a stretch as the tests allow. docs/development.md lists the families and what each costs.
IMAGE_FAMILIES: dict[str, tuple[str, ...]] = {
    # test_buildkit builds runtime and devel for real (--no-cache, with the marked CA); the
    # session's devel image (test_workspace's, test_torchcodec's) and test_publish_buildkit's
    # publishes are served from their layers.
    "torch 2.13 / CUDA 13.0 runtime and devel (debian12)": ("buildkit_images", "devel_image", "bk_published"),
    # conftest's runtime image (the README's main job, CUDA 12.1: torch 2.6's cu124 wheels), the
    # jupyter image built FROM it, and the one signed publish (BuildKit) serving test_publish and
    # test_signing: CUDA 12.4, the same cu124 lock, so the same steps up to the labels (every
    # install step served from the main job's layers).
    "torch 2.6 (cu124 wheels) runtime: CUDA 12.1 and jupyter, CUDA 12.4 published and signed (debian12)":
        ("runtime_image", "jupyter_image", "signed_publish"),
}
FAMILY_OF = {fixture: family for family, fixtures in IMAGE_FAMILIES.items() for fixture in fixtures}

# The builds that fail or are refused before torch is installed (seconds, the classic builder):
# conftest lets these run beside the builds (beside_builds).
FAILING_EARLY: dict[tuple[str, str], str] = {
    ("test_e2e.py", "test_build_failure_names_the_step_and_leaves_no_tag"): "fails at the install step (no index)",
    ("test_e2e.py", "test_missing_base_image_suggests_base_image"): "fails before building (no base)",
    ("test_e2e.py", "test_strict_refuses_the_cuda_121_fallback_before_anything_is_built"): "refused before building",
    ("test_python_install.py", "test_a_refusing_python_mirror_fails_the_build_with_one_line_naming_it"):
        "fails at the interpreter download",
    ("test_bad_inputs.py", "test_an_image_that_exists_nowhere_is_a_bad_request"): "fails before building (no base)",
    ("test_bad_inputs.py", "test_a_registry_that_cannot_be_asked_is_the_worlds_failure"): "fails before building",
    ("test_bad_inputs.py", "test_build_refuses_a_with_that_contradicts_the_torch_pins"): "refused before building",
    ("test_bad_inputs.py", "test_a_devel_base_image_without_nvcc_fails_the_first_build_step"):
        "fails at the first build step",
}
# Every other fixture or test that builds a real torch image (or starts to: the failures
# before torch are listed too), by file and function; tests/test_suite_rules.py fails when a
# build appears outside these and the family fixtures, so a new image is a decision (minutes
# of CI each), not an accident.
OTHER_REAL_BUILDS: dict[tuple[str, str], str] = {
    # The families' builds (IMAGE_FAMILIES), and their users that build again from the cache.
    ("support/real_images.py", "build_cli"): "the runtime_image family's build, with a variant",
    ("conftest.py", "runtime_image"): "family: torch 2.6 (cu124 wheels) / CUDA 12.1 runtime",
    ("conftest.py", "devel_image"): "family: torch 2.13 / CUDA 13.0 devel (served from test_buildkit's layers)",
    ("conftest.py", "signed_publish"): "family: torch 2.6 / CUDA 12.4 runtime, published and signed (from the main job's layers)",
    ("test_buildkit.py", "_build"): "buildkit_images' build through the CLI",
    ("test_buildkit.py", "buildkit_images"): "family: torch 2.13 / CUDA 13.0 runtime and devel, the real builds",
    ("conftest.py", "jupyter_image"): "family: torch 2.6 / CUDA 12.1 (JupyterLab's layer on runtime_image)",
    ("test_e2e.py", "test_a_second_identical_build_is_fully_cached"): "runtime_image again: from the cache",
    ("test_publish_buildkit.py", "_publish"): "the publish of test_publish_buildkit's tests",
    ("test_publish_buildkit.py", "_publish_replaying"): "bk_published's devel publish (devel_image's content, verdict replayed)",
    ("test_publish_buildkit.py", "bk_published"): "family: torch 2.13 / CUDA 13.0 (from test_buildkit's layers)",
    ("test_publish_buildkit.py", "test_a_republish_of_identical_content_uploads_nothing_and_moves_no_tag"):
        "the family's runtime again: from the cache",
    ("test_publish_buildkit.py", "test_an_empty_remote_engine_builds_from_the_registry_cache_verifies_and_pushes"):
        "the family's runtime on a second engine, from the registry's cache",
    ("test_publish.py", "test_second_run_skips_and_pushes_nothing"): "signed_publish's rerun: skips",
    ("test_publish.py", "test_the_next_day_adds_only_the_dated_tag"): "signed_publish's rerun: retags",
    ("test_publish.py", "test_a_release_with_common_pins_shares_their_layers_and_uploads_none_of_them"):
        "torch 2.5 (cu124) runtime published after signed_publish: the groups below cuSPARSELt from its layers",
    ("test_signing.py", "test_nothing_is_signed_when_verify_failed"): "signed_publish's image again: from the cache",
    ("test_signing.py", "test_a_failed_signing_fails_the_publish_and_the_next_run_signs"):
        "signed_publish's image again: from the cache",
    ("test_workspace.py", "devel_jupyter_image"): "JupyterLab's layer on devel_image",
    # Images of their own.
    ("test_buildkit.py", "arm64_image"): "torch 2.11 for arm64 under QEMU (its own lock and platform)",
    ("test_python_install.py", "test_a_debian13_image_runs_on_the_os_python"):
        "torch 2.6 / CUDA 12.4 on Debian 13's own Python 3.13 (its own lock)",
    **FAILING_EARLY,
}


def _group_the_families(items: list[pytest.Item]) -> None:
    """Order the modules so that each family's users run back to back (a stable sort): every
    module that uses a family moves next to the first module that uses it; the group holding a
    `most_disk` module runs first (before the session's caches grow), and that module runs last
    in its group (its last test prunes all of the session's records for a second engine)."""
    modules = list(dict.fromkeys(item.path for item in items))
    uses: dict[Path, set[str]] = {module: set() for module in modules}
    most_disk: set[Path] = set()
    for item in items:
        uses[item.path] |= {FAMILY_OF[name] for name in getattr(item, "fixturenames", ()) if name in FAMILY_OF}
        if item.get_closest_marker("most_disk") is not None:
            most_disk.add(item.path)
    first: dict[str, int] = {}
    for index, module in enumerate(modules):
        for family in sorted(uses[module]):
            first.setdefault(family, index)
    group = {module: min([index, *(first[family] for family in uses[module])]) for index, module in enumerate(modules)}
    disk_groups = {group[module] for module in most_disk}
    position = {module: index for index, module in enumerate(modules)}
    items.sort(key=lambda item: (group[item.path] not in disk_groups, group[item.path], item.path in most_disk,
                                 position[item.path]))
