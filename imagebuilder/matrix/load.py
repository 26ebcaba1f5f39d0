"""matrix.yaml -> a frozen Matrix.

Parse first (_yaml.py), then validate everything and report every problem at once,
each with the file, the key path and the line (the packaging.metadata way). Nothing
downstream ever sees a half-valid matrix.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packaging.version import Version

from ..platforms import DEFAULT_PLATFORM, PLATFORMS
from ..resources import default_matrix_path
from ._yaml import compose
from .model import (NOTEBOOK, SERVER_PROXY_FLOOR, CudaRelease, Defaults, KeyPath, Matrix, MatrixError,
                    MatrixMissing, NotebookPins, OSRelease, Problem, Tools, TorchCodec, TorchRelease, WheelVariant,
                    driver_key)
from .variants import VARIANTS

DRIVER_VERSION = re.compile(r"\d{1,9}(\.\d{1,9}){1,2}")  # bounded: driver_key compares int()s

# --- validation: plain data -> model, collecting every problem ----------------------------


class _Checker:
    def __init__(self, lines: dict[KeyPath, int], problems: list[Problem]) -> None:
        self.lines = lines
        self.problems = problems

    def problem(self, path: KeyPath, message: str) -> None:
        line = None
        for n in range(len(path), -1, -1):
            if path[:n] in self.lines:
                line = self.lines[path[:n]]
                break
        self.problems.append(Problem(path, line, message))

    def record(
        self, data: Any, path: KeyPath, required: set[str], optional: set[str] = frozenset()  # type: ignore[assignment]
    ) -> dict[str, Any] | None:
        if not isinstance(data, dict):
            self.problem(path, f"expected a mapping, got {type(data).__name__}")
            return None
        for key in data.keys() - required - optional:
            known = ", ".join(sorted(required | optional))
            self.problem(path + (key,), f"unknown key; known keys here: {known}")
        for key in sorted(required - data.keys()):
            self.problem(path + (key,), "missing")
        return data

    def text(self, data: dict[str, Any], key: str, path: KeyPath) -> str:
        value = data.get(key)
        if not isinstance(value, str) or not value:
            if key in data:
                self.problem(path + (key,), f"expected a non-empty string, got {value!r}")
            return ""
        return value

    def version(self, data: dict[str, Any], key: str, path: KeyPath, *, nullable: bool = False) -> Version | None:
        value = data.get(key)
        if value is None and (nullable or key not in data):
            return None
        return self.version_value(value, path + (key,))

    def driver(self, data: dict[str, Any], key: str, path: KeyPath, branch_ok: bool = False) -> str:
        """A driver version; `branch_ok`: also a branch ("580"), as NVIDIA states a floor that
        every driver of the branch meets."""
        value = self.text(data, key, path)
        if value and not (DRIVER_VERSION.fullmatch(value) or (branch_ok and re.fullmatch(r"\d{1,9}", value))):
            like = "\"530.30.02\"" + (" or a branch like \"580\"" if branch_ok else "")
            self.problem(path + (key,), f"not a driver version like {like}: {value!r}")
            return ""  # reported; nothing downstream compares it
        return value

    def version_value(self, value: Any, path: KeyPath) -> Version | None:
        if not isinstance(value, str):
            hint = " (quote it: YAML reads 12.10 as the number 12.1)" if isinstance(value, float) else ""
            self.problem(path, f"expected a quoted version string, got {value!r}{hint}")
            return None
        try:
            return Version(value)
        except ValueError:  # InvalidVersion, or a number too long for int()
            self.problem(path, f"not a version: {value!r}")
            return None

    def mapping(self, data: Any, path: KeyPath, item: Callable[[str, Any, KeyPath], Any]) -> dict[str, Any]:
        if not isinstance(data, dict) or not data:
            self.problem(path, "expected a non-empty mapping")
            return {}
        out = {}
        for key, value in data.items():
            parsed = item(key, value, path + (key,))
            if parsed is not None:
                out[key] = parsed
        return out


def _parse_os(c: _Checker, name: str, data: Any, path: KeyPath) -> OSRelease | None:
    d = c.record(data, path, {"family", "python", "base", "source"}, {"ffmpeg", "rdma"})
    if d is None:
        return None
    python = c.version(d, "python", path)
    if "rdma" not in d:
        c.problem(path + ("rdma",), "missing: every image installs the OS's RDMA libraries, which NCCL loads for "
                                    "InfiniBand, RoCE and EFA; list their packages, e.g. "
                                    "[libibverbs1, ibverbs-providers, librdmacm1]")
    return OSRelease(name, c.text(d, "family", path), python or Version("0"), c.text(d, "base", path),
                     c.text(d, "source", path), _packages(c, d, "ffmpeg", path, "libavcodec59"),
                     _packages(c, d, "rdma", path, "libibverbs1"))


def _packages(c: _Checker, d: dict[str, Any], key: str, path: KeyPath, example: str) -> tuple[str, ...]:
    """An OS's list of package names under `key` (absent: none)."""
    packages = d.get(key) or []
    if not isinstance(packages, list) or not all(isinstance(p, str) and p for p in packages):
        c.problem(path + (key,), f"expected a list of OS package names like {example!r}")
        return ()
    return tuple(packages)


def _parse_torchcodec(c: _Checker, d: dict[str, Any], path: KeyPath) -> TorchCodec | None:
    raw = d.get("torchcodec")
    if raw is None:
        return None
    path = path + ("torchcodec",)
    record = c.record(raw, path, {"version", "python", "source"})
    if record is None:
        return None
    return TorchCodec(version=c.version(record, "version", path) or Version("0"),
                      pythons=_parse_pythons(c, record, path, required=True), source=c.text(record, "source", path))


def _parse_cuda(c: _Checker, key: str, data: Any, path: KeyPath) -> CudaRelease | None:
    d = c.record(data, path, {"version", "min_driver", "min_driver_compat", "images", "source"}, {"pip_toolchain"})
    if d is None:
        return None
    try:
        cuda_key = Version(key)
    except ValueError:  # InvalidVersion, or a number too long for int()
        c.problem(path, f"not a CUDA version: {key!r}")
        return None
    version = c.version(d, "version", path)
    if version is not None and version.release[:2] != cuda_key.release[:2]:
        c.problem(path + ("version",), f"{version} is not a {key} release")
    images: dict[str, dict[str, str]] = {}
    raw_images = d.get("images") or {}
    if not isinstance(raw_images, dict):
        c.problem(path + ("images",), "expected a mapping of OS to {runtime, devel} image names")
        raw_images = {}
    for os_name, pair in raw_images.items():
        p = c.record(pair, path + ("images", os_name), {"runtime", "devel"})
        if p is not None:
            images[os_name] = {k: c.text(p, k, path + ("images", os_name)) for k in ("runtime", "devel")}
    toolchain = d.get("pip_toolchain") or []
    if not isinstance(toolchain, list) or not all(isinstance(x, str) and "==" in x for x in toolchain):
        c.problem(path + ("pip_toolchain",), "expected a list of pinned requirements like 'nvidia-cuda-nvcc==13.0.88'")
        toolchain = []
    return CudaRelease(
        key=cuda_key,
        version=version or cuda_key,
        min_driver=c.driver(d, "min_driver", path),
        min_driver_compat=c.driver(d, "min_driver_compat", path, branch_ok=True),
        images=images,
        pip_toolchain=tuple(toolchain),
        source=c.text(d, "source", path),
    )


def _parse_notebook(c: _Checker, key: str, data: Any, path: KeyPath) -> NotebookPins | None:
    d = c.record(data, path, {*NOTEBOOK, "source"})
    python = c.version_value(key, path)
    if d is None or python is None:
        return None
    versions = {name: c.text(d, name, path) for name in NOTEBOOK}
    proxy_path = path + ("jupyter-server-proxy",)
    proxy = c.version_value(versions["jupyter-server-proxy"], proxy_path) if versions["jupyter-server-proxy"] else None
    if proxy is not None and proxy < SERVER_PROXY_FLOOR:
        c.problem(proxy_path, f"{proxy} is older than {SERVER_PROXY_FLOOR}, whose websocket proxy lets anyone in "
                              "without Jupyter's token (CVE-2024-28179); pin a newer release")
    return NotebookPins(python=python, versions=versions, source=c.text(d, "source", path))


def _parse_variant(c: _Checker, name: str, data: Any, path: KeyPath) -> WheelVariant | None:
    d = c.record(data, path, {"cuda", "cudnn", "nccl", "index", "source"}, {"python", "min_driver"})
    if d is None:
        return None
    return WheelVariant(
        pythons=_parse_pythons(c, d, path),
        min_driver=c.driver(d, "min_driver", path) if "min_driver" in d else None,
        name=name,
        cuda=c.version(d, "cuda", path) or Version("0"),
        cudnn=c.version(d, "cudnn", path) or Version("0"),
        nccl=c.version(d, "nccl", path) or Version("0"),
        index=c.text(d, "index", path),
        source=c.text(d, "source", path),
    )


def _parse_pythons(c: _Checker, d: dict[str, Any], path: KeyPath, *, required: bool = False) -> tuple[Version, ...]:
    raw = d.get("python")
    if raw is None and not (required and "python" in d):
        return ()
    if not isinstance(raw, list) or not raw:
        c.problem(path + ("python",), 'expected a list of Python versions like ["3.10", "3.11"]')
        return ()
    parsed = (c.version_value(v, path + ("python", str(i))) for i, v in enumerate(raw))
    return tuple(sorted(v for v in parsed if v is not None))


# torchaudio.load/save are load_with_torchcodec/save_with_torchcodec from torchaudio 2.9 on
# (matrix.yaml's header cites the docs): an image without torchcodec cannot read or write audio.
TORCHAUDIO_NEEDS_TORCHCODEC = Version("2.9")


def _parse_torch(c: _Checker, key: str, data: Any, path: KeyPath) -> TorchRelease | None:
    d = c.record(
        data,
        path,
        {"version", "torchvision", "python", "pypi_variant", "variants", "source"},
        {"torchaudio", "triton", "platforms", "torchcodec"},
    )
    if d is None:
        return None
    version = c.version(d, "version", path)
    if version is not None and f"{version.major}.{version.minor}" != key:
        c.problem(path + ("version",), f"{version} is not a {key} release")
    pythons = _parse_pythons(c, d, path, required=True)
    variants = c.mapping(d.get("variants"), path + ("variants",), lambda n, v, p: _parse_variant(c, n, v, p))
    torchaudio = c.version(d, "torchaudio", path, nullable=True)
    torchcodec = _parse_torchcodec(c, d, path)
    if torchaudio is not None and torchaudio >= TORCHAUDIO_NEEDS_TORCHCODEC and d.get("torchcodec") is None:
        c.problem(path + ("torchcodec",), f"missing: torchaudio {torchaudio} loads and saves audio through torchcodec "
                                          f"(torchaudio {TORCHAUDIO_NEEDS_TORCHCODEC}+); add the torchcodec release that "
                                          "declares this torch, with its Pythons, from its PyPI metadata")
    pypi_variant = c.text(d, "pypi_variant", path)
    if pypi_variant and variants and pypi_variant not in variants:
        c.problem(path + ("pypi_variant",), f"{pypi_variant!r} is not among this release's variants ({', '.join(variants)})")
    return TorchRelease(
        key=key,
        version=version or Version("0"),
        torchvision=c.version(d, "torchvision", path) or Version("0"),
        torchaudio=torchaudio,
        triton=c.version(d, "triton", path, nullable=True),
        pythons=pythons,
        pypi_variant=pypi_variant,
        variants=tuple(sorted(variants.values(), key=lambda v: v.cuda)),
        source=c.text(d, "source", path),
        platforms=_parse_platforms(c, d, path),
        torchcodec=torchcodec,
    )


def _parse_platforms(c: _Checker, d: dict[str, Any], path: KeyPath) -> tuple[str, ...]:
    raw = d.get("platforms", [DEFAULT_PLATFORM])
    if not isinstance(raw, list) or not raw or not all(p in PLATFORMS for p in raw):
        c.problem(path + ("platforms",), f"expected a list of platforms among {', '.join(PLATFORMS)}, got {raw!r}")
        return (DEFAULT_PLATFORM,)
    return tuple(raw)


def _cross_check(c: _Checker, defaults: Defaults, oses: dict[str, OSRelease],
                 cudas: dict[str, CudaRelease], torches: dict[str, TorchRelease], tools: Tools) -> None:
    """Relations between blocks: every reference must name something that exists."""
    # An OS's own Python is what its jupyter images run; another one is asked for by --python,
    # and refused there when it has no entry.
    for python in sorted({o.python for o in oses.values()} - set(tools.notebook)):
        c.problem(("tools", "notebook"), f"no jupyter packages for Python {python}, an OS's Python; "
                                         f"add a \"{python}\" entry with {', '.join(NOTEBOOK)}")
    cuda_keys = {cuda.key: name for name, cuda in cudas.items()}
    if defaults.os and oses and defaults.os not in oses:
        c.problem(("defaults", "os"), f"unknown OS {defaults.os!r}; known: {', '.join(oses)}")
    if defaults.variant and defaults.variant not in VARIANTS:
        c.problem(("defaults", "variant"), f"unknown variant {defaults.variant!r}; known: {', '.join(VARIANTS)}")
    for name, cuda in cudas.items():
        for os_name in cuda.images:
            if oses and os_name not in oses:
                c.problem(("cuda", name, "images", os_name), f"unknown OS; known: {', '.join(oses)}")
        if cuda.min_driver and cuda.min_driver_compat and driver_key(cuda.min_driver_compat) > driver_key(cuda.min_driver):
            c.problem(("cuda", name, "min_driver_compat"), "is above min_driver; the compatibility floor is the lower one")
    for key, torch in torches.items():
        if torch.torchcodec is not None:
            for os_name in sorted(name for name, o in oses.items() if not o.ffmpeg):
                c.problem(("os", os_name, "ffmpeg"), f"missing: torch {key} installs torchcodec, which loads the "
                                                     "OS's FFmpeg libraries; list their packages")
        for variant in torch.variants:
            if variant.cuda not in cuda_keys:
                c.problem(
                    ("torch", key, "variants", variant.name, "cuda"),
                    f"unknown CUDA {variant.cuda}; add it under cuda: or use one of {', '.join(cudas)}",
                )
            block = cudas.get(cuda_keys.get(variant.cuda, ""))
            if variant.min_driver and block is not None and block.min_driver and \
                    driver_key(variant.min_driver) <= driver_key(block.min_driver):
                c.problem(("torch", key, "variants", variant.name, "min_driver"),
                          f"is not above CUDA {variant.cuda}'s min_driver {block.min_driver}: it is for wheels "
                          "of a later toolkit update than the block names; leave it out otherwise")
            for python in sorted(set(variant.pythons) - set(torch.pythons)):
                c.problem(
                    ("torch", key, "variants", variant.name, "python"),
                    f"torch {torch.version} ships no wheels for Python {python}; "
                    f"it ships {', '.join(map(str, torch.pythons))}",
                )
            expected = f"cu{variant.cuda.major}{variant.cuda.minor}"
            if variant.name != expected:
                c.problem(("torch", key, "variants", variant.name), f"a CUDA {variant.cuda} variant is named {expected}")


def _extras(c: _Checker, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        c.problem(("extras",), "extras is a list of requirements, e.g. ['pandas==2.2.3', 'tqdm']")
        return ()
    return tuple(value)


def parse_matrix(text: str, file: Path) -> Matrix:
    data, lines, problems = compose(text, file)
    c = _Checker(lines, problems)
    top = c.record(data, (), {"schema", "defaults", "os", "cuda", "torch", "tools"}, {"extras"}) or {}
    if top and top.get("schema") != 1:
        c.problem(("schema",), f"unsupported schema {top.get('schema')!r}; this imagebuilder reads schema 1")
    d = c.record(top.get("defaults", {}), ("defaults",), {"os", "variant", "repository"}) or {}
    defaults = Defaults(*(c.text(d, k, ("defaults",)) for k in ("os", "variant", "repository")))
    t = c.record(top.get("tools", {}), ("tools",), {"uv", "ninja", "notebook"}) or {}
    notebook = c.mapping(t.get("notebook"), ("tools", "notebook"), lambda k, v, p: _parse_notebook(c, k, v, p)) if t else {}
    tools = Tools(uv=c.text(t, "uv", ("tools",)), ninja=c.text(t, "ninja", ("tools",)),
                  notebook={pins.python: pins for pins in notebook.values()})
    oses = c.mapping(top.get("os"), ("os",), lambda k, v, p: _parse_os(c, k, v, p)) if top else {}
    cudas = c.mapping(top.get("cuda"), ("cuda",), lambda k, v, p: _parse_cuda(c, k, v, p)) if top else {}
    torches = c.mapping(top.get("torch"), ("torch",), lambda k, v, p: _parse_torch(c, k, v, p)) if top else {}
    if top:
        _cross_check(c, defaults, oses, cudas, torches, tools)
    extras = _extras(c, top.get("extras"))
    if problems:
        raise MatrixError(file=file, problems=sorted(problems, key=lambda p: (p.line or 0, p.path)))
    return Matrix(
        path=file,
        defaults=defaults,
        oses=oses,
        cudas={cuda.key: cuda for cuda in cudas.values()},
        torches=dict(sorted(torches.items(), key=lambda kv: kv[1].version)),
        tools=tools,
        text=text,
        extras=extras,
    )


def matrix_file(option: str | None) -> Path:
    """The --matrix option as a path; the packaged matrix when it is not given."""
    if option is None:
        return default_matrix_path()
    if not option.strip():
        raise MatrixMissing(file="''", reason="the path is empty")
    return Path(option)


def load_matrix(path: Path) -> Matrix:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise MatrixMissing(file=path, reason=e.strerror or str(e)) from e
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise MatrixError(file=path, problems=[Problem((), line, f"not UTF-8 text (byte 0x{data[e.start]:02x}); "
                                                                 "save the file as UTF-8")]) from e
    return parse_matrix(text, path)
