"""The package mirror over HTTP (stdlib urllib: the proxy from the environment, the CA bundle
from SSL_CERT_FILE): a suite's Packages index and a .deb from its pool, checked against the
index's SHA256. Any failure is one line (MirrorError, exit 2); a wait is said every 10 s."""

from __future__ import annotations

import gzip
import hashlib
import lzma
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable

from ..errors import ImageBuilderError
from ..registry.heartbeat import every
from .debian import Package, available
from .release import Suite

TIMEOUT_S = 60.0
SAY_EVERY_S = 10.0
INDEX_FORMATS: tuple[tuple[str, Callable[[bytes], bytes]], ...] = (
    (".xz", lzma.decompress), (".gz", gzip.decompress), ("", lambda data: data))


class MirrorError(ImageBuilderError):
    """The mirror did not answer as a Debian archive does (exit 2: no verdict on the image)."""

    exit_code = 2
    template = "{url}: {reason}"


class NotFound(MirrorError):
    template = "{url}: not found (404)"


class HttpMirror:
    """GETs with a timeout, each failure a MirrorError naming the URL."""

    def __init__(self, say: Callable[[str], None], timeout: float = TIMEOUT_S) -> None:
        self.say = say
        self.timeout = timeout

    def get(self, url: str) -> bytes:
        with every(SAY_EVERY_S, lambda: self.say(f"still fetching {url}"), name="scan-fetch"):
            try:
                with urllib.request.urlopen(url, timeout=self.timeout) as response:
                    return bytes(response.read())
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    raise NotFound(url=url) from e
                raise MirrorError(url=url, reason=f"HTTP {e.code} {e.reason}") from e
            except urllib.error.URLError as e:
                raise MirrorError(url=url, reason=f"unreachable ({e.reason})") from e
            except (OSError, ValueError) as e:  # a reset, a timeout mid-body, a malformed URL
                raise MirrorError(url=url, reason=f"{type(e).__name__}: {e}") from e


Get = Callable[[str], bytes]


def index_text(get: Get, suite: Suite) -> str:
    """The text of the suite's Packages index, in the first format the mirror has (xz, gz, plain)."""
    for suffix, decompress in INDEX_FORMATS:
        url = suite.index + suffix
        try:
            data = get(url)
        except NotFound:
            continue
        try:
            return decompress(data).decode("utf-8", "replace")
        except (lzma.LZMAError, OSError, EOFError, zlib.error) as e:
            raise MirrorError(url=url, reason=f"does not decompress ({e})") from e
    raise MirrorError(url=suite.index + "{.xz,.gz,}",
                      reason=f"no Packages index: does the mirror carry {suite.suite}/{suite.component}?")


def packages_index(get: Get, suite: Suite) -> dict[tuple[str, str], Package]:
    """The suite's Packages index: (name, arch) -> the newest version it offers."""
    return available(index_text(get, suite))


def download(get: Get, suite: Suite, package: Package) -> bytes:
    """The package's .deb from the suite's pool, its SHA256 the index's."""
    url = suite.pool(package.filename)
    data = get(url)
    if package.sha256 and hashlib.sha256(data).hexdigest() != package.sha256.lower():
        raise MirrorError(url=url, reason=f"its sha256 is not the index's {package.sha256}")
    return data
