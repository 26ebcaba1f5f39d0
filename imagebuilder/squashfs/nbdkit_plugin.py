"""nbdkit's Python plugin (Debian's nbdkit-plugin-python) over chunk_cache.ChunkCache: the squashfs
blob as a read-only NBD disk, every chunk checked before it is served. lazy.py starts it as

    nbdkit -s --exit-with-parent python nbdkit_plugin.py ref=REPOSITORY@BLOB table=FILE cache=FILE timeout=S

under nbdfuse, with PYTHONPATH the folder imagebuilder is in (nbdkit embeds the system's
Python 3, the one imagebuilder's Debian install runs on). A chunk that fails its check is an
EIO for the reader and one line `error: ...` on nbdkit's stderr (lazy.py's log); never its bytes.
Range GETs follow the registry client's retry policy with the command's --registry-timeout
(timeout=S), and a refused connection is tried again as a reset is (a registry restarting).
"""

from __future__ import annotations

import errno
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import nbdkit  # type: ignore[import-not-found]  # nbdkit's embedded module, there only inside nbdkit

from imagebuilder.errors import ImageBuilderError
from imagebuilder.registry.client import HttpRegistry
from imagebuilder.registry.retry import REGISTRY_POLICY
from imagebuilder.squashfs.chunk_cache import ChunkCache
from imagebuilder.squashfs.chunks import parse_table

API_VERSION = 2
_settings: dict[str, str] = {}
_cache: list[ChunkCache] = []


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def config(key: str, value: str) -> None:
    _settings[key] = value


def config_complete() -> None:
    for key in ("ref", "table", "cache"):
        if key not in _settings:
            raise RuntimeError(f"{key}= is missing")


def thread_model() -> int:
    return int(nbdkit.THREAD_MODEL_PARALLEL)


def get_ready() -> None:
    repository, _, blob = _settings["ref"].partition("@")
    table_path = Path(_settings["table"])
    table = parse_table(table_path.read_bytes(), table_path.name, int(_settings["size"]))
    policy = replace(REGISTRY_POLICY, timeout_s=float(_settings.get("timeout", REGISTRY_POLICY.timeout_s)),
                     refused_passes=True)
    _cache.append(ChunkCache(HttpRegistry(say=_say, policy=policy), _settings["ref"], blob, table, Path(_settings["cache"]),
                             say=_say))


def open(readonly: bool) -> int:  # noqa: A001 - nbdkit's name
    return 1


def get_size(handle: Any) -> int:
    return _cache[0].size


def can_write(handle: Any) -> bool:
    return False


def can_multi_conn(handle: Any) -> bool:
    return True


def pread(handle: Any, buf: Any, offset: int, flags: int) -> None:
    try:
        data = _cache[0].pread(offset, len(buf))
    except ImageBuilderError as e:
        _say(f"error: {e}")
        nbdkit.set_error(errno.EIO)
        raise OSError(errno.EIO, "input/output error") from None
    buf[:len(data)] = data


def unload() -> None:
    for cache in _cache:
        cache.close()
