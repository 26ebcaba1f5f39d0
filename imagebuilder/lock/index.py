"""Reading the package index over HTTP: which versions have wheels, and a wheel's metadata.

Two small reads, no wheel downloaded and no installer involved (so no pip version to
depend on, and nothing an installer's configuration would change):
- a project's file list, from its simple-index page (PEP 691 JSON, or PEP 503 HTML where an
  index serves only that): every file's name, URL, hashes and Requires-Python. A wheel's
  name carries its tags, so "has a wheel for this Python and platform" is answered here;
- a wheel's METADATA (Requires-Dist, Requires-Python): the index's own metadata file where
  it serves one (PEP 658), else read out of the wheel with HTTP range requests: the zip's
  central directory from the file's end, then the METADATA member alone (a few hundred kB
  of a 0.5 GB CUDA torch wheel).

The index is the one given (`--index-url`), else PIP_INDEX_URL / UV_DEFAULT_INDEX, else
pip's default; a TLS-intercepting proxy's CA comes from SSL_CERT_FILE (OpenSSL reads it).
`matrix check --online` (drift.py) and `matrix add` (matrix_add.py) both read through here.
"""

from __future__ import annotations

import email.parser
import gzip
import io
import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Protocol

from packaging import tags as wheel_tags
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from ..errors import ImageBuilderError
from ..platforms import DEFAULT_PLATFORM, PLATFORMS
from ..registry.retry import TRANSIENT, HttpFault, RetryPolicy, send, stderr
from .index_url import redact
from .requires_dist import cuda_pins

POLICY = RetryPolicy(timeout_s=60.0, timeout_option="")
"""registry.retry's rules, with the minute an index page or a range of a wheel may take."""
CHUNK = 256 * 1024  # the least a range request asks for: the zip's tail, a member's header
JSON_PAGE = "application/vnd.pypi.simple.v1+json"


class IndexUnavailable(ImageBuilderError):
    host: str
    detail: str
    template = ("cannot read the package index at {host}: {detail}; check the network, "
                "or point --index-url at a reachable index")

    def describe(self) -> str:  # an --index-url's user and password are never shown
        return self.template.format(**{**self.fields, "host": self.fields["host"].rpartition("@")[2]})


class BadIndexAnswer(ImageBuilderError):
    url: str
    detail: str
    template = "the package index answered {url} with {detail}; point --index-url at a PEP 503/691 index"

    def describe(self) -> str:  # an --index-url's password is never shown
        return self.template.format(**{**self.fields, "url": redact(self.fields["url"])})


@dataclass(frozen=True)
class WheelMetadata:
    project: str
    version: Version
    requires_dist: tuple[Requirement, ...]
    requires_python: SpecifierSet
    filename: str  # the wheel's file name: its tags are the evidence for Pythons and platforms


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str
    requires_python: SpecifierSet
    yanked: bool
    core_metadata: bool  # the index serves `url + ".metadata"` (PEP 658)
    size: int | None = None


class Index(Protocol):
    """What drift.py and matrix_add.py read (a fake in tests is a dict or two)."""

    def versions_with_wheels(self, project: str, python: Version, platform: str = DEFAULT_PLATFORM,
                             abi: str | None = None) -> tuple[Version, ...]: ...

    def wheel_metadata(self, project: str, version: Version, python: Version,
                       platform: str = DEFAULT_PLATFORM) -> WheelMetadata: ...


def default_index_url() -> str:
    """The index pip and uv would read: their environment's, else pip's own default."""
    for name in ("PIP_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX_URL"):
        if os.environ.get(name):
            return os.environ[name].split()[0]
    from pip._internal.models.index import PyPI  # its one stable constant, not a host of ours

    return str(PyPI.simple_url)


def supported_tags(python: Version, platform: str, abi: str | None = None) -> list[wheel_tags.Tag]:
    """The tags pip accepts for CPython `python` on `platform`, most preferred first."""
    version = (python.major, python.minor)
    platforms = list(reversed(PLATFORMS[platform].wheel_tags))  # the newest glibc first, as pip prefers
    return [*wheel_tags.cpython_tags(version, [abi] if abi else None, platforms),
            *wheel_tags.compatible_tags(version, f"cp{python.major}{python.minor}", platforms)]


class PackageIndex:
    """One index, read over HTTP; every page and metadata file is read once per instance."""

    def __init__(self, url: str | None = None, policy: RetryPolicy | None = None,
                 say: Callable[[str], None] = stderr) -> None:
        self.url = (url or default_index_url()).rstrip("/") + "/"
        self.policy = POLICY if policy is None else policy
        self._say = say
        self.received = 0  # bytes read from the network, and in how many requests (bench/bench_index.py)
        self.requests = 0
        self._files: dict[str, tuple[IndexFile, ...]] = {}
        self._metadata: dict[str, WheelMetadata] = {}
        self._context = ssl.create_default_context()

    # ---- HTTP

    def _open(self, url: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        if url.startswith("file:"):
            return self._open_file(url, headers)
        request = urllib.request.Request(url, headers={"User-Agent": "imagebuilder", **headers})

        def once() -> tuple[int, dict[str, str], bytes]:
            self.requests += 1
            with urllib.request.urlopen(request, timeout=self.policy.timeout_s, context=self._context) as response:
                return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()

        try:
            status, got, body = send(once, request=f"GET {redact(url)}", policy=self.policy, idempotent=True,
                                     say=self._say)
        except HttpFault as e:
            if e.status == 404:
                return 404, {}, b""
            host = urllib.parse.urlsplit(url).netloc or url
            if not isinstance(e.error, urllib.error.HTTPError):
                raise IndexUnavailable(host=host, detail=f"GET {redact(url)}: {e.reason}") from e
            answer = f"HTTP {e.error.code} {e.error.reason}"
            if e.error.code in TRANSIENT:  # it kept failing: the index is down, not the wrong kind of server
                raise IndexUnavailable(host=host, detail=f"GET {redact(url)} answered {answer} on all {e.attempts} "
                                                         "tries") from e
            raise BadIndexAnswer(url=url, detail=answer) from e
        self.received += len(body)
        if got.get("content-encoding") == "gzip":
            body = gzip.decompress(body)
        return status, got, body

    def _open_file(self, url: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        path = urllib.request.url2pathname(urllib.parse.urlsplit(url).path)
        if os.path.isdir(path):
            path = os.path.join(path, "index.html")
        if not os.path.exists(path):
            return 404, {}, b""
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            wanted = headers.get("Range", "").removeprefix("bytes=")
            if not wanted:
                return 200, {"content-type": "text/html"}, f.read()
            start_text, _, end_text = wanted.partition("-")
            start = max(0, size - int(end_text)) if not start_text else int(start_text)
            end = min(size - 1, int(end_text)) if start_text and end_text else size - 1
            f.seek(start)
            return 206, {"content-range": f"bytes {start}-{end}/{size}"}, f.read(end - start + 1)

    # ---- the file list

    def files(self, project: str) -> tuple[IndexFile, ...]:
        """Every file of the project on the index; empty when the index has no such project."""
        name = canonicalize_name(project)
        if name not in self._files:
            url = urllib.parse.urljoin(self.url, f"{name}/")
            status, headers, body = self._open(url, {"Accept": f"{JSON_PAGE}, text/html;q=0.1",
                                                      "Accept-Encoding": "gzip"})
            if status == 404:
                self._files[name] = ()
            elif headers.get("content-type", "").startswith(JSON_PAGE):
                self._files[name] = tuple(_json_files(json.loads(body), url))
            else:
                self._files[name] = tuple(_html_files(body.decode("utf-8", "replace"), url))
        return self._files[name]

    def _wheels(self, project: str, python: Version, platform: str, abi: str | None) -> dict[Version, list[tuple[int, IndexFile]]]:
        """version -> (tag preference, file) of every wheel that installs there, yanked ones left out."""
        rank = {tag: n for n, tag in enumerate(supported_tags(python, platform, abi))}
        found: dict[Version, list[tuple[int, IndexFile]]] = {}
        for file in self.files(project):
            if file.yanked or not file.filename.endswith(".whl") or python not in file.requires_python:
                continue
            try:
                _, version, _, file_tags = parse_wheel_filename(file.filename)
            except InvalidWheelFilename:
                continue  # pre-PEP 440 names of ancient releases
            best = min((rank[t] for t in file_tags if t in rank), default=None)
            if best is not None:
                found.setdefault(version, []).append((best, file))
        return found

    def versions_with_wheels(self, project: str, python: Version, platform: str = DEFAULT_PLATFORM,
                             abi: str | None = None) -> tuple[Version, ...]:
        """Final releases of `project` that have a wheel for this Python (and ABI) on this platform,
        newest first; empty when there is none."""
        versions = self._wheels(project, python, platform, abi)
        return tuple(sorted((v for v in versions if not v.is_prerelease and not v.is_devrelease), reverse=True))

    # ---- one wheel's metadata

    def wheel_metadata(self, project: str, version: Version, python: Version,
                       platform: str = DEFAULT_PLATFORM) -> WheelMetadata:
        """The metadata of the wheel pip would install for this Python and platform."""
        wanted = Version(str(version))
        # `torch==2.14.1` is also 2.14.1+cu126 (PyTorch's own indexes label their builds so).
        candidates = [c for v, found in self._wheels(project, python, platform, None).items()
                      if v == wanted or (wanted.local is None and Version(v.public) == wanted) for c in found]
        if not candidates:
            raise BadIndexAnswer(url=urllib.parse.urljoin(self.url, f"{canonicalize_name(project)}/"),
                                 detail=f"no wheel of {project} {version} for Python {python} on {platform}")
        file = min(candidates, key=lambda c: c[0])[1]
        if file.url not in self._metadata:
            text = self._metadata_text(file)
            self._metadata[file.url] = parse_metadata(text, file.filename)
        return self._metadata[file.url]

    def _metadata_text(self, file: IndexFile) -> str:
        if file.core_metadata:
            status, _, body = self._open(file.url.split("#")[0] + ".metadata", {})
            if status == 200:
                return body.decode("utf-8")
        with zipfile.ZipFile(_RangeReader(self, file)) as wheel:
            members = [n for n in wheel.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
            if len(members) != 1:
                raise BadIndexAnswer(url=file.url, detail=f"a wheel with {len(members)} .dist-info/METADATA files")
            return wheel.read(members[0]).decode("utf-8")


def parse_metadata(text: str, filename: str) -> WheelMetadata:
    message = email.parser.Parser().parsestr(text, headersonly=True)
    requires = []
    for line in message.get_all("Requires-Dist") or []:
        try:
            requires.append(Requirement(line))
        except InvalidRequirement:
            continue  # an unparseable line names nothing we read
    return WheelMetadata(project=str(message["Name"]), version=Version(str(message["Version"])),
                         requires_dist=tuple(requires),
                         requires_python=_specifier(str(message.get("Requires-Python") or "")),
                         filename=filename)


def _specifier(text: str) -> SpecifierSet:
    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        return SpecifierSet()  # a malformed Requires-Python excludes nothing, as pip reads it


def _json_files(page: dict[str, object], url: str) -> Iterable[IndexFile]:
    for entry in page.get("files", []):  # type: ignore[attr-defined]
        metadata = entry.get("core-metadata", entry.get("dist-info-metadata", False))
        yield IndexFile(filename=entry["filename"], url=urllib.parse.urljoin(url, entry["url"]),
                        requires_python=_specifier(entry.get("requires-python") or ""),
                        yanked=bool(entry.get("yanked", False)), core_metadata=bool(metadata),
                        size=entry.get("size"))


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.anchors: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.anchors.append(dict(attrs))


def _html_files(text: str, url: str) -> Iterable[IndexFile]:
    parser = _Anchors()
    parser.feed(text)
    for a in parser.anchors:
        href = a.get("href")
        if not href:
            continue
        absolute = urllib.parse.urljoin(url, href)
        filename = urllib.parse.unquote(urllib.parse.urlsplit(absolute).path.rsplit("/", 1)[-1])
        metadata = a.get("data-core-metadata", a.get("data-dist-info-metadata"))
        yield IndexFile(filename=filename, url=absolute.split("#")[0],
                        requires_python=_specifier(a.get("data-requires-python") or ""),
                        yanked="data-yanked" in a, core_metadata=metadata is not None and metadata != "false")


class _RangeReader(io.RawIOBase):
    """A remote file as a seekable file: each read the cache misses is one HTTP range request."""

    def __init__(self, index: PackageIndex, file: IndexFile) -> None:
        super().__init__()
        self.index, self.url = index, file.url.split("#")[0]
        self.chunks: list[tuple[int, bytes]] = []
        self.pos = 0
        tail_start, tail = self._fetch(f"bytes=-{CHUNK}")
        self.size = self._size
        self.chunks.append((tail_start, tail))

    def _fetch(self, wanted: str) -> tuple[int, bytes]:
        status, headers, body = self.index._open(self.url, {"Range": wanted, "Accept-Encoding": "identity"})
        if status != 206:
            raise BadIndexAnswer(url=self.url, detail=f"HTTP {status} to a range request (the file host must "
                                                      "answer ranges, or the index serve PEP 658 metadata)")
        span, _, total = headers.get("content-range", "").removeprefix("bytes ").partition("/")
        self._size = int(total)
        return int(span.split("-")[0]), body

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self.pos = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence] + offset
        return self.pos

    def read(self, size: int = -1) -> bytes:
        end = self.size if size is None or size < 0 else min(self.size, self.pos + size)
        if end <= self.pos:
            return b""
        for start, data in self.chunks:
            if start <= self.pos and end <= start + len(data):
                out = data[self.pos - start:end - start]
                break
        else:
            start, data = self._fetch(f"bytes={self.pos}-{max(end, self.pos + CHUNK) - 1}")
            self.chunks.append((start, data))
            out = data[self.pos - start:end - start]
        self.pos += len(out)
        return out

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def cuda_platforms(index: Index, version: Version, python: Version) -> tuple[str, ...]:
    """The platforms whose torch wheel on the index is a CUDA build (it pins a CUDA runtime)."""
    return tuple(
        platform for platform in PLATFORMS
        if version in index.versions_with_wheels("torch", python, platform)
        and cuda_pins(index.wheel_metadata("torch", version, python, platform).requires_dist, python, platform)["cuda"]
    )
