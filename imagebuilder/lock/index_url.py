"""Package index URLs as users give them (--index-url, --extra-index-url).

Checked before any work (a URL uv cannot use fails the build minutes later), and split into
what a Dockerfile may show and what it must not: `https://alice:s3cr3t@mirror/simple` is
`https://mirror/simple` in the RUN line (so in every image's history) and a netrc entry
for the host, which reaches the build as a BuildKit secret (uv reads the file NETRC names).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

from ..errors import BadRequest

SCHEMES = ("http", "https", "file")


class BadIndexUrl(BadRequest):
    template = "{option} {url} is not a package index URL: {reason}; give an http(s):// or file:// URL"


@dataclass(frozen=True)
class IndexUrl:
    public: str
    """The URL without user and password: what a Dockerfile and a message may show."""
    host: str
    username: str = ""
    password: str = ""

    @property
    def has_credentials(self) -> bool:
        return bool(self.username or self.password)


def parse_index_url(url: str, option: str = "--index-url") -> IndexUrl:
    """The URL checked and split; BadIndexUrl (exit 2) for what uv could not use."""
    shown = shlex.quote(redact(url))

    def bad(reason: str) -> BadIndexUrl:
        return BadIndexUrl(option=option, url=shown, reason=reason)

    if not url:
        raise bad("it is empty")
    if any(c.isspace() or not c.isprintable() for c in url):
        raise bad("it contains a space or a control character")
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise bad(f"its scheme is {parts.scheme + '://' if parts.scheme else 'missing'}")
    try:
        port = parts.port  # raises for a port that is not a number in 0..65535
    except ValueError:
        port = 0
    if port == 0 and parts.netloc.rpartition("@")[2].rpartition("]")[2].count(":"):
        raise bad("its port is not a number from 1 to 65535")
    if parts.scheme != "file" and not parts.hostname:
        raise bad("it names no host")
    username, password = unquote(parts.username or ""), unquote(parts.password or "")
    if (username or password) and parts.scheme == "file":
        raise bad("a file:// URL takes no user or password")
    if any(c.isspace() or c in "\"'\\" for c in username + password):
        raise bad("its user or password holds a space, quote or backslash, which a netrc file cannot carry")
    netloc = parts.netloc.rpartition("@")[2]
    return IndexUrl(urlunsplit(parts._replace(netloc=netloc)), parts.hostname or "", username, password)


def redact(url: str) -> str:
    """The URL with its password (if any) replaced by ***, for messages."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    userinfo, _, host = parts.netloc.rpartition("@")
    user = userinfo.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}" if ":" in userinfo else f"{user}@{host}"))


def netrc(urls: Iterable[IndexUrl]) -> bytes:
    """The netrc file of the URLs' credentials, a line per host (the first URL of a host wins,
    as in netrc's own lookup); empty when none has any. A part the URL lacks (a token as the
    user, no password) is left out of the line."""
    lines: dict[str, str] = {}
    for url in urls:
        if url.has_credentials and url.host not in lines:
            fields = [("machine", url.host), ("login", url.username), ("password", url.password)]
            lines[url.host] = " ".join(f"{key} {value}" for key, value in fields if value) + "\n"
    return "".join(lines.values()).encode()
