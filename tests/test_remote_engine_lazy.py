"""The lazy-pull engine (tests/remote_engine.py, lazy=True), for real on a small image, and
the ordered layers that `publish --compression estargz` and `--compression zstd:chunked` push
(imagebuilder/publish/estargz.py): the same test for each.

The image (the base plus 40 MB of random files and a marker) is built into this host's store as
zstd, as publish builds, then pushed by the publisher: its start profile (`cat` of the marker,
/data/f7 and /data/f8, run once in the image) puts those files first in their layers, then the
prefetch landmark. An empty engine on the stargz snapshotter pulls it through a proxy that records
every request's Range: it fetches each layer's table of contents and mounts the layer over FUSE;
the files before the landmark come in one range from byte 0 through the landmark, in the first
request for any of those bytes (the prefetch); a file outside the profile comes down on demand,
right.

What the snapshotter does, read in its source (Debian's 0.12.0, which .ci/stargz-install.sh builds
from): the prefetch is one `blob.Cache(0, landmark)` (fs/layer/layer.go, `prefetch`), which asks in
one request for the 50 KB chunks of that span not yet in its HTTP cache, each run of adjacent chunks
one range (fs/remote/blob.go `cacheAt`, fs/remote/resolver.go `fetch`). Every other read asks for one
file's bytes (fs/reader/reader.go, estargz's `fileReader.ReadAt`), so only the prefetch asks for a
span that two files share. Requests are not merged across reads; a request with several ranges is one
read whose middle chunks were cached already. The HTTP cache holds 10 chunks in memory and writes the
rest to disk in the background (cache/cache.go `directoryCache.Add`), so the prefetch's own next step
(decompressing what it fetched, `verifiableReader.Cache`) or a file read may fetch prefetched chunks
again, in such a request: allowed, after the prefetch.

The cold-start benchmark (bench/bench_coldstart.py) measures the same for torch: what a
cold node downloads before `import torch` when it needs only what that reads.
"""

from __future__ import annotations

import io
import json
import os
import posixpath
import re
import shutil
import struct
import subprocess
import tarfile
import urllib.request
import uuid
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from fault_proxy import Fault, FaultProxy
from support.cleanup import remove_images
from support.unavailable import _unavailable

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
TOC_DIGEST = "containerd.io/snapshot/stargz/toc.digest"
STORAGE_KEYS = {f"io.github.containers.zstd-chunked.{key}" for key in ("manifest-checksum", "manifest-position",
                                                                       "tarsplit-position")}
FOOTER = 51
BIG_CHUNK = 4 << 20
"""The writer's chunk (estargz/toc.py DEFAULT_CHUNK_SIZE): /data/big holds ten."""
PAGES = 'imagebuilder-pages: {"/data/big":[[12582912,12648448]]}'
"""The start's own report (estargz/pages.py) of the pages it touched of /data/big: in its chunk 3."""
START = ("sh", "-c", "cat /marker /data/f7 /data/f8 >/dev/null"
         f" && dd if=/data/big bs={BIG_CHUNK} skip=3 count=1 2>/dev/null | wc -c >/dev/null && echo '{PAGES}'")
CHUNK = 50_000
"""The snapshotter's unit of a registry read (fs/remote/resolver.go, defaultChunkSize): each range
it asks for starts and ends on it."""


def _manifest(registry: str, repository: str, reference: str, entry: int = 0) -> dict[str, Any]:
    """The image's manifest from the registry (when it pushed an index, its `entry`th amd64 one:
    the first is what containerd takes)."""
    request = urllib.request.Request(f"http://{registry}/v2/{repository}/manifests/{reference}",
                                     headers={"Accept": f"{OCI_MANIFEST},{OCI_INDEX}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        manifest: dict[str, Any] = json.load(response)
    if manifest.get("mediaType") == OCI_INDEX:
        digests = [m["digest"] for m in manifest["manifests"] if m.get("platform", {}).get("architecture") == "amd64"]
        return _manifest(registry, repository, digests[entry])
    return manifest


def _build_records() -> dict[str, str]:
    """BuildKit's cache records on this host's daemon: id -> description."""
    done = subprocess.run(["docker", "system", "df", "-v", "--format", "{{json .BuildCache}}"],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or not done.stdout.strip():
        return {}
    return {str(r["ID"]): str(r.get("Description", "")) for r in json.loads(done.stdout) or []}


@pytest.fixture(params=["estargz", "zstd:chunked"])
def estargz_image(request: pytest.FixtureRequest, docker_engine: Any, registry: str, base_image: str,
                  tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The small image, built on this host's daemon as zstd and pushed by publish's eStargz
    publisher (as eStargz or zstd:chunked) with its start profile; its local image and the
    BuildKit records of its build (by their unique marker) are removed after."""
    from imagebuilder.publish.estargz import LEVELS, EstargzPublisher
    from imagebuilder.registry.client import HttpRegistry

    tag = uuid.uuid4().hex[:12]
    repository = f"imagebuilder-test/lazy-{tag}"
    ref, marker = f"{registry}/{repository}:v1", f"lazy-pull-{tag}"
    (tmp_path / "Dockerfile").write_text(
        f"FROM {base_image}\n"
        "RUN mkdir /data && for i in $(seq 1 40); do head -c 1048576 /dev/urandom >/data/f$i; done"
        " && for f in f7 f30; do sha256sum /data/$f | cut -d' ' -f1 >/$f.sha256; done"
        f" && head -c {10 * BIG_CHUNK} /dev/urandom >/data/big"
        f" && dd if=/data/big bs={BIG_CHUNK} skip=3 count=1 2>/dev/null | sha256sum | cut -d' ' -f1 >/big3.sha256"
        f" && echo {marker} >/marker\n")
    before = _build_records()
    try:
        done = subprocess.run(
            ["docker", "buildx", "build", "--output",
             f"type=image,name={ref},compression=zstd,force-compression=true,oci-mediatypes=true",
             str(tmp_path)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        said: list[str] = []
        codec = request.param
        converted = EstargzPublisher(docker_engine, HttpRegistry(), level=LEVELS[codec], codec=codec, start=START,
                                     say=said.append).push(ref, [ref], None)
        manifest = _manifest(registry, repository, "v1")
        assert converted.manifest == _manifest_digest(registry, repository)
        yield {"ref": ref, "registry": registry, "repository": repository, "marker": marker, "layers": manifest["layers"], "codec": codec,
               "manifest": manifest, "converted": converted, "said": said}
    finally:
        remove_images(docker_engine, [ref])
        for record, description in _build_records().items():
            if record not in before and marker in description:
                subprocess.run(["docker", "builder", "prune", "--force", "--all", "--filter", f"id={record}"],
                               env={**os.environ, "DOCKER_BUILDKIT": "1"}, capture_output=True, timeout=120, check=False)


def _manifest_digest(registry: str, repository: str) -> str:
    """The image manifest's digest in the tag's index (the attestation's left out)."""
    request = urllib.request.Request(f"http://{registry}/v2/{repository}/manifests/v1",
                                     headers={"Accept": f"{OCI_MANIFEST},{OCI_INDEX}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        top = json.load(response)
    return str([m["digest"] for m in top["manifests"] if m.get("platform", {}).get("architecture") == "amd64"][0])


def _blob(registry: str, repository: str, digest: str) -> bytes:
    with urllib.request.urlopen(f"http://{registry}/v2/{repository}/blobs/{digest}", timeout=60) as response:
        return bytes(response.read())


def _toc(blob: bytes) -> tuple[int, list[dict[str, Any]]]:
    """(the TOC's offset, its entries) of an eStargz or zstd:chunked blob, read as the format
    says, independently of the writer: eStargz's footer's gzip extra field holds %016x of the
    offset then STARGZ; zstd:chunked's last skippable frame the compressed TOC's offset and size."""
    if blob[-8:] == b"GnUlInUx":
        offset, compressed = struct.unpack("<QQ", blob[-40:-24])
        document = subprocess.run(["zstd", "-dc"], input=blob[offset:offset + compressed], capture_output=True,
                                  timeout=60, check=True).stdout
        return offset - 8, list(json.loads(document)["entries"])
    footer = blob[-FOOTER:]
    found = re.search(rb"([0-9a-f]{16})STARGZ", footer)
    assert found is not None, footer
    offset = int(found.group(1), 16)
    member = zlib.decompressobj(31).decompress(blob[offset:-FOOTER])
    with tarfile.open(fileobj=io.BytesIO(member)) as tar:
        toc = tar.extractfile("stargz.index.json")
        assert toc is not None
        return offset, list(json.load(toc)["entries"])


@contextmanager
def _lazy_engine(registry: str) -> Iterator[Any]:
    """The empty lazy-pull engine; skips (fails in CI) where it cannot be made."""
    from remote_engine import remote_engine

    if subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        _unavailable("ip netns does not work here (root and iproute2 needed) for the remote engine")
    for tool, why in (("containerd", "the lazy engine's own containerd (Debian's containerd package)"),
                      ("containerd-stargz-grpc", "the stargz snapshotter (.ci/stargz-install.sh builds it)")):
        if shutil.which(tool) is None:
            _unavailable(f"{tool} is not installed: {why}")
    if not Path("/dev/fuse").exists():
        _unavailable("/dev/fuse does not exist: the stargz snapshotter mounts layers over FUSE")
    with remote_engine(int(registry.rsplit(":", 1)[1]), lazy=True) as engine:
        yield engine


def _fuse_mounts(under: str) -> list[str]:
    return [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
            if line.split()[2].startswith("fuse") and line.split()[1].startswith(under)]


def _sent(link: str) -> int:
    return int(Path(f"/sys/class/net/{link}/statistics/tx_bytes").read_text())


@pytest.mark.docker
@pytest.mark.registry
def test_a_lazy_pull_prefetches_the_start_in_one_read_per_layer_and_fetches_the_rest_on_demand(
        estargz_image: dict[str, Any], registry: str) -> None:
    layers, repository = estargz_image["layers"], estargz_image["repository"]
    converted = estargz_image["converted"]
    assert all(TOC_DIGEST in layer.get("annotations", {}) for layer in layers), layers
    if estargz_image["codec"] == "zstd:chunked":  # containers/storage's manifest: the same blobs, its own keys
        storage = _manifest(registry, repository, "v1", entry=1)["layers"]
        assert [layer["digest"] for layer in storage] == [layer["digest"] for layer in layers]
        assert all(TOC_DIGEST not in layer["annotations"] and STORAGE_KEYS <= set(layer["annotations"])
                   for layer in storage), storage
    suffix = "+zstd" if estargz_image["codec"] == "zstd:chunked" else "+gzip"
    assert converted.to_json()["format"] == estargz_image["codec"]
    assert all(layer["mediaType"].endswith(suffix) for layer in layers), layers
    assert converted.profile is not None and {"/marker", "/data/f7", "/data/f8"} <= set(converted.profile.files)
    assert "/data/f30" not in converted.profile.files
    assert estargz_image["manifest"]["annotations"]["io.imagebuilder.start-profile.command"] == json.dumps(list(START))
    layer_bytes = sum(layer["size"] for layer in layers)
    assert layer_bytes > 40_000_000  # the random files do not compress

    # Each layer as the format says: the profile's files it holds, then the landmark; the TOC
    # digest its annotation names (what the snapshotter checks).
    landmarks: dict[str, tuple[int, int]] = {}  # layer digest -> (landmark offset, TOC offset)
    for layer in layers:
        blob = _blob(registry, repository, layer["digest"])
        toc_offset, entries = _toc(blob)
        names = [entry["name"] for entry in entries]
        held = int(layer["annotations"]["io.imagebuilder.start-profile.files"])
        if held:
            landmark = names.index(".prefetch.landmark")
            first = {posixpath.normpath("/" + entry["name"]) for entry in entries[:landmark] if entry["type"] == "reg"}
            assert first and first <= set(converted.profile.files), first
            landmarks[layer["digest"]] = (int(entries[landmark]["offset"]), toc_offset)
        else:
            assert ".no.prefetch.landmark" in names
    data = layers[-1]["digest"]
    copied = converted.layers[-1].copied_bytes  # zstd:chunked: /data/big's chunk 3, which the start touched
    assert data in landmarks and landmarks[data][0] < 2_500_000 + copied  # the marker, f7 and f8, not 80 MB
    data_blob = _blob(registry, repository, data)
    data_entries = _toc(data_blob)[1]
    chunk3 = _copied_chunk(estargz_image, data_blob, data_entries, layers[-1], landmarks[data][0])
    f30_offset = [int(e["offset"]) for e in data_entries if posixpath.normpath("/" + e["name"]) == "/data/f30"]
    assert f30_offset and f30_offset[0] > landmarks[data][0]
    # No one file's read spans the data layer's prefetch: only a prefetch asks for [0, landmark) at once.
    assert not _one_file_spans(data_entries, landmarks[data][0]), data_entries[:6]

    with FaultProxy(registry) as proxy, _lazy_engine(proxy.address) as lazy_engine:
        if estargz_image["codec"] == "zstd:chunked":  # chunk 3 in its place is never served: only its copy can be
            proxy.inject(Fault("GET", f"/blobs/{data}", status=500, times=None, overlapping=chunk3))
        env, ref = lazy_engine.env(), f"{proxy.address}/{repository}:v1"
        assert subprocess.run(["docker", "info", "--format", "{{.Driver}}"], env=env, capture_output=True,
                              text=True, timeout=60).stdout.strip() == "stargz"
        before = _sent(lazy_engine.link)
        pulled = subprocess.run(["docker", "pull", "--quiet", ref], env=env, capture_output=True, text=True, timeout=120)
        moved = _sent(lazy_engine.link) - before
        assert pulled.returncode == 0, pulled.stderr[-3000:]
        # Each layer's table of contents and its prefetch, not the layers.
        assert moved < layer_bytes / 2, f"the lazy pull moved {moved:,} bytes of {layer_bytes:,}"
        # Every layer is a FUSE mount of the snapshotter's, under the engine's root.
        root = str(lazy_engine.cert_path.parent)
        assert len(_fuse_mounts(root)) == len(layers), _fuse_mounts(root)

        # The files read come down, and are what the build wrote: the profile's and one outside it.
        ran = subprocess.run(["docker", "run", "--rm", ref, "sh", "-c",
                              "cat /marker; for f in f7 f30; do sha256sum /data/$f | cut -d' ' -f1; cat /$f.sha256; done;"
                              f" dd if=/data/big bs={BIG_CHUNK} skip=3 count=1 2>/dev/null | sha256sum | cut -d' ' -f1;"
                              " cat /big3.sha256"],
                             env=env, capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0, ran.stderr[-3000:]
        marker, f7, f7_at_build, f30, f30_at_build, big3, big3_at_build = ran.stdout.split()
        assert marker == estargz_image["marker"]
        assert (f7, f30, big3) == (f7_at_build, f30_at_build, big3_at_build)
        reads = list(proxy.ranges)

    # Per prioritized layer: the first request for bytes before the landmark is the prefetch; in
    # the data layer it comes before the read that brought /data/f30, outside the profile (on
    # demand, or the background fetch).
    for digest, (landmark, _toc_offset) in landmarks.items():
        # (bytes=0-1 is the snapshotter's probe of whether the registry serves ranges at all.)
        requests = [_ranges(header) for method, path, header in reads
                    if method == "GET" and path.endswith(f"/blobs/{digest}") and header not in (None, "bytes=0-1")]
        prefetch = _prefetch(requests, landmark)
        assert prefetch is not None, (landmark, requests)
        if digest == data:
            covering = [i for i, ranges in enumerate(requests) if any(a <= f30_offset[0] <= b for a, b in ranges)]
            assert covering and covering[0] > prefetch, (f30_offset, requests)

    # Stopped (SIGINT), the snapshotter unmounted every layer itself: the teardown found
    # nothing left mounted under the engine's root, and removed the root.
    assert lazy_engine.left_mounted == []
    assert _fuse_mounts(root) == [] and not Path(root).exists()


def _copied_chunk(image: dict[str, Any], blob: bytes, entries: list[dict[str, Any]], layer: dict[str, Any],
                  landmark: int) -> tuple[int, int]:
    """The first and last byte of /data/big's chunk 3 in its place (in the tar's order). zstd:chunked:
    the snapshotter's TOC (`entries`, by the last footer) has it copied before the landmark, and
    containers/storage's (by its annotations) in place; eStargz copies nothing."""
    big = [e for e in entries if posixpath.normpath("/" + e["name"]) == "/data/big"]
    assert [int(e.get("chunkOffset", 0)) for e in big] == [n * BIG_CHUNK for n in range(10)], big
    count = layer["annotations"].get("io.imagebuilder.start-profile.copied-chunks")
    if image["codec"] != "zstd:chunked":
        assert count is None
        return int(big[3]["offset"]), int(big[4]["offset"]) - 1
    assert count == "1"
    storage = _manifest(image["registry"], image["repository"], "v1", entry=1)
    annotations = next(s for s in storage["layers"] if s["digest"] == layer["digest"])["annotations"]
    offset, compressed = map(int, annotations["io.github.containers.zstd-chunked.manifest-position"].split(":")[:2])
    document = subprocess.run(["zstd", "-dc"], input=blob[offset:offset + compressed], capture_output=True,
                              timeout=60, check=True).stdout
    in_place = [e for e in json.loads(document)["entries"] if posixpath.normpath("/" + e["name"]) == "/data/big"]
    assert int(big[3]["offset"]) < landmark < int(in_place[3]["offset"]) < int(in_place[4]["offset"])
    assert [e["offset"] for n, e in enumerate(big) if n != 3] == [e["offset"] for n, e in enumerate(in_place) if n != 3]
    return int(in_place[3]["offset"]), int(in_place[4]["offset"]) - 1


def _ranges(header: str | None) -> list[tuple[int, int]]:
    """(first, last) byte of each range of a `bytes=A-B[,C-D...]` Range header."""
    found = re.fullmatch(r"bytes=(\d+-\d+(?:,\d+-\d+)*)", (header or "").strip())
    assert found is not None, header
    return [(int(a), int(b)) for a, b in (part.split("-") for part in found.group(1).split(","))]


def _prefetch(requests: list[list[tuple[int, int]]], landmark: int) -> int | None:
    """The index of the prefetch in one layer's `requests` (each a list of ranges, in the order
    they came): the first request for any byte before `landmark`, if it asks for [0, landmark)
    in one range (beside others or not); None otherwise."""
    below = [i for i, ranges in enumerate(requests) if any(first < landmark for first, _ in ranges)]
    if below and any(first == 0 and last >= landmark - 1 for first, last in requests[below[0]]):
        return below[0]
    return None


def _one_file_spans(entries: list[dict[str, Any]], landmark: int) -> bool:
    """Whether one file's read could start at byte 0 and reach `landmark`, so that it looks like
    the prefetch: a read asks for the file's compressed bytes from the chunk read to the file's end
    (estargz's `fileReader.ReadAt`), widened to CHUNKs."""
    starts = sorted({int(e["offset"]) for e in entries if "offset" in e})
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for entry in entries:
        if entry["type"] == "chunk" or (entry["type"] == "reg" and int(entry.get("size", 0)) > 0):
            offset = int(entry["offset"])
            first.setdefault(entry["name"], offset)
            last[entry["name"]] = offset
    for name, offset in first.items():
        end = next((s for s in starts if s > last[name]), None)  # None: it runs to the TOC
        if offset < CHUNK and (end is None or end >= landmark - CHUNK):
            return True
    return False


@pytest.mark.parametrize("requests, found", [
    # The prefetch, then its own decompression pass asking again for chunks that the HTTP cache
    # had dropped (the CI failure of issue 57: 0-49999,100000-549999), then a file beyond it.
    ([[(0, 2_149_999)], [(0, 49_999), (100_000, 1_149_999)], [(25_150_000, 26_249_999)]], 0),
    # The table of contents first (past the landmark), then the prefetch.
    ([[(41_900_000, 41_949_999)], [(0, 2_149_999)]], 1),
    # A file read before the prefetch, which then skips the chunk that read cached.
    ([[(50_000, 99_999)], [(0, 49_999), (100_000, 2_149_999)]], None),
    # No prefetch: the marker's read, then f7's, then f8's, each from where the one before ended.
    ([[(0, 49_999)], [(50_000, 1_099_999)], [(1_100_000, 2_149_999)]], None),
    # No prefetch: the background fetch of f8 first, then the marker's and f7's.
    ([[(1_100_000, 2_149_999)], [(0, 1_099_999)]], None),
    # A prefetch that stops short of the landmark.
    ([[(0, 999_999)]], None),
    ([], None),
])
def test_the_prefetch_is_the_first_request_below_the_landmark_from_byte_0_through_it(
        requests: list[list[tuple[int, int]]], found: int | None) -> None:
    assert _prefetch(requests, landmark=2_100_123) == found


def _layout(*files: tuple[str, int]) -> list[dict[str, Any]]:
    """TOC entries of files (name, compressed length) written one after another from byte 0, then the landmark."""
    entries, offset = [], 0
    for name, length in files:
        entries.append({"name": name, "type": "reg", "size": length, "offset": offset})
        offset += length
    return [*entries, {"name": ".prefetch.landmark", "type": "reg", "size": 1, "offset": offset}]


@pytest.mark.parametrize("entries, spans", [
    # The marker, then one file up to the landmark: reading that file asks for [0, landmark) too.
    (_layout(("marker", 120), ("data/f7", 1_048_800)), True),
    # The marker, f7 and f8: no one file's read starts at 0 and reaches the landmark.
    (_layout(("marker", 120), ("data/f7", 1_048_800), ("data/f8", 1_048_800)), False),
    # A file in two chunks, whose read asks for both.
    ([*_layout(("data/f7", 600_000))[:1], {"name": "data/f7", "type": "chunk", "offset": 600_000},
      {"name": ".prefetch.landmark", "type": "reg", "size": 1, "offset": 1_200_000}], True),
])
def test_one_file_spans_the_prefetch_only_where_it_reaches_from_the_first_chunk_to_the_landmark(
        entries: list[dict[str, Any]], spans: bool) -> None:
    assert _one_file_spans(entries, entries[-1]["offset"]) is spans


def test_a_range_header_is_read_range_by_range() -> None:
    assert _ranges("bytes=0-49999,100000-549999") == [(0, 49_999), (100_000, 549_999)]
    assert _ranges("bytes=41950000-41964133") == [(41_950_000, 41_964_133)]
