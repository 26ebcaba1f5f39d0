"""residency.py: which chunks of a file a start read, from the page cache (mincore), and the
profile's choice of what is worth prefetching whole."""

from __future__ import annotations

import os
from pathlib import Path

from imagebuilder.estargz.profile import StartProfile
from imagebuilder.estargz.residency import PAGE, chunks_touched, drop, reads, touched

MIB = 1 << 20


def test_chunks_touched_counts_every_chunk_with_a_resident_page_and_the_short_last_one() -> None:
    per_chunk = 4 * MIB // PAGE
    size = 10 * MIB  # chunks of 4, 4 and 2 MiB
    vector = bytearray((size + PAGE - 1) // PAGE)
    assert chunks_touched(bytes(vector), size) == 0
    vector[per_chunk + 3] = 1  # a page of the second chunk
    assert chunks_touched(bytes(vector), size) == 4 * MIB
    vector[-1] = 0b11  # the last page: bit 0 is what counts
    assert chunks_touched(bytes(vector), size) == 6 * MIB
    vector[0] = 0b10  # only bit 0 says resident
    assert chunks_touched(bytes(vector), size) == 6 * MIB


def test_a_file_dropped_then_read_in_one_place_has_one_chunk_touched(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "opt").mkdir(parents=True)
    big, small = root / "opt" / "big.so", root / "opt" / "small.py"
    big.write_bytes(os.urandom(12 * MIB))
    small.write_bytes(b"x" * 1000)
    (root / "proc").mkdir()  # left alone, as a container's /proc is
    os.sync()
    assert drop(root) == 2
    assert touched(big) == (12 * MIB, 0)
    with open(big, "rb") as f:
        f.seek(5 * MIB)
        f.read(1)
    found = reads(root, ["/opt/big.so", "/opt/small.py", "/opt/missing", "/opt"])
    assert found == {"/opt/big.so": (12 * MIB, 4 * MIB), "/opt/small.py": (1000, 0)}


def test_the_profile_prefetches_small_files_and_files_mostly_read_not_big_ones_barely_read() -> None:
    files = ("/a.py", "/libbig.so", "/libread.so", "/libhuge.so", "/unmeasured", "/usr/bin/cc1plus", "/b.h")
    reads = {"/a.py": (1000, 0), "/libbig.so": (500 * MIB, 8 * MIB), "/libread.so": (20 * MIB, 12 * MIB),
             "/libhuge.so": (900 * MIB, 800 * MIB), "/usr/bin/cc1plus": (30 * MIB, 30 * MIB), "/b.h": (100, 100)}
    profile = StartProfile(files, ("python3",), "", 1.0, reads)
    assert profile.prefetched() == ("/a.py", "/libread.so", "/unmeasured", "/usr/bin/cc1plus", "/b.h")
    # With the MARK after the import, what the compile opened after it is left to on-demand reads.
    marked = StartProfile(files, ("python3",), "", 1.0, reads, first=5)
    assert marked.prefetched() == ("/a.py", "/libread.so", "/unmeasured")
    assert marked.to_json()["prefetched"] == 3 and marked.to_json()["before_mark"] == 5
