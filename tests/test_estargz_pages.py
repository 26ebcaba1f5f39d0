"""pages.py: the pages a start touched, as its own process reports them (/proc/self/pagemap), and
the chunks the profile copies ahead of the landmark for zstd:chunked (StartProfile.copied)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from imagebuilder.estargz.pages import PREFIX, REPORT, chunk_map, chunks_of, parse_report
from imagebuilder.estargz.profile import TORCH_START, StartProfile
from imagebuilder.publish.layer_reuse import _profile_of

MIB = 1 << 20


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_report_names_the_pages_a_process_touched_of_a_mapped_file_and_no_others(tmp_path: Path) -> None:
    data = tmp_path / "lib.so"
    data.write_bytes(bytes(range(256)) * (40 * MIB // 256))
    touch = ("import mmap\n"
             f"f = open({str(data)!r}, 'rb')\n"
             "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
             f"m[{13 * MIB + 5}], m[{31 * MIB}]\n")
    out = _run("print('the start says something')\n" + touch + REPORT)
    ranges = parse_report(out)[str(data)]
    assert ranges and all(start % 4096 == 0 and end % 4096 == 0 and end > start for start, end in ranges)
    touched = sum(end - start for start, end in ranges)
    # The two pages, and what the kernel mapped around them: fault-around, or a whole large folio
    # of the page cache (2 MiB on this host's kernel), never the 40 MiB.
    assert 8192 <= touched <= 2 * 2 * MIB, ranges
    assert any(start <= 13 * MIB + 5 < end for start, end in ranges) and any(start <= 31 * MIB < end
                                                                             for start, end in ranges)
    assert chunks_of(ranges, 4 * MIB) == {3, 7}


def test_a_start_without_a_report_or_with_a_broken_one_reports_nothing() -> None:
    assert parse_report("hello\nworld\n") == {}
    assert parse_report(PREFIX + "{not json\n") == {}
    assert parse_report(PREFIX + '["a list"]\n') == {}
    # The last report counts (a start that reports twice).
    two = PREFIX + json.dumps({"/a": [[0, 4096]]}) + "\n" + PREFIX + json.dumps({"/b": [[4096, 8192]]}) + "\n"
    assert parse_report(two) == {"/b": ((4096, 8192),)}


def test_chunks_of_ranges_count_every_chunk_a_range_reaches() -> None:
    assert chunks_of([(0, 4096)], MIB) == {0}
    assert chunks_of([(MIB - 4096, MIB + 4096)], MIB) == {0, 1}
    assert chunks_of([(MIB, 2 * MIB)], MIB) == {1}  # the end is exclusive
    assert chunks_of([(5, 5)], MIB) == frozenset()
    assert chunk_map({"/a": [(0, 1)], "/b": []}, ["/a", "/b", "/c"], MIB) == {"/a": {0}}


def test_torch_start_reports_its_pages_after_the_mark_and_before_the_compile() -> None:
    code = TORCH_START[2]
    assert code.index("open(") < code.index(REPORT) < code.index("torch.compile")


def test_the_profile_copies_chunks_of_files_the_import_touched_that_it_does_not_fetch_whole() -> None:
    files = ("/small.py", "/libcuda_big.so", "/libread.so", "/after_mark.so")
    reads = {"/small.py": (1000, 1000), "/libcuda_big.so": (500 * MIB, 16 * MIB), "/libread.so": (20 * MIB, 12 * MIB),
             "/after_mark.so": (100 * MIB, 8 * MIB)}
    pages = {"/small.py": ((0, 4096),), "/libcuda_big.so": ((0, 8192), (9 * MIB, 9 * MIB + 65536)),
             "/libread.so": ((5 * MIB, 6 * MIB),), "/after_mark.so": ((50 * MIB, 51 * MIB),)}
    profile = StartProfile(files, ("python3",), "", 1.0, reads, first=3, pages=pages)
    assert profile.prefetched() == ("/small.py", "/libread.so")  # whole: nothing of theirs to copy
    assert profile.copied(4 * MIB) == {"/libcuda_big.so": {0, 2}}  # (the writer never copies a first chunk)
    assert StartProfile(files, ("python3",), "", 1.0, reads, first=3).copied() == {}  # no report: whole files alone
    # Kept between publishes (layer_reuse), the pages come back as they were.
    again = _profile_of(json.loads(json.dumps(profile.to_json())))
    assert again == profile and again.copied(4 * MIB) == profile.copied(4 * MIB)
