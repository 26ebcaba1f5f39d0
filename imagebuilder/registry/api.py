"""What imagebuilder asks of a registry: the Registry protocol every call of publish goes
through (registry.client.HttpRegistry is one, the tests' canned registry another), and the errors a
registry's answers become."""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from typing import Any, Protocol

from ..errors import ImageBuilderError


class RegistryError(ImageBuilderError):
    """A registry did not answer as the Registry API v2 says it should."""


class RegistryUnavailable(RegistryError):
    """No answer: nothing listens there, or the connection broke on every try. `url` is the
    registry's API root; `request` (where known) the call that went unanswered."""

    template = "the registry at {url} did not answer{asked} ({detail}); check that it runs and that this machine can reach it"

    def describe(self) -> str:
        request, attempts = self.fields.get("request"), self.fields.get("attempts", 1)
        return self.template.format(**self.fields, asked=f" {request}" if request else "",
                                    tries=f" ({attempts} tries)" if attempts > 1 else "")


class RegistryTimeout(RegistryUnavailable):
    template = ("the registry at {url} did not answer{asked} within {seconds:g} s{tries}: a timeout; "
                "check that it runs, or give it longer with --registry-timeout")


class RegistryFailing(RegistryError):
    template = ("the registry at {url} answered {request} with HTTP {status} ({detail}){times}; it is failing or "
                "overloaded: try again later (a publish run again skips what landed), or tell whoever runs it")

    def describe(self) -> str:
        attempts = self.fields["attempts"]
        return self.template.format(**self.fields, times=f" on all {attempts} tries" if attempts > 1 else "")


class RegistryDenied(RegistryError):
    def describe(self) -> str:
        host = urllib.parse.urlsplit(self.fields["url"]).netloc
        method = self.fields.get("method")
        todo = (f"check that the account `docker login {host}` stored may read and push that repository"
                if self.fields["status"] == 403 else
                f"log in with `docker login {host}` (imagebuilder uses docker's stored credentials)")
        return (f"the registry refused {method + ' ' if method else ''}{self.fields['url']} "
                f"(HTTP {self.fields['status']}: {self.fields['detail']}); {todo}")


class RegistryProtocolError(RegistryError):
    template = "unexpected answer from {url}: {detail}"


class RegistryUndelivered(RegistryError):
    """The registry names something (a tag's digest, an index's child, a manifest's config) and
    then cannot deliver it: its fault, never read as "not there" or "no label"."""

    template = ("the registry names {digest} ({what}) but answered {url} with {answer}; it advertises what it cannot "
                "deliver: try again later (a publish run again skips what landed), or tell whoever runs it")


class Registry(Protocol):
    """What publish needs from a registry: HttpRegistry is one, the tests' canned registry another."""

    def digest(self, ref: str) -> str | None:
        """The manifest digest `ref` names now; None when the tag does not exist."""

    def labels(self, ref: str) -> dict[str, str] | None:
        """The image config's labels; None when the tag does not exist."""

    def put_tag(self, ref: str, digest: str) -> str:
        """Point tag `ref` at manifest `digest` of the same repository; the digest it now names."""

    def index_for(self, ref: str, children: Sequence[tuple[str, str]]) -> bytes:
        """The image index over (digest, platform) manifests of `ref`'s repository that
        put_index would write (reads only)."""

    def put_index(self, ref: str, body: bytes) -> str:
        """Make tag `ref` the image index `body` (from index_for); the digest it now names."""

    def image_config(self, ref: str, platform: str | None = None) -> tuple[dict[str, Any], tuple[str, ...]] | None:
        """(the image's config, its layers' media types); None when the tag does not exist."""

    def blobs(self, ref: str) -> dict[str, tuple[int, str]]:
        """Every blob of the image or index `ref`: digest -> (size, media type)."""

    def manifest(self, ref: str) -> tuple[dict[str, Any], str] | None:
        """(the manifest `ref` names, its media type); None when there is none."""

    def has_blob(self, ref: str, digest: str) -> bool:
        """Whether `ref`'s repository has blob `digest` now (a HEAD: nothing is downloaded)."""

    def mount(self, ref: str, digest: str, source: str) -> bool:
        """Mount blob `digest` from repository `source` into `ref`'s; whether the registry did."""

    def provenance(self, ref: str) -> dict[str, Any] | None:
        """The image's SLSA provenance predicate; None when it has none (verify reads it)."""
