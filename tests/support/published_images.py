"""The images the publish tests render without building them: the signed image (conftest's
signed_publish) as publish renders it for a registry, and what `publish --merge-only` merges."""

from __future__ import annotations

from imagebuilder.build.per_platform import render_spec as render
from imagebuilder.build.render import RenderedImage
from imagebuilder.build.render_options import RenderOptions, Target
from imagebuilder.lock.lockfile import load_locks, locks_dir
from imagebuilder.matrix.load import load_matrix
from imagebuilder.matrix.resolve import Request, resolve
from imagebuilder.resources import default_matrix_path
from imagebuilder.scan.fixes import OsState

from .real_images import SIGNED_CUDA, SIGNED_OS, SIGNED_TORCH, session_ca_bundle

BOTH = ("linux/amd64", "linux/arm64")
"""The platforms a merge-only publish puts one index over."""


def _os_states(base_image: str, mirror: str | None) -> dict[str, OsState]:
    """What publish reads of the base's OS for the security fixes (through the daemon where one
    answers, as its dry run does; the security suite at `mirror`, the OS's own for None)."""
    from imagebuilder.build.platforms import arch, host_platform
    from imagebuilder.engine.docker import answering_engine
    from imagebuilder.scan.mirror import HttpMirror
    from imagebuilder.scan.updates import OsStates

    engine = answering_engine()
    if engine is None:
        return {}
    states = OsStates(engine, HttpMirror(lambda line: None).get, mirror, lambda line: None)
    return {base_image: states(base_image, arch(host_platform()))}


def rendered_signed(registry: str, base_image: str, buildkit: bool = False, mirror: str | None = None) -> RenderedImage:
    """The signed image (torch 2.6, CUDA 12.4, debian12 runtime on `base_image`) as `publish`
    renders it for `registry` with test_publish's and test_signing's options (the CA bundle is
    outside the hash): with the session's CA (session_ca_bundle), whose bytes are in the install
    steps' cache keys, so a rebuild is served from signed_publish's layers; and with the security
    fixes publish reads (the suite at `mirror`, the OS's own for None)."""
    from imagebuilder.build.render_options import source_label

    matrix = load_matrix(default_matrix_path())
    spec = resolve(matrix, Request(SIGNED_TORCH, SIGNED_CUDA, None, "runtime", SIGNED_OS, base_image=base_image))
    ca = session_ca_bundle()
    opts = RenderOptions(repository=f"{registry}/pytorch", source=source_label(), ca_bundle=ca.read_bytes() if ca else None,
                         locks=load_locks(locks_dir(matrix)), buildkit=buildkit, ca_context=buildkit,
                         security_mirror=mirror, target=Target(os_states=_os_states(base_image, mirror)))
    return render(spec, matrix, opts)


def merge_images(registry: str) -> list[RenderedImage]:
    """The images test_publish's MERGE_COORDINATES select (torch 2.11, CUDA 13.0, Python 3.11,
    debian12: runtime, devel, jupyter, devel-jupyter), for `registry`."""
    from imagebuilder.build.per_platform import Reading, each_platform
    from imagebuilder.matrix.selection import Selection

    matrix = load_matrix(default_matrix_path())
    opts = RenderOptions(repository=f"{registry}/pytorch")
    (selected,) = each_platform(matrix, Selection(torch="2.11", cuda="13.0", python="3.11", os="debian12"), opts,
                                ["linux/amd64"], Reading(request=False), read_os_release=None, note=print, host="linux/amd64")
    images = list(selected.images)
    assert len(images) == 4
    return images


def platform_ref(ref: str, platform: str) -> str:
    """The ref under which one platform's job pushes its image of `ref` (TAG-amd64, TAG-arm64)."""
    return f"{ref}-{platform.rpartition('/')[2]}"
