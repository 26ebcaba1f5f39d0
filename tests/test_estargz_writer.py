"""write_estargz, checked by reading its blobs with gzip, zlib, tarfile and json alone, the way the
stargz snapshotter's reader does: the footer, the TOC member, each chunk from its own offset."""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import struct
import tarfile
import zlib

import pytest
from support.estargz_layers import BIG, CHUNK, EXACT, LONG_DIR, every_kind_layer

from imagebuilder.estargz.writer import Written, write_estargz


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _write(layer: bytes, profile: tuple[str, ...] = (), **options: object) -> tuple[bytes, Written]:
    out = io.BytesIO()
    written = write_estargz(io.BytesIO(layer), out, profile, chunk_size=CHUNK, **options)  # type: ignore[arg-type]
    return out.getvalue(), written


def _members(blob: bytes) -> dict[int, bytes]:
    """Each gzip member's offset -> its decompressed bytes."""
    members, offset = {}, 0
    while offset < len(blob):
        inflate = zlib.decompressobj(zlib.MAX_WBITS | 16)
        members[offset] = inflate.decompress(blob[offset:])
        assert inflate.eof
        offset = len(blob) - len(inflate.unused_data)
    return members


def _footer_offset(blob: bytes) -> int:
    footer = blob[-51:]
    assert footer[:4] == b"\x1f\x8b\x08\x04" and gzip.decompress(footer) == b""  # FEXTRA, empty
    (xlen,) = struct.unpack("<H", footer[10:12])
    extra = footer[12:12 + xlen]
    assert extra[:2] == b"SG" and struct.unpack("<H", extra[2:4])[0] == 22 and extra[20:] == b"STARGZ"
    return int(extra[4:20], 16)


def _toc(blob: bytes, written: Written) -> list[dict]:
    offset = _footer_offset(blob)
    tar_bytes = zlib.decompressobj(zlib.MAX_WBITS | 16).decompress(blob[offset:])
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        (info,) = tar.getmembers()
        document = tar.extractfile(info).read()  # type: ignore[union-attr]
    assert info.name == "stargz.index.json" and _sha(document) == written.toc_digest
    assert document.endswith(b"}")  # Go's decoder may stop there: the digest it takes must cover every byte
    toc = json.loads(document)
    assert toc["version"] == 1
    return toc["entries"]


def _names(blob: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(blob))) as tar:
        return [info.name for info in tar]


def test_the_blob_gunzips_to_the_layer_with_the_landmark_and_the_toc():
    layer = every_kind_layer()
    blob, written = _write(layer)
    stream = gzip.decompress(blob)
    assert (written.digest, written.size) == (_sha(blob), len(blob))
    assert (written.diff_id, written.uncompressed_size) == (_sha(stream), len(stream))
    assert written.annotations() == {"containerd.io/snapshot/stargz/toc.digest": written.toc_digest,
                                     "io.containers.estargz.uncompressed-size": str(len(stream))}
    with tarfile.open(fileobj=io.BytesIO(layer)) as source, tarfile.open(fileobj=io.BytesIO(stream)) as result:
        got = {info.name: info for info in result}
        for info in source:
            copy = got.pop(info.name)
            for field in ("type", "size", "mode", "mtime", "uid", "gid", "uname", "gname", "linkname"):
                assert getattr(copy, field) == getattr(info, field), (info.name, field)
            xattrs = {k: v for k, v in info.pax_headers.items() if k.startswith("SCHILY.xattr.")}
            assert {k: v for k, v in copy.pax_headers.items() if k.startswith("SCHILY.xattr.")} == xattrs
            if info.isreg():
                assert result.extractfile(copy).read() == source.extractfile(info).read()  # type: ignore[union-attr]
        assert sorted(got) == [".no.prefetch.landmark", "stargz.index.json"]
        assert result.extractfile(got[".no.prefetch.landmark"]).read() == b"\x0f"  # type: ignore[union-attr]
    assert stream.endswith(bytes(1024))
    assert _names(blob)[0] == ".no.prefetch.landmark"  # no profile: nothing to fetch ahead
    assert (written.prioritized, written.prioritized_bytes) == ((), 0)


def test_every_chunk_starts_a_gzip_member_that_holds_its_bytes_and_digest():
    blob, written = _write(every_kind_layer())
    members = _members(blob)
    entries = _toc(blob, written)
    contents = {"usr/lib/big.so": BIG, "usr/lib/exact.bin": EXACT, "usr/lib/small.py": b"print('hello')\n",
                "usr/caps": b"x", ".no.prefetch.landmark": b"\x0f", f"{LONG_DIR}/deep.txt": b"deep"}
    chunks: dict[str, list[int]] = {}
    for entry in entries:
        if entry["type"] == "reg":
            current = entry
            assert entry["digest"] == _sha(contents.get(entry["name"].removeprefix("./"), b""))
        if entry["type"] not in ("reg", "chunk") or "offset" not in entry:
            continue
        content = contents[current["name"].removeprefix("./")]
        start = entry.get("chunkOffset", 0)
        size = entry.get("chunkSize", current["size"] - start)
        assert entry["offset"] in members  # a member boundary: the reader gunzips from here
        assert members[entry["offset"]].startswith(content[start:start + size])
        assert entry["chunkDigest"] == _sha(content[start:start + size])
        chunks.setdefault(current["name"], []).append(start)
    assert chunks["./usr/lib/big.so"] == [0, CHUNK, 2 * CHUNK, 3 * CHUNK]
    assert chunks["./usr/lib/exact.bin"] == [0, CHUNK]
    by_name = {e["name"]: e for e in entries if e["type"] != "chunk"}
    assert "offset" not in by_name["./usr/lib/empty"]  # empty files have no data member
    assert by_name["./usr/lib/big.so"]["chunkSize"] == CHUNK and by_name["./usr/lib/small.py"].keys() >= {"digest"}
    assert "chunkSize" not in by_name["./usr/lib/small.py"]  # a last (here only) short chunk: to the end
    assert by_name["./usr/lib/hard.py"] | {} == {"name": "./usr/lib/hard.py", "type": "hardlink",
                                                "modtime": "2023-11-14T22:13:20Z", "linkName": "./usr/lib/small.py",
                                                "mode": 0o644, "uid": 1000, "gid": 1000}
    assert by_name["./usr/lib/link.so"]["linkName"] == "big.so" and by_name["./dev/fifo"]["type"] == "fifo"
    assert by_name["./"]["userName"] == "user" and "userName" not in by_name["./usr/"]  # named once per id
    assert by_name["./usr/caps"]["xattrs"] == {"security.capability": base64.b64encode(b"\x81\x00\xff").decode(),
                                               "user.note": base64.b64encode(b"hi").decode()}
    assert by_name[f"./{LONG_DIR}/deep.txt"]["userName"] == "other"
    assert by_name["./usr/.wh.gone"]["type"] == "reg" and by_name["./usr/lib/.wh..wh..opq"]["type"] == "reg"


def test_the_profile_comes_first_with_its_parents_then_the_landmark_then_the_rest_in_order():
    profile = ("/usr/lib/hard.py", "/not/in/this/layer.so", "opt/" + LONG_DIR[4:] + "/deep.txt", "/usr/lib/big.so",
               "./usr/lib/../lib/hard.py")
    blob, written = _write(every_kind_layer(), profile)
    names = _names(blob)
    landmark = names.index(".prefetch.landmark")
    assert names[:landmark] == [".", "./usr", "./usr/lib", "./usr/lib/small.py", "./usr/lib/hard.py", "./opt",
                                f"./{LONG_DIR}", f"./{LONG_DIR}/deep.txt", "./usr/lib/big.so"]
    assert names[landmark + 1:-1] == ["./usr/lib/empty", "./usr/lib/exact.bin", "./usr/lib/link.so",
                                      "./usr/.wh.gone", "./usr/lib/.wh..wh..opq", "./usr/caps", "./dev",
                                      "./dev/fifo"]
    assert written.prioritized == ("/usr/lib/hard.py", f"/{LONG_DIR}/deep.txt", "/usr/lib/big.so")
    assert written.prioritized_bytes == len(b"print('hello')\n") + len(b"deep") + len(BIG)
    # The snapshotter prefetches bytes 0..the landmark's offset: every prioritized chunk lies there.
    entries = _toc(blob, written)
    mark = next(e["offset"] for e in entries if e["name"] == ".prefetch.landmark")
    before = {e["name"] for e in entries if e.get("offset", mark) < mark}
    assert before == {"./usr/lib/small.py", f"./{LONG_DIR}/deep.txt", "./usr/lib/big.so"}


def test_a_profile_with_nothing_in_this_layer_gets_the_no_prefetch_landmark_first():
    blob, written = _write(every_kind_layer(), ("/etc/passwd",))
    assert _names(blob)[0] == ".no.prefetch.landmark" and written.prioritized == ()


def test_the_bytes_do_not_depend_on_the_workers_and_progress_reaches_the_end():
    layer, seen = every_kind_layer(), list[int]()
    one, written = _write(layer, ("/usr/lib/big.so",), workers=1)
    four, _ = _write(layer, ("/usr/lib/big.so",), workers=4, on_progress=seen.append)
    assert one == four
    assert seen == sorted(seen) and seen[-1] == written.uncompressed_size
    assert _write(layer, level=1)[0] != one  # the level does change them


@pytest.mark.parametrize("options", [{"level": 10}, {"level": -1}, {"workers": 0}, {"chunk_size": 0}])
def test_bad_options_are_refused(options):
    with pytest.raises(ValueError):
        write_estargz(io.BytesIO(every_kind_layer()), io.BytesIO(), **options)
