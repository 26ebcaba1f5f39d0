"""write_estargz(codec="zstd:chunked"), checked with the zstd tool, tarfile and json alone, the
way the stargz snapshotter's zstdchunked reader reads a blob (the last footer's skippable frame,
the TOC it points at, each chunk decompressed from its own offset) and the way containers/storage
does (its annotations, the TOC and the tar-split, checked against each other as its partial pull
checks them); and the whole blob as any zstd puller reads it (skippable frames skipped): the
layer's tar."""

from __future__ import annotations

import base64
import ctypes.util
import hashlib
import io
import json
import struct
import subprocess
import tarfile

import pytest
from support.estargz_layers import BIG, CHUNK, EXACT, every_kind_layer

from imagebuilder.engine.export import ZSTD_CHUNKED
from imagebuilder.estargz.writer import Written, write_estargz


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _unzstd(data: bytes) -> bytes:
    """What the zstd tool makes of the bytes: every frame decompressed, skippable ones skipped."""
    done = subprocess.run(["zstd", "-dc"], input=data, capture_output=True, timeout=60, check=True)
    return done.stdout


def _write(layer: bytes, profile: tuple[str, ...] = (), **options: object) -> tuple[bytes, Written]:
    out = io.BytesIO()
    written = write_estargz(io.BytesIO(layer), out, profile, codec=ZSTD_CHUNKED, chunk_size=CHUNK,
                            **{"level": 3, **options})  # type: ignore[arg-type]
    return out.getvalue(), written


SKIPPABLE = b"\x50\x2a\x4d\x18"


def _frame(blob: bytes, offset: int, size: int) -> bytes:
    """The payload of the skippable frame whose payload starts at `offset`, checked to be one."""
    assert blob[offset - 8:offset] == SKIPPABLE + struct.pack("<I", size)
    return blob[offset:offset + size]


def _footers(blob: bytes) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the snapshotter's footer: TOC offset, compressed, raw, type), (containers/storage's: TOC
    offset, compressed, raw, type, tar-split offset, compressed, raw), each from its frame: the
    40-byte one last, the 64-byte one before it."""
    last, before = blob[-48:], blob[-48 - 72:-48]
    assert last[:8] == SKIPPABLE + struct.pack("<I", 40) and last[40:] == b"GnUlInUx"
    assert before[:8] == SKIPPABLE + struct.pack("<I", 64) and before[64:] == b"GnUlInUx"
    return struct.unpack("<4Q", last[8:40]), struct.unpack("<7Q", before[8:64])


def _toc(blob: bytes, written: Written) -> tuple[int, list[dict]]:
    """(the TOC's offset, its entries), read from the last footer as the snapshotter does, the
    same TOC as containers/storage's footer and both annotation sets name."""
    (offset, compressed, raw, kind), storage = _footers(blob)
    assert kind == 1 and storage[:4] == (offset, compressed, raw, 1)
    compressed_toc = _frame(blob, offset, compressed)
    document = _unzstd(compressed_toc)
    assert len(document) == raw and _sha(document) == written.toc_digest
    split_offset, split_compressed, split_raw = storage[4:]
    assert split_offset == offset + compressed + 8 and split_offset + split_compressed == len(blob) - 48 - 72
    assert written.annotations() == {
        "containerd.io/snapshot/stargz/toc.digest": written.toc_digest,
        "io.containers.estargz.uncompressed-size": str(written.uncompressed_size),
        "io.containers.zstd-chunked.manifest-checksum": _sha(compressed_toc),
        "io.containers.zstd-chunked.manifest-position": f"{offset}:{compressed}:{raw}:1"}
    assert written.storage_annotations == {
        "io.github.containers.zstd-chunked.manifest-checksum": _sha(compressed_toc),
        "io.github.containers.zstd-chunked.manifest-position": f"{offset}:{compressed}:{raw}:1",
        "io.github.containers.zstd-chunked.tarsplit-position": f"{split_offset}:{split_compressed}:{split_raw}"}
    toc = json.loads(document)
    assert toc["version"] == 1
    return offset, toc["entries"]


def _tar_split(blob: bytes) -> tuple[str, list[dict]]:
    """(the compressed tar-split's sha256, its entries), from containers/storage's footer."""
    _, storage = _footers(blob)
    compressed = _frame(blob, storage[4], storage[5])
    document = _unzstd(compressed)
    assert len(document) == storage[6] and document.endswith(b"\n")
    return _sha(compressed), [json.loads(line) for line in document.splitlines()]


def _crc64(data: bytes) -> bytes:
    """Go's crc64.Checksum(data, crc64.MakeTable(crc64.ISO)), bit by bit."""
    crc = (1 << 64) - 1
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0xD800000000000000 if crc & 1 else 0)
    return (crc ^ ((1 << 64) - 1)).to_bytes(8, "big")


def test_the_blob_decompresses_to_the_layer_with_the_landmark_and_no_toc_entry():
    layer = every_kind_layer()
    blob, written = _write(layer, ("/usr/lib/big.so",))
    stream = _unzstd(blob)
    assert (written.digest, written.size) == (_sha(blob), len(blob))
    assert (written.diff_id, written.uncompressed_size) == (_sha(stream), len(stream))
    assert stream.endswith(bytes(1024))
    with tarfile.open(fileobj=io.BytesIO(layer)) as source, tarfile.open(fileobj=io.BytesIO(stream)) as result:
        got = {info.name: info for info in result}
        for info in source:
            copy = got.pop(info.name)
            assert (copy.type, copy.size, copy.mode, copy.linkname) == (info.type, info.size, info.mode, info.linkname)
            if info.isreg():
                assert result.extractfile(copy).read() == source.extractfile(info).read()  # type: ignore[union-attr]
        assert sorted(got) == [".prefetch.landmark"]  # the TOC is in a skippable frame, not in the diff
    assert written.prioritized == ("/usr/lib/big.so",)


def test_every_chunk_starts_a_frame_that_holds_its_bytes_and_digest():
    blob, written = _write(every_kind_layer(), ("/usr/lib/big.so",))
    toc_offset, entries = _toc(blob, written)
    contents = {"usr/lib/big.so": BIG, "usr/lib/exact.bin": EXACT, "usr/lib/small.py": b"print('hello')\n"}
    starts = sorted({int(e["offset"]) for e in entries if "offset" in e} | {toc_offset - 8})
    seen: dict[str, bytes] = {}
    for entry in entries:
        name = entry["name"].removeprefix("./")
        if name not in contents or "offset" not in entry:
            continue
        offset = int(entry["offset"])
        end = starts[starts.index(offset) + 1]
        size = int(entry.get("chunkSize") or len(contents[name]) - int(entry.get("chunkOffset", 0)))
        chunk = _unzstd(blob[offset:end])[:size]
        assert _sha(chunk) == entry["chunkDigest"], entry
        seen[name] = seen.get(name, b"") + chunk
    assert seen == contents
    names = [e["name"].removeprefix("./") for e in entries]
    assert names.index("usr/lib/big.so") < names.index(".prefetch.landmark") < names.index("usr/lib/exact.bin")


def test_the_bytes_do_not_depend_on_the_workers_and_the_level_changes_them():
    layer = every_kind_layer()
    one, _ = _write(layer, workers=1)
    four, _ = _write(layer, workers=4)
    assert one == four
    fast, _ = _write(layer, workers=2, level=19)
    assert fast != one


@pytest.mark.parametrize("level", [23, -1])
def test_a_level_zstd_does_not_take_is_refused(level):
    with pytest.raises(ValueError, match="zstd:chunked level"):
        write_estargz(io.BytesIO(every_kind_layer()), io.BytesIO(), codec=ZSTD_CHUNKED, level=level)


def test_without_libzstd_publish_refuses_before_any_work(monkeypatch, tmp_path):
    """A host without libzstd: `publish --compression zstd:chunked` is one line and exit 2, in
    the checks that run before a daemon or a registry is asked (a dry run here, no daemon)."""
    from click.testing import CliRunner

    from imagebuilder.cli import cli
    from imagebuilder.estargz import zstdchunked

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    args = ["publish", "--torch", "2.6", "--cuda", "12.4", "--registry", "127.0.0.1:5999/ml", "--dry-run",
            "--compression", "zstd:chunked"]
    with_it = CliRunner().invoke(cli, args)  # this host has it: past the checks, to the (absent) registry
    assert "libzstd" not in with_it.output and "the registry at http://127.0.0.1:5999" in with_it.output, with_it.output
    monkeypatch.setattr(zstdchunked, "_loaded", [])
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert result.stdout == "" and "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith("error:") and "libzstd" in line and "--compression estargz" in line, line


def test_compression_contexts_are_reused_across_writes_not_made_per_thread():
    """Each write's pool of threads ends with the write; libzstd's contexts outlive them in a free
    list, so many layers (and images) cost no more contexts than the threads of one write."""
    from imagebuilder.estargz import zstdchunked

    layer = every_kind_layer()
    for _ in range(5):
        _write(layer, workers=4)
    assert 1 <= len(zstdchunked._library().free) <= 4


def test_the_crc64_is_gos_iso_one():
    """Values Go 1.19's hash/crc64 (ISO table) gives, and the bitwise definition on what spans
    several reductions."""
    from imagebuilder.estargz.tarsplit import Crc64

    def crc(*parts: bytes) -> str:
        state = Crc64()
        for part in parts:
            state.update(part)
        return state.digest().hex()

    assert crc(b"") == "0000000000000000" and crc(b"a") == "3420000000000000"
    assert crc(b"hello world") == "b9cf3f572ad9ac3e" == crc(b"hello", b"", b" world")
    assert crc(bytes(1000)) == "3fdf09cf356acf35"
    assert crc(BIG[:5000], BIG[5000:]) == _crc64(BIG).hex()


def test_the_tar_split_rebuilds_the_diff_and_the_toc_names_its_digest():
    """containers/storage's checks of a partial pull: the TOC's tarSplitDigest is the compressed
    tar-split's; the tar-split's segments and the files' contents, in order, are the diff byte for
    byte (its DiffID); each file's CRC-64 is its content's; its file entries are the TOC's entries."""
    blob, written = _write(every_kind_layer(), ("/usr/lib/big.so",))
    _, entries = _toc(blob, written)
    digest, split = _tar_split(blob)
    (offset, compressed, _, _), _ = _footers(blob)
    assert json.loads(_unzstd(_frame(blob, offset, compressed)))["tarSplitDigest"] == digest
    stream = _unzstd(blob)
    with tarfile.open(fileobj=io.BytesIO(stream)) as tar:
        contents = {info.name: tar.extractfile(info).read() for info in tar if info.isreg()}  # type: ignore[union-attr]
    rebuilt = []
    for position, entry in enumerate(split):
        assert entry["position"] == position and entry["type"] in (1, 2)
        if entry["type"] == 2:
            rebuilt.append(base64.b64decode(entry["payload"]))
            continue
        data = contents.get(entry["name"].rstrip("/"), b"")
        assert entry.get("size", 0) == len(data)
        assert entry["payload"] == (base64.b64encode(_crc64(data)).decode() if data else None)
        rebuilt.append(data)
    assert b"".join(rebuilt) == stream and _sha(stream) == written.diff_id
    assert split[0]["type"] == 2 and base64.b64decode(split[-2]["payload"]).endswith(bytes(1024))
    assert split[-1] == {"type": 2, "payload": "", "position": len(split) - 1}  # as tar-split's disassembler ends
    files = [entry["name"] for entry in split if entry["type"] == 1]
    assert files == [entry["name"] for entry in entries if entry["type"] != "chunk"]


def test_each_header_says_what_its_toc_entry_says():
    """containers/storage compares every header in the tar-split with its TOC entry (mode, ids,
    size, link, modtime, atime, ctime, xattrs: ensureFileMetadataAttributesMatch): a header with a
    time under the second or PAX atime/ctime records is written as the TOC says it."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, mtime in (("late", 1_700_000_000.75), ("early", 0.25)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = 1, mtime
            info.pax_headers = {"atime": "1700000001.5", "ctime": "1700000002.5", "mtime": str(mtime)}
            tar.addfile(info, io.BytesIO(b"x"))
    blob, written = _write(buffer.getvalue())
    _, entries = _toc(blob, written)
    by_name = {entry["name"]: entry for entry in entries}
    with tarfile.open(fileobj=io.BytesIO(_unzstd(blob))) as tar:
        for info in tar:
            entry = by_name[info.name]
            assert info.mtime == (1_700_000_001 if info.name == "late" else 0)
            assert entry.get("modtime", "") == ("2023-11-14T22:13:21Z" if info.name == "late" else "")
            assert not {"atime", "ctime", "mtime"} & set(info.pax_headers), info.pax_headers


def _layer_of(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 1_700_000_000, 0o755
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _noise(size: int, seed: bytes) -> bytes:
    """Bytes no two chunks of which are alike (a copy's digest names its chunk alone)."""
    return b"".join(hashlib.sha256(seed + n.to_bytes(8, "big")).digest() for n in range(-(-size // 32)))[:size]


LIBRARY = _noise(5 * CHUNK + 999, b"lib")  # six chunks, the last short
COPY_LAYER = {"usr/lib/start.py": b"import lib\n", "usr/lib/libbig.so": LIBRARY, "usr/lib/other.so": _noise(3 * CHUNK, b"o")}


def _storage_toc(blob: bytes, written: Written) -> list[dict]:
    """containers/storage's TOC, where its annotations say (and the 64-byte footer, and Podman 4's names)."""
    position = written.storage_annotations["io.github.containers.zstd-chunked.manifest-position"]
    offset, compressed, raw, kind = map(int, position.split(":"))
    _, storage = _footers(blob)
    assert storage[:4] == (offset, compressed, raw, kind) == (offset, compressed, raw, 1)
    assert written.toc_annotations["io.containers.zstd-chunked.manifest-position"] == position
    frame = _frame(blob, offset, compressed)
    assert _sha(frame) == written.storage_annotations["io.github.containers.zstd-chunked.manifest-checksum"]
    return json.loads(_unzstd(frame))["entries"]


def _snapshotter_toc(blob: bytes, written: Written) -> list[dict]:
    """The TOC the last footer names, checked against the snapshotter's annotation."""
    (offset, compressed, raw, kind), _ = _footers(blob)
    document = _unzstd(_frame(blob, offset, compressed))
    assert kind == 1 and len(document) == raw and _sha(document) == written.toc_digest
    return json.loads(document)["entries"]


def _chunk_at(blob: bytes, offset: int, size: int) -> bytes:
    """What a lazy reader gets decompressing from `offset`: the frame there, `size` bytes of it."""
    reader = subprocess.run(["zstd", "-dc"], input=blob[offset:], capture_output=True, timeout=60)
    return reader.stdout[:size]


def test_copied_chunks_lie_before_the_landmark_for_the_snapshotter_alone_and_the_diff_is_the_tar():
    layer = _layer_of(COPY_LAYER)
    plain, plain_written = _write(layer, ("/usr/lib/start.py",))
    blob, written = _write(layer, ("/usr/lib/start.py",), copied={"/usr/lib/libbig.so": {0, 2, 4, 9},
                                                                    "/usr/lib/start.py": {1}, "/not/here": {1}})
    assert _unzstd(blob) == _unzstd(plain) and written.diff_id == plain_written.diff_id
    assert written.copied_chunks == 2 and 2 * CHUNK < written.copied_bytes < 2 * CHUNK + 100  # 2, 4 (noise: stored)
    assert len(blob) > len(plain) + written.copied_bytes

    snapshotter, storage = _snapshotter_toc(blob, written), _storage_toc(blob, written)
    landmark = next(int(e["offset"]) for e in storage if e["name"] == ".prefetch.landmark")
    big = [e for e in snapshotter if e["name"] == "usr/lib/libbig.so"]
    in_place = [e for e in storage if e["name"] == "usr/lib/libbig.so"]
    assert [int(e.get("chunkOffset", 0)) // CHUNK for e in big] == list(range(6))
    for index, (moved, kept) in enumerate(zip(big, in_place, strict=True)):
        assert {k: v for k, v in moved.items() if k != "offset"} == {k: v for k, v in kept.items() if k != "offset"}
        size = min(CHUNK, len(LIBRARY) - index * CHUNK)
        want = LIBRARY[index * CHUNK:index * CHUNK + size]
        assert landmark < int(kept["offset"]) and _chunk_at(blob, int(kept["offset"]), size) == want
        if index in (2, 4):  # the copy: before the landmark, the same bytes and digest
            assert int(moved["offset"]) < landmark and _chunk_at(blob, int(moved["offset"]), size) == want
            assert _sha(want) == moved["chunkDigest"]
        else:
            assert moved["offset"] == kept["offset"]
    others = [e for e in snapshotter if e["name"] != "usr/lib/libbig.so"]
    assert others == [e for e in storage if e["name"] != "usr/lib/libbig.so"]
    # containers/storage reads its own TOC: every file's chunks one run, each ending where the next starts
    offsets = [int(e["offset"]) for e in in_place]
    assert offsets == sorted(offsets) and blob[:4] == b"\x28\xb5\x2f\xfd"  # a zstd frame first, as detectors expect


def test_without_copies_the_blob_has_one_toc_and_estargz_copies_nothing():
    layer = _layer_of(COPY_LAYER)
    plain, _ = _write(layer, ("/usr/lib/start.py",))
    none, written = _write(layer, ("/usr/lib/start.py",), copied={"/usr/lib/libbig.so": {0}, "/other": {3}})
    assert none == plain and written.copied_chunks == 0
    assert _snapshotter_toc(none, written) == _storage_toc(none, written)
    with pytest.raises(ValueError, match="zstd:chunked only"):
        write_estargz(io.BytesIO(layer), io.BytesIO(), ("/usr/lib/start.py",), chunk_size=CHUNK,
                      copied={"/usr/lib/libbig.so": {2}})
