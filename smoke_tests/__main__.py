"""python -m smoke_tests [--manifest PATH] [--json] [--checks a,b] [--timeout S] [--require-gpu | --allow-no-gpu]

In an image built for CUDA the GPU checks fail without a GPU unless --allow-no-gpu
(imagebuilder verify passes it in its CPU mode); in a CPU build they skip.

Exit status: 0 when no check failed, 1 when one did, 2 for bad arguments or an
unreadable manifest.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from .context import DEFAULT_TIMEOUT
from .expected import DEFAULT_MANIFEST, MANIFEST_ENV, ManifestError, load_expected


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m smoke_tests", description="Prove that this PyTorch image works."
    )
    parser.add_argument(
        "--manifest",
        help=f"image manifest JSON (default: ${MANIFEST_ENV} or {DEFAULT_MANIFEST}; missing means no expectations)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of a table")
    parser.add_argument("--checks", help="comma-separated checks to run (default: all)")
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT, help=f"seconds per check (default {DEFAULT_TIMEOUT:g})"
    )
    gpu = parser.add_mutually_exclusive_group()
    gpu.add_argument("--require-gpu", action="store_true",
                     help="fail, rather than skip, GPU checks without a GPU (the default for a CUDA build)")
    gpu.add_argument("--allow-no-gpu", action="store_true",
                     help="skip, rather than fail, GPU checks without a GPU (CPU-only CI of a CUDA image)")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    try:
        expected = load_expected(args.manifest)
    except ManifestError as e:
        print(f"smoke_tests: {e}", file=sys.stderr)
        return 2
    names = [n.strip() for n in args.checks.split(",") if n.strip()] if args.checks else None

    from . import report
    from .runner import UnknownCheck, gpu_required, run_checks

    require_gpu = args.require_gpu or (not args.allow_no_gpu and gpu_required(expected))
    try:
        results = run_checks(names, expected, args.timeout, require_gpu,
                             on_result=(lambda result: print(report.progress_line(result), file=sys.stderr, flush=True))
                             if args.json else None)
    except UnknownCheck as e:
        print(f"smoke_tests: {e}", file=sys.stderr)
        return 2
    print(report.to_json(results) if args.json else report.format_table(results), flush=True)
    return 0 if report.ok(results) else 1


if __name__ == "__main__":
    sys.exit(main())
