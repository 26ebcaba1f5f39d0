"""Pure (but for zstd, which the standard library lacks): a .deb's changelog.Debian.gz.

A .deb is an `ar` archive (debian-binary, control.tar.*, data.tar.*); the changelog is
usr/share/doc/PACKAGE/changelog.Debian.gz in data.tar.*, compressed with xz (Debian), zstd
(Ubuntu since 21.10), gzip, bzip2 or nothing.
"""

from __future__ import annotations

import gzip
import io
import lzma
import shutil
import subprocess
import tarfile
import zlib
from typing import Literal

from ..errors import ImageBuilderError

AR_MAGIC = b"!<arch>\n"
ZSTD_TIMEOUT_S = 120
# data.tar (and data.tar.zst, decompressed first) is "r:"
TAR_MODES: dict[str, Literal["r:gz", "r:xz", "r:bz2"]] = {"gz": "r:gz", "xz": "r:xz", "bz2": "r:bz2"}
CHANGELOGS = ("changelog.Debian.gz", "changelog.gz")  # a native package has only the second


class BadDeb(ImageBuilderError):
    template = "{name}: not a .deb archive as dpkg writes it: {reason}"


def ar_members(data: bytes, name: str) -> dict[str, bytes]:
    """The members of an `ar` archive (common format, the one dpkg-deb writes), by name."""
    if not data.startswith(AR_MAGIC):
        raise BadDeb(name=name, reason="no ar magic")
    members, offset = {}, len(AR_MAGIC)
    while offset + 60 <= len(data):
        header = data[offset:offset + 60]
        if header[58:60] != b"`\n":
            raise BadDeb(name=name, reason=f"a bad member header at byte {offset}")
        try:
            size = int(header[48:58].decode("ascii").strip())
        except ValueError as e:
            raise BadDeb(name=name, reason=f"a bad member size at byte {offset}") from e
        member = header[:16].decode("ascii", "replace").strip().rstrip("/")
        members[member] = data[offset + 60:offset + 60 + size]
        offset += 60 + size + (size & 1)
    return members


def _zstd(data: bytes, name: str) -> bytes:
    program = shutil.which("zstd")
    if program is None:
        raise BadDeb(name=name, reason="its data.tar is zstd-compressed and no `zstd` program is on PATH; install zstd")
    done = subprocess.run([program, "-dc"], input=data, capture_output=True, timeout=ZSTD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise BadDeb(name=name, reason=f"zstd -dc failed: {done.stderr.decode(errors='replace').strip()[:200]}")
    return done.stdout


def changelog(deb: bytes, name: str, *, native: bool = False) -> str | None:
    """The text of the .deb's usr/share/doc/*/changelog.Debian.gz (a native package's, such as
    apt's, is changelog.gz); None when it has none: its doc folder links another package's."""
    members = ar_members(deb, name)
    data_name = next((m for m in members if m.startswith("data.tar")), None)
    if data_name is None:
        raise BadDeb(name=name, reason="no data.tar member")
    payload = members[data_name]
    if data_name.endswith(".zst"):
        payload, data_name = _zstd(payload, name), "data.tar"
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(payload), mode=TAR_MODES.get(data_name.rpartition(".")[2], "r:")) as tar:
            for member in tar:
                parts = member.name.lstrip("./").split("/")
                if (member.isfile() and len(parts) == 5 and parts[:3] == ["usr", "share", "doc"]
                        and parts[4] in CHANGELOGS and parts[4] not in found):
                    extracted = tar.extractfile(member)
                    if extracted is not None:
                        found[parts[4]] = gzip.decompress(extracted.read())
    except (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError) as e:
        raise BadDeb(name=name, reason=f"its {data_name} does not read: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
    text = found.get(CHANGELOGS[0])
    if text is None and native:  # a native package (no revision): its only changelog is Debian's
        text = found.get(CHANGELOGS[1])
    return text.decode("utf-8", "replace") if text is not None else None
