"""Pure: a request (torch, cuda, python, variant, os) x Matrix -> BuildSpec.

The image's CUDA (`--cuda`) is the toolkit the image is built for: its base image, its nvcc
in devel, its driver requirement. The torch wheel variant is chosen within the same CUDA
major: the exact one if published; else the newest published minor below it; else the
nearest newer minor, which runs through CUDA minor-version compatibility. A major is never
crossed: an 11.8 torch beside a 12.x nvcc breaks extension builds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Literal

from packaging.version import Version

from ..errors import BadRequest
from .model import CudaRelease, Matrix, OSRelease, TorchRelease, WheelVariant, driver_key
from .variants import VARIANTS, variant as variant_of

Toolchain = Literal["none", "base", "pip"]


class UnknownVersion(BadRequest):
    def describe(self) -> str:
        return f"{self.fields['what']} {self.fields['requested']} is not in matrix.yaml; known: {', '.join(self.fields['known'])}"


class NoWheelForCuda(BadRequest):
    def describe(self) -> str:
        torch, cuda = self.fields["torch"], self.fields["cuda"]
        published = ", ".join(str(v.cuda) for v in torch.variants)
        if self.fields["strict"]:
            reason = f"--strict asks for an exact match and there is no cu{cuda.key.major}{cuda.key.minor} build"
        else:
            reason = (
                f"none for CUDA {cuda.major}.x, and wheels of another CUDA major cannot be used "
                f"(an extension built with CUDA {cuda.major}.x nvcc would not load beside them); "
                "pick one of those CUDA versions"
            )
        return f"torch {torch.version} is published for CUDA {published}; {reason}"


@dataclass(frozen=True)
class Request:
    torch: str
    cuda: str
    python: str | None = None
    variant: str | None = None
    os: str | None = None
    base_image: str | None = None
    strict: bool = False


@dataclass(frozen=True)
class BuildSpec:
    torch: TorchRelease
    wheel: WheelVariant
    cuda: CudaRelease  # the image's toolkit
    os: OSRelease
    python: Version
    python_is_default: bool
    python_from_os: bool  # False: a uv-managed CPython is installed
    variant: str
    base_image: str  # for jupyter variants: the parent image they are built on (filled in by tags)
    base_is_default: bool
    toolchain: Toolchain  # devel only: where nvcc comes from
    min_driver: str  # the driver of the newest CUDA toolkit whose libraries the image carries
    notices: tuple[str, ...]
    parent: BuildSpec | None = None  # jupyter variants: the runtime or devel image they are built on

    @property
    def cudnn_major(self) -> int:
        return self.wheel.cudnn.major

    @property
    def key(self) -> str:
        """One name per image, unique across the matrix."""
        return (
            f"{self.torch.version}-cuda{self.cuda.key}-cudnn{self.cudnn_major}"
            f"-py{self.python}-{self.os.name}-{self.variant}"
        )


def _parse_version(text: str, what: str, known: list[str]) -> Version:
    try:
        return Version(text)
    except ValueError as e:  # InvalidVersion, or a number too long for int()
        raise UnknownVersion(what=what, requested=text, known=known) from e


def check_not_empty(**values: str | None) -> None:
    """An option given as "" is a mistake (an unset shell variable), not a request for the default."""
    for name, value in values.items():
        if value is not None and not value.strip():
            raise BadRequest(f"--{name} is empty; give a value (`imagebuilder matrix` lists them) "
                             "or leave the option out for the default")


def check_filters(matrix: Matrix, torch: str | None = None, cuda: str | None = None, python: str | None = None,
                  os: str | None = None, strict: bool = False) -> None:
    """Filters name things the matrix has, exactly as a request must: an unknown value (or a
    torch + CUDA pair across CUDA majors) is a bad request, not an empty listing."""
    release = find_torch(matrix, torch) if torch else None
    image_cuda = find_cuda(matrix, cuda) if cuda else None
    if os is not None and os not in matrix.oses:
        raise UnknownVersion(what="OS", requested=os, known=list(matrix.oses))
    if release is not None and image_cuda is not None:
        choose_wheel(release, image_cuda, strict)
    if python is not None:
        releases = [release] if release is not None else list(matrix.torches.values())
        shipped = sorted({p for r in releases for v in r.variants for p in (v.pythons or r.pythons)})
        known = [str(p) for p in shipped]
        wanted = _parse_version(python, "Python", known)
        wanted = Version(f"{wanted.major}.{wanted.minor}") if len(wanted.release) > 2 else wanted
        if wanted not in shipped:
            if release is not None:
                raise BadRequest(f"torch {release.version} ships no wheels for Python {python}; "
                                 f"it ships {', '.join(known)}")
            raise BadRequest(f"no torch release of the matrix ships wheels for Python {python}; "
                             f"they ship {', '.join(known)}")


def find_torch(matrix: Matrix, requested: str) -> TorchRelease:
    known = [str(t.version) for t in matrix.torches.values()]
    wanted = _parse_version(requested, "torch", known)
    for release in matrix.torches.values():
        if len(wanted.release) == 2 and release.key == f"{wanted.major}.{wanted.minor}":
            return release
        if wanted == release.version:
            return release
    raise UnknownVersion(what="torch", requested=requested, known=known)


def find_cuda(matrix: Matrix, requested: str) -> CudaRelease:
    known = [str(c.key) for c in sorted(matrix.cudas.values(), key=lambda c: c.key)]
    wanted = _parse_version(requested, "CUDA", known)
    for cuda in matrix.cudas.values():
        if wanted == cuda.key or wanted == cuda.version:
            return cuda
    raise UnknownVersion(what="CUDA", requested=requested, known=known)


def choose_wheel(torch: TorchRelease, cuda: CudaRelease, strict: bool = False) -> tuple[WheelVariant, str | None]:
    """The wheel variant for an image CUDA, and a notice when it is not an exact match."""
    same_major = [v for v in torch.variants if v.cuda.major == cuda.key.major]
    exact = [v for v in same_major if v.cuda == cuda.key]
    if exact:
        return exact[0], None
    if strict or not same_major:
        raise NoWheelForCuda(torch=torch, cuda=cuda, strict=strict)
    older = [v for v in same_major if v.cuda < cuda.key]
    if older:
        wheel = max(older, key=lambda v: v.cuda)
        return wheel, (
            f"torch {torch.version} has no CUDA {cuda.key} wheels; using {wheel.name} wheels "
            f"(the newest older {cuda.major}.x build) on the CUDA {cuda.version} image"
        )
    wheel = min(same_major, key=lambda v: v.cuda)
    return wheel, (
        f"torch {torch.version} has no CUDA {cuda.key} wheels; using {wheel.name} wheels on the "
        f"CUDA {cuda.version} image, which run there through CUDA minor-version compatibility "
        f"(needs driver >= {cuda.min_driver_compat}; PTX JIT of {wheel.cuda} code is not available)"
    )


def default_python(torch: TorchRelease, os: OSRelease, wheel: WheelVariant) -> Version:
    """The OS's own python3 when torch ships for it (no download, distro security fixes);
    else the Python torch ships nearest above it (ubuntu22.04's 3.10 with torch 2.15, which
    starts at 3.11: 3.11, not the newest, whose wheels the rest of the ecosystem may still lack);
    else, for an OS newer than the release, the newest Python it ships."""
    shipped = wheel.pythons or torch.pythons
    if os.python in shipped:
        return os.python
    newer = [p for p in shipped if p > os.python]
    return min(newer) if newer else max(shipped)


def _choose_python(requested: str | None, torch: TorchRelease, os: OSRelease, wheel: WheelVariant) -> tuple[Version, bool]:
    shipped = wheel.pythons or torch.pythons
    default = default_python(torch, os, wheel)
    if requested is None:
        return default, True
    known = [str(p) for p in shipped]
    wanted = _parse_version(requested, "Python", known)
    wanted = Version(f"{wanted.major}.{wanted.minor}") if len(wanted.release) > 2 else wanted
    if wanted not in shipped:
        raise BadRequest(
            f"torch {torch.version} ({wheel.name}) ships no wheels for Python {requested}; it ships {', '.join(known)}"
        )
    return wanted, wanted == default


def _choose_base(
    matrix: Matrix, cuda: CudaRelease, os: OSRelease, variant: str, override: str | None
) -> tuple[str, bool, Toolchain, str | None]:
    """Base image, whether it is the default, and (devel) where nvcc comes from."""
    kind = variant_of(variant).base
    published = cuda.images.get(os.name, {}).get(kind)
    if override:
        if not variant_of(variant).toolchain:
            return override, False, "none", None
        if cuda.pip_toolchain:
            return override, False, "pip", None
        return override, False, "base", (
            f"--base-image {override} must provide nvcc {cuda.key} under /usr/local/cuda "
            f"(CUDA {cuda.major}.x has no pip-installable nvcc)"
        )
    if not variant_of(variant).toolchain:
        return published or os.base, True, "none", None
    if published:
        return published, True, "base", None
    if cuda.pip_toolchain:
        return os.base, True, "pip", None
    available = ", ".join(sorted(cuda.images)) or "none"
    raise BadRequest(
        f"a CUDA {cuda.key} devel image needs NVIDIA's nvidia/cuda devel base (CUDA {cuda.major}.x nvcc "
        f"is not pip-installable), and NVIDIA publishes none for {os.name}; use --os with one of: "
        f"{available}, or --base-image IMAGE that has nvcc {cuda.key}"
    )


def image_min_driver(matrix: Matrix, cuda: CudaRelease, wheel: WheelVariant) -> str:
    """The driver of the newest CUDA toolkit whose libraries the image carries: the base image's
    (`cuda`), or the wheels' nvidia-* libraries' where those are of a later toolkit (cu124 wheels
    on the CUDA 12.1 image; a wheel variant's own `min_driver` where its libraries are a later
    update of the same minor). Below it, down to the major's minor-version compatibility floor
    (`cuda.min_driver_compat`, the image's other driver label), the image runs without PTX JIT
    of the newer code, which verify notes."""
    carried = wheel.min_driver or matrix.cudas[wheel.cuda].min_driver
    return max(cuda.min_driver, carried, key=driver_key)


def resolve(matrix: Matrix, request: Request) -> BuildSpec:
    torch = find_torch(matrix, request.torch)
    cuda = find_cuda(matrix, request.cuda)
    variant = request.variant or matrix.defaults.variant
    if variant not in VARIANTS:
        raise BadRequest(f"unknown variant {variant!r}; known: {', '.join(VARIANTS)}")
    os_name = request.os or matrix.defaults.os
    if os_name not in matrix.oses:
        raise UnknownVersion(what="OS", requested=os_name, known=list(matrix.oses))
    os = matrix.oses[os_name]
    wheel, wheel_notice = choose_wheel(torch, cuda, request.strict)
    python, python_is_default = _choose_python(request.python, torch, os, wheel)
    notices = [wheel_notice] if wheel_notice else []
    asked = Version(request.cuda)
    if len(asked.release) > 2 and asked.release != cuda.version.release:
        notices.append(f"--cuda {request.cuda}: the matrix's CUDA {cuda.key} is {cuda.version} (one toolkit "
                       f"update per minor); the image is built on CUDA {cuda.version}")
    if python != os.python:
        notices.append(
            f"{os.name} ships Python {os.python}; Python {python} is installed with `uv python install`, "
            "which downloads python-build-standalone at build time (from GitHub unless --python-mirror URL)"
        )
    parent_variant = variant_of(variant).parent
    if parent_variant is not None:
        parent = resolve(matrix, replace(request, variant=parent_variant))
        return replace(
            parent,
            variant=variant,
            base_image="",  # the parent image's tag, known once tags are chosen
            base_is_default=True,
            notices=parent.notices,
            parent=parent,
        )
    base, base_is_default, toolchain, base_notice = _choose_base(matrix, cuda, os, variant, request.base_image)
    if base_notice:
        notices.append(base_notice)
    return BuildSpec(
        torch=torch,
        wheel=wheel,
        cuda=cuda,
        os=os,
        python=python,
        python_is_default=python_is_default,
        python_from_os=python == os.python,
        variant=variant,
        base_image=base,
        base_is_default=base_is_default,
        toolchain=toolchain,
        min_driver=image_min_driver(matrix, cuda, wheel),
        notices=tuple(notices),
    )


def enumerate_matrix(
    matrix: Matrix,
    torch: str | None = None,
    cuda: str | None = None,
    python: str | None = None,
    variant: str | None = None,
    os: str | None = None,
    *,
    base_image: str | None = None,
) -> Iterator[BuildSpec]:
    """Every image the matrix publishes: each torch release x each of its published CUDA
    variants (image CUDA = wheel CUDA) x OS x variant, at the default Python unless one is
    asked for. Combinations that cannot be built (no devel base for that OS) are left out.
    Filters take the same forms as the build options; `base_image` replaces every FROM."""
    torches = [find_torch(matrix, torch)] if torch else list(matrix.torches.values())
    wanted_cuda = find_cuda(matrix, cuda).key if cuda else None
    for release in torches:
        for wheel in release.variants:
            if wanted_cuda is not None and wheel.cuda != wanted_cuda:
                continue
            for os_name in [os] if os else list(matrix.oses):
                for kind in [variant] if variant else list(VARIANTS):
                    request = Request(str(release.version), str(wheel.cuda), python, kind, os_name, base_image)
                    try:
                        yield resolve(matrix, request)
                    except BadRequest:
                        if torch and cuda and os and variant:
                            raise
