"""`render` shows what `build` builds: every variant, printed or written, on every platform
build takes, refusing what build refuses (the packaged matrix, as users run it)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from imagebuilder.build.platforms import arch, host_platform
from imagebuilder.cli import cli
from imagebuilder.matrix.model import JUPYTER_PARENTS, VARIANTS

# CUDA 13.0 has a devel image on every OS (nvcc from PyPI), so every variant renders on both.
REQUEST = ["--torch", "2.13", "--cuda", "13.0"]
OSES = [None, "debian12"]  # None: matrix.yaml's default OS
FOREIGN = "linux/arm64" if host_platform() == "linux/amd64" else "linux/amd64"  # not the host's


def render(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["render", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    return result.exit_code, result.stdout, result.stderr


def header(dockerfile: str) -> str:
    """The image key the Dockerfile's header names (`# Image: KEY`)."""
    return next(line for line in dockerfile.splitlines() if line.startswith("# Image: "))[len("# Image: "):]


def os_args(os_name: str | None) -> list[str]:
    return ["--os", os_name] if os_name else []


@pytest.mark.parametrize("os_name", OSES, ids=["default-os", "debian12"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_dry_run_prints_the_dockerfile_of_the_variant_asked_for(variant, os_name):
    code, out, err = render(*REQUEST, "--variant", variant, *os_args(os_name), "--dry-run")
    assert code == 0, err
    assert header(out).endswith(f"-{os_name or 'ubuntu22.04'}-{variant}")
    assert out.count("\nFROM ") + out.startswith("FROM ") >= 1
    if variant in JUPYTER_PARENTS:  # built FROM our own runtime/devel image, which -o writes too
        assert out.split("ARG BASE_IMAGE=", 1)[1].splitlines()[0].endswith(f"-{JUPYTER_PARENTS[variant]}")
        assert "-o DIR writes both build contexts" in err


@pytest.mark.parametrize("os_name", OSES, ids=["default-os", "debian12"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_output_writes_what_build_builds(variant, os_name, tmp_path):
    out_dir = tmp_path / "ctx"
    code, out, err = render(*REQUEST, "--variant", variant, *os_args(os_name), "-o", str(out_dir))
    assert code == 0, err
    dry = render(*REQUEST, "--variant", variant, *os_args(os_name), "--dry-run")[1]
    if variant not in JUPYTER_PARENTS:
        assert (out_dir / "Dockerfile").read_text() == dry
        return
    # The jupyter image and, first, the image it is built FROM: a folder each, index.json in build order.
    index = json.loads((out_dir / "index.json").read_text())["images"]
    assert [header((out_dir / e["dir"] / "Dockerfile").read_text()).rsplit("-", 1)[-1] for e in index] == [
        JUPYTER_PARENTS[variant].rsplit("-", 1)[-1], variant.rsplit("-", 1)[-1]]
    parent, child = index
    assert child["depends_on"] == parent["ref"] and parent["depends_on"] is None
    assert (out_dir / child["dir"] / "Dockerfile").read_text() == dry
    assert f"ARG BASE_IMAGE={parent['ref']}\n" in dry
    assert (out_dir / parent["dir"] / "imagebuilder" / "manifest.json").is_file()
    assert parent["dir"] in out and child["dir"] in out


# --- platforms ------------------------------------------------------------------------------


def test_render_for_another_platform_uses_that_platforms_base_image():
    code, out, err = render(*REQUEST, "--platform", FOREIGN, "--base-image", "imagebuilder-base:bookworm",
                            "--base-image", f"{FOREIGN}=imagebuilder-base:bookworm-{arch(FOREIGN)}", "--os", "debian12",
                            "--dry-run")
    assert code == 0, err
    assert f"ARG BASE_IMAGE=imagebuilder-base:bookworm-{arch(FOREIGN)}\n" in out
    assert "--mount=type=cache" in out  # another platform than the host's is built by BuildKit
    assert f"-runtime-{arch(FOREIGN)}, " in next(line for line in out.splitlines() if line.startswith("# Tags: "))


def test_a_jupyter_image_for_another_platform_starts_from_that_platforms_runtime(tmp_path):
    code, _, err = render(*REQUEST, "--variant", "jupyter", "--platform", FOREIGN, "-o", str(tmp_path / "j"))
    assert code == 0, err
    parent, child = json.loads((tmp_path / "j" / "index.json").read_text())["images"]
    assert parent["ref"].endswith(f"-runtime-{arch(FOREIGN)}") and child["ref"].endswith(f"-jupyter-{arch(FOREIGN)}")
    assert f"ARG BASE_IMAGE={parent['ref']}\n" in (tmp_path / "j" / child["dir"] / "Dockerfile").read_text()


def test_both_platforms_write_a_folder_each(tmp_path):
    code, _, err = render(*REQUEST, "--platform", "linux/amd64,linux/arm64", "-o", str(tmp_path / "both"))
    assert code == 0, err
    index = json.loads((tmp_path / "both" / "index.json").read_text())["images"]
    assert [e["platform"] for e in index] == ["linux/amd64", "linux/arm64"]
    assert [e["dir"].rsplit("-", 1)[-1] for e in index] == ["amd64", "arm64"]


@pytest.mark.parametrize("args,message", [
    # What build refuses: PyPI has no aarch64 CUDA wheels of 2.6.
    (["--torch", "2.6", "--cuda", "12.4", "--platform", "linux/arm64", "--dry-run"],
     "torch 2.6.0 has no CUDA wheels for linux/arm64 on PyPI; the first release that has them is torch 2.11"),
    # A platform's base image for a platform not asked for was silently ignored.
    ([*REQUEST, "--base-image", "linux/arm64=imagebuilder-base:bookworm-arm64", "--dry-run"],
     "--base-image linux/arm64=... is for linux/arm64, which is not asked for"),
    # Another platform than the host's is BuildKit's; asked to render it for the classic builder, refused.
    ([*REQUEST, "--platform", FOREIGN, "--builder", "classic", "--dry-run"], "needs --builder buildkit"),
    ([*REQUEST, "--platform", "linux/amd64,linux/arm64", "--dry-run"], "give one --platform"),
    (["--all", "--platform", "linux/arm64", "-o", "x"], "not --all"),
])
def test_render_refuses_what_build_refuses(args, message, tmp_path):
    code, out, err = render(*args)
    assert code == 2, (out, err)
    assert message in err and out == ""
