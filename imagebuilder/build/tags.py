"""Pure: BuildSpec -> image tags and OCI labels.

Tags follow the official pytorch/pytorch style, `{torch}-cuda{cuda}-cudnn{major}-{variant}`,
for the default Python and OS; other Pythons and OSes add `-py{X.Y}` and `-{os}`. Every image
also carries its fully qualified tag (all five coordinates), so no image is ever reachable
only through a moving alias. An image built `--with` packages is another image: each of its
tags ends in `-with-{hash}` of the packages added, so that it never replaces the plain image.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date

from ..lock.lockfile import with_suffix
from ..matrix.model import Matrix
from ..matrix.resolve import BuildSpec
from ..matrix.variants import variant
from ..trust import labels as L


def qualified_tag(spec: BuildSpec) -> str:
    return spec.key


def primary_tag(spec: BuildSpec, matrix: Matrix) -> str:
    parts = [f"{spec.torch.version}-cuda{spec.cuda.key}-cudnn{spec.cudnn_major}"]
    if not spec.python_is_default:
        parts.append(f"py{spec.python}")
    if spec.os.name != matrix.defaults.os:
        parts.append(spec.os.name)
    parts.append(spec.variant)
    return "-".join(parts)


def tags_for(spec: BuildSpec, matrix: Matrix, added: Sequence[str] = ()) -> tuple[str, ...]:
    """All tags of an image, primary first. Short aliases only for the default Python and
    OS; the release-level aliases (`2.6-runtime`, `latest`) only for the CUDA build that
    PyPI carries, which is what `pip install torch` gives users. `added`: the packages --with
    adds to matrix.yaml's (parsed), each tag then ending in their `-with-{hash}`."""
    tags = [primary_tag(spec, matrix), qualified_tag(spec)]
    if spec.python_is_default and spec.os.name == matrix.defaults.os:
        torch, minor = spec.torch.version, spec.torch.key
        tags.append(f"{minor}-cuda{spec.cuda.key}-{spec.variant}")
        if spec.wheel.name == spec.torch.pypi_variant and spec.wheel.cuda == spec.cuda.key:
            tags += [f"{torch}-{spec.variant}", f"{minor}-{spec.variant}"]
            if spec.torch == matrix.newest_torch():
                tags.append(variant(spec.variant).latest_tag)
    suffix = f"-{with_suffix(added)}" if added else ""
    return tuple(dict.fromkeys(tag + suffix for tag in tags))


def image_ref(repository: str, tag: str) -> str:
    return f"{repository}:{tag}"


def dated_tag(qualified: str, day: date) -> str:
    """The immutable tag publish adds beside the moving ones: what the image was on that day.
    `qualified`: the image's fully qualified tag (with its platform suffix, if any)."""
    return f"{qualified}-{day:%Y%m%d}"


def labels_for(spec: BuildSpec, base_image: str, inputs_hash: str, source: str,
               base_digest: str | None = None, security_fixes: str = "") -> dict[str, str]:
    """Labels that depend only on the rendered inputs (created and revision are added at
    build time so that rendering stays byte-for-byte deterministic)."""
    labels = {
        L.TITLE: f"PyTorch {spec.torch.version} ({spec.variant})",
        L.DESCRIPTION: (
            f"PyTorch {spec.torch.version} with {spec.wheel.name} wheels on CUDA {spec.cuda.version}, "
            f"Python {spec.python}, {spec.os.name}"
        ),
        L.VERSION: str(spec.torch.version),
        L.SOURCE: source,
        L.BASE_NAME: base_image,
        L.TORCH: str(spec.torch.version),
        L.TORCH_CUDA: str(spec.wheel.cuda),
        L.WHEEL: spec.wheel.name,
        L.CUDA: str(spec.cuda.version),
        L.CUDNN: str(spec.wheel.cudnn),
        L.NCCL: str(spec.wheel.nccl),
        L.PYTHON: str(spec.python),
        L.VARIANT: spec.variant,
        L.OS: spec.os.name,
        L.MIN_DRIVER: str(spec.min_driver),
        # The floor through CUDA minor-version compatibility: verify passes drivers between it
        # and min-driver, with a note (no PTX JIT there).
        L.MIN_DRIVER_COMPAT: str(spec.cuda.min_driver_compat),
        L.INPUTS_HASH: inputs_hash,
    }
    if base_digest:
        labels[L.BASE_DIGEST] = base_digest
    if security_fixes:
        labels[L.SECURITY_FIXES] = security_fixes
    return labels
