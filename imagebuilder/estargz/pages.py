"""Which pages of each mapped file a start touched, as the start itself reports them at its MARK.

The page cache (residency.py) says which chunks of a file were read, but it counts the kernel's
readahead too (8 MB around every fault on the benchmark's host), and it is measured after the
whole start, compile included. A lazy node reads what the import faults in. The process knows
that exactly: /proc/self/pagemap has a present bit for each page of each of its mappings (bit
63; readable by the process itself, unprivileged, since Linux 4.2, PFNs zeroed). A page is
present where the process touched it, or where the kernel mapped it around a touch (fault-around,
64 KiB), which a lazy node's 4 MiB chunks cover anyway.

So TORCH_START (profile.py), right after `import torch` and its MARK, runs REPORT: for each file
it maps, the byte ranges of its present pages, printed as one line, PREFIX + JSON ({path:
[[start, end], ...]}), which the profiler reads from the container's output. Any start may print
such a line (a Python start can run REPORT itself); a start that prints none gets no chunks
prefetched, only whole files. The pages are of mappings alone: what the start read(2) from a
large file is not in them, but its first chunk (the headers the loader reads) never is prefetched
by copy anyway (writer.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

PREFIX = "imagebuilder-pages: "

REPORT = """
def _imagebuilder_pages():
    import json, os, sys
    size, found = os.sysconf("SC_PAGE_SIZE"), {}
    try:
        with open("/proc/self/maps") as maps, open("/proc/self/pagemap", "rb", buffering=0) as pagemap:
            for line in maps:
                fields = line.rstrip("\\n").split(None, 5)
                if len(fields) < 6 or not fields[5].startswith("/") or fields[5].endswith(" (deleted)"):
                    continue
                start, end = (int(x, 16) for x in fields[0].split("-"))
                pagemap.seek(start // size * 8)
                entries = memoryview(pagemap.read((end - start) // size * 8)).cast("Q")
                base, pages = int(fields[2], 16), found.setdefault(fields[5], set())
                pages.update(base // size + n for n, entry in enumerate(entries) if entry >> 63)
    except OSError:
        return
    report = {}
    for path, pages in found.items():
        ranges = []
        for page in sorted(pages):
            if ranges and ranges[-1][1] == page * size:
                ranges[-1][1] += size
            else:
                ranges.append([page * size, (page + 1) * size])
        if ranges:
            report[path] = ranges
    sys.stdout.write(%r + json.dumps(report, separators=(",", ":")) + "\\n")
    sys.stdout.flush()
_imagebuilder_pages()
""" % PREFIX
"""Python that prints the report line of the process that runs it."""


def parse_report(output: str) -> dict[str, tuple[tuple[int, int], ...]]:
    """The last report line in a start's output: path -> its touched byte ranges; {} for none (or
    a line that is no report: a start's own output is not ours to fail on)."""
    for line in reversed(output.splitlines()):
        if line.startswith(PREFIX):
            try:
                document = json.loads(line[len(PREFIX):])
                return {str(path): tuple((int(start), int(end)) for start, end in ranges)
                        for path, ranges in document.items()}
            except (ValueError, TypeError, AttributeError):
                return {}
    return {}


def chunks_of(ranges: Iterable[tuple[int, int]], chunk: int) -> frozenset[int]:
    """The indices of the `chunk`-sized pieces of a file that the byte ranges touch."""
    return frozenset(index for start, end in ranges if end > start
                     for index in range(start // chunk, (end - 1) // chunk + 1))


def chunk_map(pages: Mapping[str, Iterable[tuple[int, int]]], paths: Iterable[str], chunk: int) -> dict[str, frozenset[int]]:
    """For each of `paths` with pages: the chunks they touch."""
    return {path: chunks_of(pages[path], chunk) for path in paths if pages.get(path)}
