"""Locks: what an image installs and its lock with hashes (locks/), resolved with uv; the base images' pins;
the package index, its URLs, the matrix's drift from it, and `matrix add` (a release's block from the index).

The face: what the commands (cli, options, pipeline) use; the rest of imagebuilder imports
from the module that defines a name."""

from .base_pin import DigestSource, pin_base
from .command import check_or_write
from .drift import report_drift
from .index_url import parse_index_url
from .lockfile import LockSet, load_locks, locks_dir, parse_extras
from .matrix_add import add_releases
from .uv_compile import BadUv, UvCompile, default_uv

__all__ = ["BadUv", "DigestSource", "LockSet", "UvCompile", "add_releases", "check_or_write", "default_uv", "load_locks",
           "locks_dir", "parse_extras", "parse_index_url", "pin_base", "report_drift"]
