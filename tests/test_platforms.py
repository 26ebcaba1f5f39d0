"""Platforms: --platform and --base-image parsing, which releases have aarch64 CUDA wheels,
and the tags an image gets per platform. Pure; no Docker."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

import pytest
from click.testing import CliRunner

from imagebuilder.build.per_platform import platform_options
from imagebuilder.build.per_platform import render_spec as render
from imagebuilder.build.platforms import (NoWheelsForPlatform, UnknownPlatform, check_platform, parse_base_images,
                                          parse_platforms)
from imagebuilder.build.render import RenderedImage
from imagebuilder.build.render_options import RenderOptions, Target
from imagebuilder.cli import cli
from imagebuilder.errors import BadRequest
from imagebuilder.matrix.load import load_matrix
from imagebuilder.matrix.model import VARIANTS
from imagebuilder.matrix.resolve import Request, resolve
from imagebuilder.resources import default_matrix_path

# Containers of the base image and classic builds of tiny images on it, no BuildKit and no
# torch image of the session's: CI runs these beside the builds (.ci/run, beside_builds).
pytestmark = pytest.mark.beside_builds

M = load_matrix(default_matrix_path())


@pytest.mark.parametrize("text, expected", [
    ("linux/arm64", ("linux/arm64",)),
    ("linux/amd64,linux/arm64", ("linux/amd64", "linux/arm64")),
    (" linux/arm64 , linux/amd64,linux/arm64", ("linux/arm64", "linux/amd64")),
])
def test_parse_platforms(text, expected):
    assert parse_platforms(text) == expected


@pytest.mark.parametrize("text", ["linux/s390x", "arm64", "linux/amd64,"])
def test_an_unknown_platform_is_a_bad_request(text):
    with pytest.raises(UnknownPlatform, match="known: linux/amd64, linux/arm64"):
        parse_platforms(text)


@pytest.mark.parametrize("values, expected", [
    (["mirror/debian:12"], {None: "mirror/debian:12"}),
    (["registry:5000/debian:12"], {None: "registry:5000/debian:12"}),
    (["linux/arm64=base:arm", "base:x86"], {"linux/arm64": "base:arm", None: "base:x86"}),
    (["linux/arm64=base:arm", "linux/amd64=base:x86"], {"linux/arm64": "base:arm", "linux/amd64": "base:x86"}),
])
def test_parse_base_images(values, expected):
    assert parse_base_images(values) == expected


@pytest.mark.parametrize("values, message", [
    (["linux/riscv64=x"], "unknown platform"),
    (["linux/arm64="], "names no image"),
    (["a", "b"], "given twice"),
])
def test_bad_base_images_are_bad_requests(values, message):
    with pytest.raises(BadRequest, match=message):
        parse_base_images(values)


@pytest.mark.parametrize("torch, arm64", [("2.6", False), ("2.10", False), ("2.11", True), ("2.14", True)])
def test_aarch64_cuda_wheels_start_with_2_11(torch, arm64):
    release = M.torches[torch]
    assert ("linux/arm64" in release.platforms) is arm64 and "linux/amd64" in release.platforms


def test_arm64_for_a_release_without_its_wheels_names_the_first_that_has_them():
    with pytest.raises(NoWheelsForPlatform) as e:
        check_platform(M, M.torches["2.6"], "linux/arm64")
    assert str(e.value) == ("torch 2.6.0 has no CUDA wheels for linux/arm64 on PyPI; "
                            "the first release that has them is torch 2.11")
    assert e.value.exit_code == 2


@pytest.mark.docker
def test_cli_arm64_for_2_6_is_exit_2_before_anything_builds(docker_engine):
    done = CliRunner().invoke(cli, ["build", "--torch", "2.6", "--cuda", "12.4", "--platform", "linux/arm64",
                                    "--builder", "buildkit"])
    assert done.exit_code == 2, done.output
    assert done.output.splitlines()[-1] == ("error: torch 2.6.0 has no CUDA wheels for linux/arm64 on PyPI; "
                                            "the first release that has them is torch 2.11")


def _on(platform: str, *, buildkit: bool = True) -> RenderOptions:
    return platform_options(RenderOptions(buildkit=buildkit), platform, host="linux/amd64")


def test_another_platform_gets_its_own_tags_and_needs_buildkit():
    spec = resolve(M, Request("2.11", "13.0", os="debian12"))
    runtime = render(spec, M)
    same = render(spec, M, _on("linux/amd64", buildkit=False))
    assert same.tags == runtime.tags and same.dockerfile == runtime.dockerfile
    arm = render(spec, M, _on("linux/arm64"))
    assert arm.tags == tuple(f"{t}-arm64" for t in runtime.tags)
    assert f"# Tags: {', '.join(arm.tags)}\n" in arm.dockerfile
    # The tags name the image; they are no input: the same content, the same hash.
    untagged = _on("linux/arm64")
    untagged = replace(untagged, target=replace(untagged.target, platform_tags=False))
    assert arm.inputs_hash == render(spec, M, untagged).inputs_hash
    with pytest.raises(BadRequest, match="needs --builder buildkit"):
        render(spec, M, _on("linux/arm64", buildkit=False))


def test_a_platform_jupyter_image_starts_from_that_platforms_runtime():
    """Its FROM, its base label and its manifest.json all name the runtime image of its own
    platform (issue 46: the label and manifest.json named the host's)."""
    spec = resolve(M, Request("2.11", "13.0", os="debian12", variant="jupyter"))
    jupyter, arm = render(spec, M), render(spec, M, _on("linux/arm64"))
    assert spec.parent is not None
    runtime_arm = render(spec.parent, M, _on("linux/arm64"))
    assert arm.depends_on == runtime_arm.ref == f"{jupyter.depends_on}-arm64"
    assert f"ARG BASE_IMAGE={runtime_arm.ref}\n" in arm.dockerfile
    assert all(tag.endswith("-arm64") for tag in arm.tags)
    assert arm.labels["org.opencontainers.image.base.name"] == runtime_arm.ref
    assert f'org.opencontainers.image.base.name="{runtime_arm.ref}"' in arm.dockerfile
    manifest = json.loads(arm.files["imagebuilder/manifest.json"])
    assert manifest["base_image"] == runtime_arm.ref and manifest["tags"] == list(arm.tags)
    # Its FROM is another image than the host's jupyter image's: another inputs hash.
    assert arm.inputs_hash != jupyter.inputs_hash


def test_a_jupyter_parent_is_rendered_once_per_command_and_platform(monkeypatch):
    """`build --variant all` on two platforms: runtime and devel are each rendered once per
    platform, although jupyter and devel-jupyter need their inputs hashes too."""
    from imagebuilder.build import per_platform
    from imagebuilder.matrix.selection import ALL, Selection

    rendered: list[tuple[str, str | None]] = []
    real = per_platform.render  # type: ignore[attr-defined]

    def counting(plan):
        rendered.append((plan.spec.variant, plan.tags[0]))
        return real(plan)

    monkeypatch.setattr(per_platform, "render", counting)
    selection = Selection("2.11", "13.0", os="debian12", variant=ALL)
    planned = per_platform.each_platform(M, selection, RenderOptions(buildkit=True), ["linux/amd64", "linux/arm64"],
                                         per_platform.Reading(request=True), read_os_release=None, note=print,
                                         host="linux/amd64")
    assert [[image.spec.variant for image in each.images] for each in planned] == [list(VARIANTS)] * 2
    assert len(rendered) == 8 and len(set(rendered)) == 8
    # A jupyter image alone brings its parent along: still one render of it.
    rendered.clear()
    one = per_platform.each_platform(M, replace(selection, variant="jupyter"), RenderOptions(), ["linux/amd64"],
                                     per_platform.Reading(request=True), read_os_release=None, note=print,
                                     host="linux/amd64")
    assert [image.spec.variant for image in one[0].images] == ["runtime", "jupyter"]
    assert [variant for variant, _ in rendered] == ["runtime", "jupyter"]


def _arm64_runtime(**options: Any) -> RenderedImage:
    from imagebuilder.build.render_options import RenderOptions
    from imagebuilder.lock.lockfile import load_locks

    locks = load_locks(default_matrix_path().parent / "locks").for_platform("linux/arm64")
    spec = resolve(M, Request("2.11", "13.0", os="debian12", variant="runtime"))
    return render(spec, M, RenderOptions(buildkit=True, locks=locks, **options))


def test_a_foreign_platform_installs_its_wheels_on_the_build_host():
    """Issue 31: linux/arm64 built on an amd64 host: a stage on $BUILDPLATFORM holds the host's
    uv with its loader and libraries, and each torch layer's RUN of the image runs that uv from
    a mount (`ld.so --library-path lib uv`, no QEMU) targeting aarch64, into the venv where the
    wheels stay. The RUNs are the native image's but for how uv is found and its target; the
    host's own platform (and a native arm64 host) keeps the bootstrapped uv."""
    native = _arm64_runtime()
    assert "$BUILDPLATFORM" not in native.dockerfile and "native-uv" not in native.dockerfile
    cross = _arm64_runtime(target=Target(foreign_platform="linux/arm64"))
    text = cross.dockerfile
    assert "FROM --platform=$BUILDPLATFORM ${BASE_IMAGE} AS native-uv\n" in text
    stage, image = text.split(" AS native-uv\n")[1].split("\nFROM ${BASE_IMAGE}\n")
    assert "uv pip install" not in stage and "--python-platform" not in stage
    assert "xargs cp -L -t /opt/imagebuilder-native/lib" in stage
    assert stage.rstrip().endswith("/opt/imagebuilder-native/ld.so --library-path /opt/imagebuilder-native/lib "
                                   "/opt/imagebuilder-native/uv --version")
    uv = 'uv="/run/imagebuilder/native/ld.so --library-path /run/imagebuilder/native/lib /run/imagebuilder/native/uv"'
    runs = re.findall(r"^# (\S+)\nRUN (.*?\{\} \+)\n", image, re.M | re.S)
    native_runs = re.findall(r"^# (\S+)\nRUN (.*?\{\} \+)\n", native.dockerfile, re.M | re.S)
    assert [name for name, _ in runs] == [name for name, _ in native_runs] and len(runs) == 8
    bootstrap = re.compile(r"uv=/var/cache/imagebuilder/uv/bin/uv-[^&]+&& \{ .*?; \}; \}")
    for (name, run), (_, plain) in zip(runs, native_runs):
        assert run.count(uv) == 1 and "bootstrap" not in run, name
        assert "--mount=type=bind,from=native-uv,source=/opt/imagebuilder-native,target=/run/imagebuilder/native" in run
        # The same RUN as the host's own image, but for finding uv, the mount and the target.
        same = (run.replace(uv, "UV").replace("        --python-platform aarch64-manylinux_2_28 \\\n", "")
                .replace("--mount=type=bind,from=native-uv,source=/opt/imagebuilder-native,"
                         "target=/run/imagebuilder/native \\\n    ", ""))
        assert same == bootstrap.sub("UV", plain), name
    assert "COPY --link" not in image
    assert any("its wheels install natively" in n for n in cross.notices)
    assert cross.inputs_hash != native.inputs_hash  # another Dockerfile: another build


def test_a_foreign_platform_without_the_shared_venv_says_everything_is_emulated():
    from imagebuilder.build.render_options import RenderOptions

    spec = resolve(M, Request("2.11", "13.0", os="debian12", variant="runtime"))
    image = render(spec, M, RenderOptions(buildkit=True, target=Target(foreign_platform="linux/arm64")))  # no lock: no shared venv
    assert "$BUILDPLATFORM" not in image.dockerfile
    assert any("every step runs under emulation" in n for n in image.notices)


def test_plan_build_marks_only_a_foreign_platform(monkeypatch):
    from imagebuilder.build import per_platform
    from imagebuilder.build.render_options import RenderOptions

    monkeypatch.setattr(per_platform, "host_platform", lambda: "linux/amd64")
    options = RenderOptions(buildkit=True)
    assert per_platform.platform_options(options, "linux/amd64").target.foreign_platform is None
    assert per_platform.platform_options(options, "linux/arm64").target.foreign_platform == "linux/arm64"


def test_the_emulated_apt_of_a_foreign_image_does_not_lock_the_native_stages_apt_cache():
    text = _arm64_runtime(target=Target(foreign_platform="linux/arm64")).dockerfile
    stage, image = text.split("\nFROM ${BASE_IMAGE}\n")
    assert "--mount=type=cache,id=imagebuilder-apt,target=" in stage
    assert "--mount=type=cache,id=imagebuilder-apt-arm64,target=" in image and "id=imagebuilder-apt," not in image
    assert "id=imagebuilder-apt," in _arm64_runtime().dockerfile  # the host's own platform: one cache, as before


def test_what_builds_nothing_checks_no_platforms_wheels():
    """render --all (and publish --merge-only) build nothing: on an arm64 host, the matrix's 2.6
    images render under their plain tags, as they did, where a build of them is refused."""
    from imagebuilder.build import per_platform
    from imagebuilder.matrix.selection import Selection

    selection = Selection(torch="2.6", cuda="12.4", variant="runtime", os="ubuntu22.04")
    (listed,) = per_platform.each_platform(M, selection, RenderOptions(), ["linux/arm64"],
                                           per_platform.Reading(request=False, parents=False, builds=False),
                                           read_os_release=None, note=print, host="linux/arm64")
    assert [image.tags for image in listed.images] == [render(resolve(M, Request("2.6", "12.4")), M).tags]
    with pytest.raises(NoWheelsForPlatform):
        per_platform.each_platform(M, selection, RenderOptions(), ["linux/arm64"], per_platform.Reading(request=True),
                                   read_os_release=None, note=print, host="linux/arm64")


def test_the_checks_before_any_daemon_render_nothing_and_refuse_what_the_plan_refuses(monkeypatch):
    """build's and publish's checks (issue 54): every image of the request checked, a jupyter
    image's parent before it, and none rendered; what the plan refuses, they refuse."""
    from imagebuilder import pipeline
    from imagebuilder.build import per_platform
    from imagebuilder.build.image_plan import ForeignNeedsBuildKit
    from imagebuilder.build.render_options import RenderRequest, for_command
    from imagebuilder.lock.lockfile import ExtraContradictsPin
    from imagebuilder.matrix.selection import ALL, Selection
    from imagebuilder.publish.planner import check_publish

    checked: list[tuple[str, str | None]] = []
    real = per_platform.check_image  # type: ignore[attr-defined]

    def counting(spec, matrix, options):
        checked.append((spec.variant, options.target.platform))
        real(spec, matrix, options)

    def no_render(plan):
        raise AssertionError(f"{plan.spec.key} rendered by a check")

    monkeypatch.setattr(per_platform, "render", no_render)
    monkeypatch.setattr(per_platform, "check_image", counting)
    monkeypatch.setattr(per_platform, "host_platform", lambda: "linux/amd64")
    selection = Selection("2.11", "13.0", os="debian12", variant=ALL)
    pipeline.check_build(M, selection, RenderRequest(), ["linux/amd64", "linux/arm64"])
    # each once per platform: a jupyter image's parent is selected too, and checked before it
    assert checked == [(variant, platform) for platform in ("linux/amd64", "linux/arm64") for variant in VARIANTS]
    checked.clear()
    check_publish(M, replace(selection, variant="jupyter"), for_command(M, RenderRequest(), "buildkit"),
                  ["linux/amd64"], multi=False, merge_only=False)
    assert checked == [("runtime", "linux/amd64"), ("jupyter", "linux/amd64")]
    with pytest.raises(ForeignNeedsBuildKit):
        pipeline.check_build(M, selection, RenderRequest(), ["linux/arm64"], kind="classic")
    with pytest.raises(ExtraContradictsPin):
        pipeline.check_build(M, selection, RenderRequest(extras=("torch==2.5.1",)), ["linux/amd64"])
