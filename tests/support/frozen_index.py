"""A package index frozen at a set of locks: a local simple index (PEP 691 JSON, or PEP 503 HTML
where the upstream serves that) that passes every page through from the real index but hides
each file of a locked project whose version is newer than the lock's pin.

Why: `imagebuilder lock --check` against the live index fails on the day any locked package
releases (decorator 5.3.2, 2026-12-05), and a date bound (uv's --exclude-newer) does not freeze
this machine's index: its files appear days after their upload-time (decorator 5.3.2 says
2026-11-21 and appeared 2026-12-05; httpx 0.29.0 says 11-26 and appeared 12-02). Frozen by the
locks' own versions, a resolution sees what it saw when the locks were made, whatever the index
publishes later; `--check` still names a pin that differs from it (a lock edited to an older
numpy). The files themselves (wheels, their metadata) come from the upstream as they are.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urljoin

from packaging.utils import (InvalidSdistFilename, InvalidWheelFilename, canonicalize_name, parse_sdist_filename,
                             parse_wheel_filename)
from packaging.version import Version

JSON_PAGE = "application/vnd.pypi.simple.v1+json"
STABLE_PORT = 47311
_ANCHOR = re.compile(r"<a\s[^>]*>([^<]+)</a>", re.IGNORECASE)
_HREF = re.compile(r"""href=(["'])(.*?)\1""", re.IGNORECASE)


def file_version(filename: str) -> Version | None:
    """A distribution file's version by its name (wheel or sdist); None for anything else."""
    try:
        if filename.endswith(".whl"):
            return parse_wheel_filename(filename)[1]
        return parse_sdist_filename(filename)[1]
    except (InvalidWheelFilename, InvalidSdistFilename, ValueError):
        return None


def _kept(filename: str, cap: Version | None) -> bool:
    if cap is None:
        return True
    version = file_version(filename)
    return version is None or version <= cap


def frozen_json(page: Mapping[str, Any], cap: Version | None, page_url: str) -> dict[str, Any]:
    files = page.get("files")
    assert isinstance(files, list), page_url
    kept = []
    for entry in files:
        if _kept(entry["filename"], cap):
            kept.append({**entry, "url": urljoin(page_url, entry["url"])})
    out = {**page, "files": kept}
    out.pop("versions", None)  # PEP 700's list would name the hidden versions
    return out


def frozen_html(text: str, cap: Version | None, page_url: str) -> str:
    anchors = []
    for match in _ANCHOR.finditer(text):
        if not _kept(match.group(1).strip(), cap):
            continue
        anchors.append(_HREF.sub(lambda h: f'href="{urljoin(page_url, h.group(2))}"', match.group(0), count=1))
    return "<!DOCTYPE html>\n<html><body>\n" + "<br/>\n".join(anchors) + "\n</body></html>\n"


class _Handler(BaseHTTPRequestHandler):
    upstream: str
    caps: Mapping[str, Version]
    served: dict[str, tuple[str, bytes]]
    fetching: dict[str, threading.Lock]
    guard: threading.Lock
    key: str

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        parts = [p for p in self.path.split("?")[0].split("/") if p]
        if len(parts) != 3 or parts[:2] != [self.key, "simple"]:
            self.send_error(404)
            return
        project = canonicalize_name(parts[2])
        with self.guard:  # one upstream fetch a project: the locks' uv runs ask for the same pages
            lock = self.fetching.setdefault(project, threading.Lock())
        with lock:
            if project not in self.served:
                try:
                    self.served[project] = self._frozen_page(project)
                except urllib.error.HTTPError as e:
                    self.send_error(e.code)
                    return
        kind, out = self.served[project]
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(out)))
        # The page is the same for as long as the caps are (they name the URL): uv may keep it.
        self.send_header("Cache-Control", "max-age=86400")
        self.end_headers()
        self.wfile.write(out)

    def _frozen_page(self, project: str) -> tuple[str, bytes]:
        page_url = f"{self.upstream.rstrip('/')}/{project}/"
        request = urllib.request.Request(page_url, headers={"Accept": f"{JSON_PAGE}, text/html;q=0.1"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            kind = answer.headers.get_content_type()
            body = answer.read()
        cap = self.caps.get(project)
        if kind == JSON_PAGE:
            return kind, json.dumps(frozen_json(json.loads(body), cap, page_url)).encode()
        return "text/html", frozen_html(body.decode(), cap, page_url).encode()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base's name)
        pass


@contextmanager
def frozen_index(upstream: str, caps: Mapping[str, Version]) -> Iterator[str]:
    """Serve `upstream` frozen at `caps` (project -> newest version shown) on 127.0.0.1; yields
    the index URL. The URL
    names the caps' hash and the port is the same from run to run where it is free, so uv's cache
    of pages and metadata serves a second run, and never a page frozen at other caps."""
    key = hashlib.sha256(json.dumps([upstream, sorted((k, str(v)) for k, v in caps.items())]).encode()).hexdigest()[:16]
    handler = type("Frozen", (_Handler,), {"upstream": upstream, "caps": dict(caps),
                                       "served": {}, "fetching": {}, "guard": threading.Lock(), "key": key})
    try:  # one address from run to run where it is free, so that uv's cache of the metadata is reused
        server = ThreadingHTTPServer(("127.0.0.1", STABLE_PORT), handler)
    except OSError:
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/{key}/simple/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
