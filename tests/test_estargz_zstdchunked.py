"""write_estargz(codec="zstd:chunked"), checked with the zstd tool, tarfile and json alone, the
way the stargz snapshotter's zstdchunked reader reads a blob: the footer's skippable frame, the
TOC it points at, each chunk decompressed from its own offset; and the whole blob as any zstd
puller reads it (skippable frames skipped): the layer's tar."""

from __future__ import annotations

import ctypes.util
import hashlib
import io
import json
import struct
import subprocess
import tarfile

import pytest

from imagebuilder.engine.export import ZSTD_CHUNKED
from imagebuilder.estargz.writer import Written, write_estargz
from test_estargz_writer import BIG, CHUNK, EXACT, _layer  # type: ignore[import-not-found]


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


def _toc(blob: bytes, written: Written) -> tuple[int, list[dict]]:
    """(the TOC's offset, its entries), read from the footer as the reader does."""
    frame = blob[-48:]
    assert frame[:8] == b"\x50\x2a\x4d\x18" + struct.pack("<I", 40)
    offset, compressed, raw, kind = struct.unpack("<QQQQ", frame[8:40])
    assert frame[40:] == b"GnUlInUx" and kind == 1
    assert blob[offset - 8:offset] == b"\x50\x2a\x4d\x18" + struct.pack("<I", compressed)
    assert offset + compressed == len(blob) - 48
    document = _unzstd(blob[offset:offset + compressed])
    assert len(document) == raw and _sha(document) == written.toc_digest
    assert written.annotations() == {
        "containerd.io/snapshot/stargz/toc.digest": written.toc_digest,
        "io.containers.estargz.uncompressed-size": str(written.uncompressed_size),
        "io.containers.zstd-chunked.manifest-checksum": _sha(blob[offset:offset + compressed]),
        "io.containers.zstd-chunked.manifest-position": f"{offset}:{compressed}:{raw}:1"}
    toc = json.loads(document)
    assert toc["version"] == 1
    return offset, toc["entries"]


def test_the_blob_decompresses_to_the_layer_with_the_landmark_and_no_toc_entry():
    layer = _layer()
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
    blob, written = _write(_layer(), ("/usr/lib/big.so",))
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
    layer = _layer()
    one, _ = _write(layer, workers=1)
    four, _ = _write(layer, workers=4)
    assert one == four
    fast, _ = _write(layer, workers=2, level=19)
    assert fast != one


@pytest.mark.parametrize("level", [23, -1])
def test_a_level_zstd_does_not_take_is_refused(level):
    with pytest.raises(ValueError, match="zstd:chunked level"):
        write_estargz(io.BytesIO(_layer()), io.BytesIO(), codec=ZSTD_CHUNKED, level=level)


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

    layer = _layer()
    for _ in range(5):
        _write(layer, workers=4)
    assert 1 <= len(zstdchunked._library().free) <= 4
