"""The eStargz format's bytes, as the stargz snapshotter's reader (estargz/, 0.12 and 0.14) reads them.

A blob is a concatenation of gzip members, so it still gunzips to one tar (the layer's diff):
the entries, `stargz.index.json` (the TOC) with the tar's end blocks in a member of its own, then
a 51-byte empty member whose gzip Extra field carries the TOC member's offset ("%016xSTARGZ").
Each chunk of a regular file's content starts a member, so its offset in the TOC is where a
reader starts to gunzip to get exactly that chunk; an entry's tar header goes into the member
that is open when the entry comes (the one that ends the previous content), as upstream's
Writer puts it.

The TOC is a JSON document {"version": 1, "entries": [...]}: one entry per tar entry, then a
"chunk" entry per further chunk; fields as upstream's TOCEntry tags, each left out when empty
(Go's omitempty), so the JSON reads as the reader expects. `innerOffset` (0.13+) is never
written: every chunk starts its own member, which both 0.12 and 0.14 read. The snapshotter
checks sha256 of these JSON bytes against the layer's annotation (ANNOTATION_TOC_DIGEST),
every chunk against its chunkDigest, and prefetches bytes 0..offset of `.prefetch.landmark`.

Pure: no I/O here; writer.py reads the layer and writes the blob.
"""

from __future__ import annotations

import base64
import json
import math
import posixpath
import struct
import tarfile
import zlib
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from ..errors import ImageBuilderError

TOC_NAME = "stargz.index.json"
PREFETCH_LANDMARK = ".prefetch.landmark"
NO_PREFETCH_LANDMARK = ".no.prefetch.landmark"
LANDMARK_CONTENTS = b"\x0f"
RESERVED = frozenset({TOC_NAME, PREFETCH_LANDMARK, NO_PREFETCH_LANDMARK})
DEFAULT_CHUNK_SIZE = 4 << 20  # upstream Writer.chunkSize()'s default
ANNOTATION_TOC_DIGEST = "containerd.io/snapshot/stargz/toc.digest"
ANNOTATION_UNCOMPRESSED_SIZE = "io.containers.estargz.uncompressed-size"
BLOCK = tarfile.BLOCKSIZE
END_OF_TAR = bytes(2 * BLOCK)
XATTR_PREFIX = "SCHILY.xattr."

# TOCEntry's JSON names in its struct's order (Go writes them in this order).
FIELDS = ("name", "type", "size", "modtime", "linkName", "mode", "uid", "gid", "userName", "groupName", "offset",
          "devMajor", "devMinor", "xattrs", "digest", "chunkOffset", "chunkSize", "chunkDigest")
KINDS: Mapping[bytes, str] = {
    tarfile.REGTYPE: "reg", tarfile.AREGTYPE: "reg", tarfile.CONTTYPE: "reg", tarfile.DIRTYPE: "dir",
    tarfile.SYMTYPE: "symlink", tarfile.LNKTYPE: "hardlink", tarfile.CHRTYPE: "char", tarfile.BLKTYPE: "block",
    tarfile.FIFOTYPE: "fifo",
}


class UnsupportedEntry(ImageBuilderError):
    template = ("layer entry {name!r} has tar type {kind!r}, which eStargz cannot hold (only files, folders, links, "
                "devices and fifos); publish this image with --compression gzip or zstd")


def clean_name(name: str) -> str:
    """A tar name as the reader keys it ("./a/", "/a", "a" -> "a"; the root -> ""), as upstream's cleanEntryName."""
    return posixpath.normpath("/" + name).lstrip("/")


def kind_of(info: tarfile.TarInfo) -> str:
    """The TOC type of a tar member; UnsupportedEntry for what eStargz cannot hold (sparse files, say)."""
    try:
        return KINDS[info.type]
    except KeyError:
        raise UnsupportedEntry(name=info.name, kind=info.type.decode("latin-1")) from None


def modtime(mtime: float) -> str:
    """RFC 3339 in UTC rounded to the second, '' for the epoch (upstream's formatModtime)."""
    if math.floor(mtime) == 0:
        return ""
    return datetime.fromtimestamp(math.floor(mtime + 0.5), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def xattrs(pax_headers: Mapping[str, str]) -> dict[str, str]:
    """The member's extended attributes, base64 as Go encodes a []byte, by name."""
    return {key[len(XATTR_PREFIX):]: base64.b64encode(value.encode("utf-8", "surrogateescape")).decode()
            for key, value in sorted(pax_headers.items()) if key.startswith(XATTR_PREFIX)}


class OwnerNames:
    """userName/groupName are written only where they change for an id (upstream's nameIfChanged)."""

    def __init__(self) -> None:
        self.users: dict[int, str] = {}
        self.groups: dict[int, str] = {}

    def user(self, uid: int, name: str) -> str:
        return self._if_changed(self.users, uid, name)

    def group(self, gid: int, name: str) -> str:
        return self._if_changed(self.groups, gid, name)

    @staticmethod
    def _if_changed(names: dict[int, str], key: int, name: str) -> str:
        if not name or names.get(key) == name:
            return ""
        names[key] = name
        return name


def entry_of(info: tarfile.TarInfo, header_name: str, owners: OwnerNames) -> dict[str, Any]:
    """The TOC entry of a tar member, without its offset and digests (the writer adds those)."""
    kind = kind_of(info)
    entry: dict[str, Any] = {
        "name": header_name, "type": kind, "modtime": modtime(info.mtime), "mode": info.mode & 0o7777,
        "uid": info.uid, "gid": info.gid, "userName": owners.user(info.uid, info.uname),
        "groupName": owners.group(info.gid, info.gname), "xattrs": xattrs(info.pax_headers),
    }
    if kind == "reg":
        entry["size"] = info.size
    elif kind in ("symlink", "hardlink"):
        entry["linkName"] = info.linkname
    elif kind in ("char", "block"):
        entry["devMajor"], entry["devMinor"] = info.devmajor, info.devminor
    return entry


def toc_json(entries: Iterable[Mapping[str, Any]], tar_split_digest: str = "") -> bytes:
    """The TOC document, laid out as Go's json.MarshalIndent(toc, "", "\\t"), with no newline after
    it (the reader hashes the bytes its decoder reads). `tar_split_digest`: zstd:chunked's
    `tarSplitDigest` (containers/storage's TOC; the snapshotter passes over it)."""
    document: dict[str, Any] = {"version": 1, "entries": [
        {key: entry[key] for key in FIELDS if key in ("name", "type") or entry.get(key)} for entry in entries]}
    if tar_split_digest:
        document["tarSplitDigest"] = tar_split_digest
    return json.dumps(document, indent="\t").encode()


def padding(size: int) -> bytes:
    """The zeros that fill a tar member's content to whole blocks."""
    return bytes(-size % BLOCK)


def header(info: tarfile.TarInfo) -> bytes:
    """The member's tar header, re-encoded in PAX format (long names, xattrs and other PAX records kept)."""
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def synthetic(name: str, size: int) -> tarfile.TarInfo:
    """A regular file the writer adds (a landmark, the TOC), as upstream's bare tar.Header: mode 0, epoch."""
    info = tarfile.TarInfo(name)
    info.size, info.mode = size, 0
    return info


def gzip_member(pieces: Sequence[bytes], level: int) -> bytes:
    """One gzip member of the pieces' bytes; a fixed header (no name, mtime 0, OS unknown) so the
    same bytes and level give the same member."""
    compressor = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
    body, crc, size = [], 0, 0
    for piece in pieces:
        body.append(compressor.compress(piece))
        crc, size = zlib.crc32(piece, crc), size + len(piece)
    body.append(compressor.flush())
    extra_flags = 2 if level == 9 else 4 if level == 1 else 0
    head = b"\x1f\x8b\x08\x00\x00\x00\x00\x00" + bytes((extra_flags, 0xFF))
    return head + b"".join(body) + struct.pack("<II", crc, size & 0xFFFFFFFF)


def footer(toc_offset: int) -> bytes:
    """The 51-byte last member: empty, stored, its Extra field 'SG' + LEN + "%016xSTARGZ" % toc_offset."""
    subfield = b"%016xSTARGZ" % toc_offset
    extra = b"SG" + struct.pack("<H", len(subfield)) + subfield
    empty_stored_block = b"\x01\x00\x00\xff\xff"
    return (b"\x1f\x8b\x08\x04\x00\x00\x00\x00\x00\xff" + struct.pack("<H", len(extra)) + extra
            + empty_stored_block + struct.pack("<II", 0, 0))

