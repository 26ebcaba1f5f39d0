"""The layer the eStargz writer tests write in both codecs: a tar with every kind of entry, and
files that end mid-chunk, on a chunk's boundary and inside one chunk."""

from __future__ import annotations

import io
import tarfile

CHUNK = 64 << 10
BIG = bytes(range(256)) * 900 + b"tail"  # 230,404 bytes: three whole 64 KiB chunks and a short one
EXACT = b"\x01" * (2 * CHUNK)
LONG_DIR = "opt/" + "d" * 60 + "/" + "e" * 60


def every_kind_layer() -> bytes:
    """A layer tar with every kind of entry, spelled as Docker and BuildKit spell them."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", **fields: object) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.size, info.mtime, info.mode = kind, len(data), 1_700_000_000, 0o644
            info.uid, info.gid, info.uname, info.gname = 1000, 1000, "user", "group"
            for key, value in fields.items():
                setattr(info, key, value)
            tar.addfile(info, io.BytesIO(data) if data else None)

        add("./", tarfile.DIRTYPE, mode=0o755)
        add("./usr/", tarfile.DIRTYPE, mode=0o755)
        add("./usr/lib/", tarfile.DIRTYPE, mode=0o755)
        add("./usr/lib/small.py", data=b"print('hello')\n")
        add("./usr/lib/empty")
        add("./usr/lib/big.so", data=BIG, mode=0o755)
        add("./usr/lib/exact.bin", data=EXACT)
        add("./usr/lib/link.so", tarfile.SYMTYPE, linkname="big.so")
        add("./usr/lib/hard.py", tarfile.LNKTYPE, linkname="./usr/lib/small.py")
        add("./usr/.wh.gone")
        add("./usr/lib/.wh..wh..opq")
        add("./usr/caps", data=b"x", pax_headers={"SCHILY.xattr.user.note": "hi",
                                                 "SCHILY.xattr.security.capability": "\udc81\x00\udcff"})
        add("./opt/", tarfile.DIRTYPE, mode=0o755)
        add(f"./{LONG_DIR}/", tarfile.DIRTYPE, mode=0o755)
        add(f"./{LONG_DIR}/deep.txt", data=b"deep", uname="other", uid=0, gid=0, gname="root")
        add("./dev/", tarfile.DIRTYPE, mode=0o755)
        add("./dev/fifo", tarfile.FIFOTYPE)
    return buffer.getvalue()
