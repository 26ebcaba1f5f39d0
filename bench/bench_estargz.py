"""Throughput of write_estargz on a layer tar: MB/s of layer bytes per level and worker count (the
blob is discarded; the same digest for every worker count shows the bytes do not depend on it).

    python -m bench.bench_estargz LAYER.tar [--levels 6 4] [--zstd-levels 3] [--workers 1 2]
                                            [--codec estargz zstd:chunked]

(--levels are eStargz's, gzip's 0-9; --zstd-levels zstd:chunked's, zstd's 0-22.)
"""

from __future__ import annotations

import argparse
import io
import os
import time

from imagebuilder.estargz.writer import write_estargz


class _Discard(io.RawIOBase):
    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        return len(data)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("layer")
    parser.add_argument("--levels", type=int, nargs="+", default=[6, 4])
    parser.add_argument("--zstd-levels", type=int, nargs="+", default=[3])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--codec", nargs="+", default=["estargz", "zstd:chunked"])
    args = parser.parse_args()
    size = os.path.getsize(args.layer)
    print(f"{args.layer}: {size / 1e6:.0f} MB, {len(os.sched_getaffinity(0))} cores")
    for codec in args.codec:
        for level in args.levels if codec == "estargz" else args.zstd_levels:
            for workers in args.workers:
                with open(args.layer, "rb") as source:
                    start = time.monotonic()
                    written = write_estargz(source, _Discard(), level=level, codec=codec,  # type: ignore[arg-type]
                                            workers=workers)
                    seconds = time.monotonic() - start
                print(f"{codec} level {level} workers {workers}: {seconds:6.1f} s {size / 1e6 / seconds:6.1f} MB/s "
                      f"ratio {written.size / written.uncompressed_size:.3f} {written.digest[:19]}")


if __name__ == "__main__":
    main()
