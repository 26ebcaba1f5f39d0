"""Remote registry reads (and two writes: pointing a tag at a manifest, and writing an image
index over one image per platform) over the Registry HTTP API v2: HttpRegistry.

`publish` asks the registry, before building anything, what each tag holds: the manifest
digest (HEAD) and the image's labels (manifest, then config blob), so an image published
from the same rendered inputs is skipped without pulling 6 GB. Stdlib urllib only, kept small:

- Accept headers for Docker v2 and OCI manifests and for manifest lists / OCI indexes (an
  index is read through its linux/amd64 entry, else its first; manifests.py);
- TLS as dockerd does it: https everywhere, trusting /etc/docker/certs.d/HOST/ca.crt (or
  --registry-ca); a loopback registry that does not speak TLS is asked over http (dockerd's
  fallback for insecure registries, which 127.0.0.0/8 is by default);
- anonymous access, Basic, and Bearer tokens, with the credentials docker itself would use
  (registry/auth.py);
- every call through registry.retry.send: passing faults (429, 5xx, a reset, a timeout) tried
  again as its RetryPolicy says, each retry a line on stderr; the rest said at once.

The HTTP under the calls (TLS, the scheme, auth, retries, the fault's one line) is
_transport.py's RegistryTransport, which HttpRegistry extends.
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from typing import IO, Any

from ..platforms import DEFAULT_PLATFORM
from ._transport import RegistryTransport
from .api import RegistryError, RegistryProtocolError, RegistryUndelivered
from .manifests import ACCEPT, DOCKER_MANIFEST, INDEXES, OCI_INDEX, index_document, pick_manifest, platform_entries
from .reference import Reference, parse_reference

class HttpRegistry(RegistryTransport):
    """Registry over HTTP API v2. One instance per run: it caches tokens per repository scope."""

    def digest(self, ref: str) -> str | None:
        r = parse_reference(ref)
        response = self._request("HEAD", r, f"manifests/{r.reference}", {"Accept": ACCEPT})
        if response is None:
            return None
        digest = response.headers.get("Docker-Content-Digest")
        if not digest:  # some registries answer HEAD without it; GET always names the bytes
            got = self._request("GET", r, f"manifests/{r.reference}", {"Accept": ACCEPT})
            if got is None:
                raise RegistryUndelivered(digest=ref, what="a manifest its HEAD answered for",
                                          url=f"GET {self._url(r, f'manifests/{r.reference}')}", answer="404 (not found)")
            digest = "sha256:" + hashlib.sha256(got.body).hexdigest()
        return digest

    def labels(self, ref: str) -> dict[str, str] | None:
        found = self.image_config(ref)
        if found is None:
            return None
        labels = (found[0].get("config") or {}).get("Labels") or {}
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            raise RegistryProtocolError(url=ref, detail="the image config's Labels are not a mapping of strings")
        return dict(labels)

    def image_config(self, ref: str, platform: str | None = None) -> tuple[dict[str, Any], tuple[str, ...]] | None:
        """The image config document of `ref`'s image for `platform` (OS/ARCH; None:
        linux/amd64, else the index's first) and its layers' media types; None when the tag
        does not exist."""
        r = parse_reference(ref)
        manifest = self._manifest(r, r.reference)
        if manifest is None:
            return None
        document, media_type = manifest
        if media_type in INDEXES or document.get("mediaType") in INDEXES:
            wanted = pick_manifest(document, platform or DEFAULT_PLATFORM)
            child = self._manifest(r, wanted)
            if child is None:
                raise RegistryUndelivered(digest=wanted, what=f"the {platform or 'linux/amd64'} image of {ref}'s index",
                                          url=f"GET {self._url(r, f'manifests/{wanted}')}", answer="404 (not found)")
            document = child[0]
        config = (document.get("config") or {}).get("digest")
        if not isinstance(config, str) or not config:
            raise RegistryProtocolError(url=self._url(r, f"manifests/{r.reference}"), detail="the manifest names no config blob")
        url = f"GET {self._url(r, f'blobs/{config}')}"
        blob = self._request("GET", r, f"blobs/{config}", {})
        if blob is None:
            raise RegistryUndelivered(digest=config, what=f"the config of {ref}", url=url, answer="404 (not found)")
        document_of_config = self._json(r, f"blobs/{config}", blob)
        got = "sha256:" + hashlib.sha256(blob.body).hexdigest()
        if config.startswith("sha256:") and got != config:
            raise RegistryUndelivered(digest=config, what=f"the config of {ref}", url=url,
                                      answer=f"{len(blob.body)} bytes of another digest ({got[:19]}...)")
        layers = tuple(str(layer.get("mediaType") or "") for layer in document.get("layers") or [])
        return document_of_config, layers

    def blobs(self, ref: str) -> dict[str, tuple[int, str]]:
        """Every blob the image under `ref` consists of (digest -> (size, media type)):
        config and layers of each manifest of an index, attestations included; {} when absent."""
        r = parse_reference(ref)
        found: dict[str, tuple[int, str]] = {}
        pending = [r.reference]
        while pending:
            manifest = self._manifest(r, pending.pop())
            if manifest is None:
                continue
            document, media_type = manifest
            if media_type in INDEXES or document.get("mediaType") in INDEXES:
                pending += [str(entry["digest"]) for entry in document.get("manifests") or []]
                continue
            for blob in [document.get("config") or {}, *(document.get("layers") or [])]:
                if blob.get("digest"):
                    found[str(blob["digest"])] = (int(blob.get("size") or 0), str(blob.get("mediaType") or ""))
        return found

    def provenance(self, ref: str) -> dict[str, Any] | None:
        """The SLSA provenance predicate BuildKit attached to the image under `ref` (the
        in-toto statement in its index's attestation manifest); None when it has none."""
        r = parse_reference(ref)
        manifest = self._manifest(r, r.reference)
        if manifest is None:
            return None
        document, media_type = manifest
        if not (media_type in INDEXES or document.get("mediaType") in INDEXES):
            return None
        for entry in document.get("manifests") or []:
            if (entry.get("annotations") or {}).get("vnd.docker.reference.type") != "attestation-manifest":
                continue
            attestation = self._manifest(r, str(entry["digest"]))
            for layer in (attestation[0].get("layers") or []) if attestation else []:
                predicate = (layer.get("annotations") or {}).get("in-toto.io/predicate-type", "")
                if "slsa.dev/provenance" not in predicate:
                    continue
                blob = self._request("GET", r, f"blobs/{layer['digest']}", {})
                if blob is not None:
                    statement = self._json(r, f"blobs/{layer['digest']}", blob)
                    return {"predicateType": statement.get("predicateType"), **(statement.get("predicate") or {})}
        return None

    def put_tag(self, ref: str, digest: str) -> str:
        r = parse_reference(ref)
        got = self._request("GET", r, f"manifests/{digest}", {"Accept": ACCEPT})
        if got is None:
            raise RegistryProtocolError(url=self._url(r, f"manifests/{digest}"), detail="the manifest to tag is gone")
        media_type = got.headers.get("Content-Type", DOCKER_MANIFEST).split(";")[0]
        self._request("PUT", r, f"manifests/{r.reference}", {"Content-Type": media_type}, got.body, push=True)
        now = self.digest(ref)
        if now is None:
            raise RegistryProtocolError(url=self._url(r, f"manifests/{r.reference}"), detail="the tag is missing after PUT")
        return now

    def index_for(self, ref: str, children: Sequence[tuple[str, str]]) -> bytes:
        r = parse_reference(ref)
        entries: list[dict[str, Any]] = []
        for digest, platform in children:
            url = self._url(r, f"manifests/{digest}")
            got = self._request("GET", r, f"manifests/{digest}", {"Accept": ACCEPT})
            if got is None:
                raise RegistryProtocolError(url=url, detail=f"the {platform} image of the index is not in the repository")
            media_type = got.headers.get("Content-Type", DOCKER_MANIFEST).split(";")[0]
            try:
                document = json.loads(got.body) if media_type in INDEXES else {}
                entries += platform_entries(platform, media_type, len(got.body), digest, document)
            except ValueError as e:
                raise RegistryProtocolError(url=url, detail=str(e)) from e
        return index_document(entries)

    def put_index(self, ref: str, body: bytes) -> str:
        r = parse_reference(ref)
        self._request("PUT", r, f"manifests/{r.reference}", {"Content-Type": OCI_INDEX}, body, push=True)
        now = self.digest(ref)
        expected = "sha256:" + hashlib.sha256(body).hexdigest()
        if now != expected:
            raise RegistryProtocolError(url=self._url(r, f"manifests/{r.reference}"),
                                        detail=f"the index PUT as {expected} reads back as {now}")
        return now

    def has_blob(self, ref: str, digest: str) -> bool:
        r = parse_reference(ref)
        return self._request("HEAD", r, f"blobs/{digest}", {}) is not None

    def mount(self, ref: str, digest: str, source: str) -> bool:
        """Link blob `digest` of repository `source` (a ref on the same registry) into `ref`'s
        repository without uploading it: the API's cross-repository mount. False where the
        registry did not mount it; the upload session it opened instead is cancelled, and the
        push uploads the blob as it would have."""
        r, src = parse_reference(ref), parse_reference(source)
        if src.api_host != r.api_host:
            return False
        query = urllib.parse.urlencode({"mount": digest, "from": src.repository})
        got = self._request("POST", r, f"blobs/uploads/?{query}", {"Content-Length": "0"}, b"", push=True,
                            also=f"repository:{src.repository}:pull")
        if got is not None and got.status == 201:
            return True
        location = (got.headers.get("Location") or "") if got is not None else ""
        session = location.split(f"/v2/{r.repository}/", 1)
        if len(session) == 2:
            try:
                self._request("DELETE", r, session[1], {}, push=True)
            except RegistryError:
                pass  # an unused session: the registry purges it
        return False

    def tags(self, ref: str) -> list[str]:
        """Every tag of `ref`'s repository ([] when it has none), following the API's pages."""
        r = parse_reference(ref)
        found: list[str] = []
        path: str | None = "tags/list?n=1000"
        while path is not None:
            got = self._request("GET", r, path, {})
            if got is None:
                return found
            found += self._json(r, path, got).get("tags") or []
            link = re.match(r'<[^>]*/tags/list(\?[^>]*)>;\s*rel="next"', got.headers.get("Link", ""))
            path = f"tags/list{link.group(1)}" if link else None
        return found

    def manifest(self, ref: str) -> tuple[dict[str, Any], str] | None:
        """The manifest (or index) `ref` names and its media type; None: no such tag or digest."""
        r = parse_reference(ref)
        return self._manifest(r, r.reference)

    # -- artifacts (squashfs/artifact.py): a blob up and down as a stream, a manifest, referrers

    def download_blob(self, ref: str, digest: str, out: IO[bytes]) -> None:
        """Blob `digest` of `ref`'s repository into `out`, streamed (a retry starts `out` again)."""
        r = parse_reference(ref)
        if self._request("GET", r, f"blobs/{digest}", {}, sink=out) is None:
            raise RegistryProtocolError(url=self._url(r, f"blobs/{digest}"), detail="the blob is not there")

    def blob_range(self, ref: str, digest: str, start: int, length: int) -> bytes:
        """Bytes start..start+length-1 of blob `digest` of `ref`'s repository (a range GET,
        retried as any GET is)."""
        r = parse_reference(ref)
        got = self._request("GET", r, f"blobs/{digest}", {"Range": f"bytes={start}-{start + length - 1}"})
        if got is None:
            raise RegistryProtocolError(url=self._url(r, f"blobs/{digest}"), detail="the blob is not there")
        if got.status != 206 or len(got.body) != length:
            raise RegistryProtocolError(url=self._url(r, f"blobs/{digest}"),
                                        detail=f"a range of {length} bytes was answered with HTTP {got.status} and "
                                               f"{len(got.body)} bytes; the registry does not serve ranges")
        return got.body

    def upload_blob(self, ref: str, digest: str, source: IO[bytes], size: int) -> None:
        """Blob `digest` (`size` bytes read from `source`) into `ref`'s repository, unless it is
        there: an upload session, then one PUT of the whole blob."""
        r = parse_reference(ref)
        if self._request("HEAD", r, f"blobs/{digest}", {}) is not None:
            return
        got = self._request("POST", r, "blobs/uploads/", {"Content-Length": "0"}, b"", push=True)
        location = (got.headers.get("Location") or "") if got is not None else ""
        session = location.split(f"/v2/{r.repository}/", 1)
        if len(session) != 2:
            raise RegistryProtocolError(url=self._url(r, "blobs/uploads/"), detail=f"no upload location ({location!r})")
        path = session[1] + ("&" if "?" in session[1] else "?") + urllib.parse.urlencode({"digest": digest})
        self._request("PUT", r, path, {"Content-Type": "application/octet-stream", "Content-Length": str(size)},
                      source, push=True)

    def put_manifest(self, ref: str, body: bytes, media_type: str) -> Mapping[str, str]:
        """PUT `body` as the manifest `ref` names (a tag or its digest); the answer's headers
        (OCI-Subject says the registry indexed its subject for the referrers API)."""
        r = parse_reference(ref)
        got = self._request("PUT", r, f"manifests/{r.reference}", {"Content-Type": media_type}, body, push=True)
        return got.headers if got is not None else {}

    def descriptor(self, ref: str) -> dict[str, Any] | None:
        """The OCI descriptor (mediaType, digest, size) of the manifest `ref` names, from a HEAD."""
        r = parse_reference(ref)
        got = self._request("HEAD", r, f"manifests/{r.reference}", {"Accept": ACCEPT})
        if got is None:
            return None
        digest = got.headers.get("Docker-Content-Digest") or self.digest(ref)
        return {"mediaType": got.headers.get("Content-Type", "").split(";")[0], "digest": digest,
                "size": int(got.headers.get("Content-Length") or 0)}

    def referrers(self, ref: str, digest: str) -> dict[str, Any] | None:
        """The referrers API's index of the manifests whose subject is `digest`; None where the
        registry has no such API (it answers 404: use the tag-schema fallback)."""
        r = parse_reference(ref)
        got = self._request("GET", r, f"referrers/{digest}", {"Accept": OCI_INDEX})
        if got is None or not got.headers.get("Content-Type", "").startswith(OCI_INDEX):
            return None
        return self._json(r, f"referrers/{digest}", got)

    # -- plumbing

    def _manifest(self, r: Reference, reference: str) -> tuple[dict[str, Any], str] | None:
        got = self._request("GET", r, f"manifests/{reference}", {"Accept": ACCEPT})
        if got is None:
            return None
        document = self._json(r, f"manifests/{reference}", got)
        digest = "sha256:" + hashlib.sha256(got.body).hexdigest()
        if reference.startswith("sha256:") and digest != reference:  # asked by digest: the bytes must be those
            raise RegistryUndelivered(digest=reference, what=f"a manifest of {r.repository}",
                                      url=f"GET {self._url(r, f'manifests/{reference}')}",
                                      answer=f"{len(got.body)} bytes of another digest ({digest[:19]}...)")
        return document, got.headers.get("Content-Type", "").split(";")[0]
