"""Image references and repository names, by the grammar of the OCI distribution spec.

    reference  := name [ ":" tag ] [ "@" digest ]
    name       := [ domain "/" ] component ( "/" component )*
    domain     := host [ ":" port ]           (has a "." or ":", or is "localhost")
    component  := [a-z0-9]+ ( ( "." | "_" | "__" | "-"+ ) [a-z0-9]+ )*
    tag        := [A-Za-z0-9_] [A-Za-z0-9_.-]{0,127}
    digest     := algorithm ":" encoded        (sha256: 64 lowercase hex digits)

(distribution/reference's grammar, as `docker` applies it.) A reference that does not parse
is a bad request: it is refused with the reason before any daemon or registry is asked.

One Reference for every caller: the parts as written (name, tag, digest), and the registry's
view with docker's defaults (host docker.io, repository library/NAME, reference `latest`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import BadRequest

_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_DOMAIN_COMPONENT = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_DOMAIN = re.compile(rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[A-Fa-f0-9:]+\])(?::[0-9]+)?")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_ALGORITHM = re.compile(r"[a-z0-9]+(?:[+._-][a-z0-9]+)*")
_ENCODED = re.compile(r"[A-Za-z0-9=_-]+")
_SHA256 = re.compile(r"[a-f0-9]{64}")
NAME_MAX = 255
DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
FORMS = "NAME[:TAG] or NAME@sha256:DIGEST, e.g. pytorch:2.6.0-cuda12.4-cudnn9-runtime"


class InvalidReference(BadRequest):
    """Fields: what (the option or argument), text, why."""

    def describe(self) -> str:
        f = self.fields
        return f"{f['what']} {f['text']!r} is not an image reference: {f['why']}; give {FORMS}"


class InvalidRepository(BadRequest):
    def describe(self) -> str:
        f = self.fields
        return (f"{f['what']} {f['text']!r} is not a repository name: {f['why']}; give lowercase "
                "NAME or HOST[:PORT]/NAME without a tag, e.g. pytorch or registry.example.com/ml/pytorch")


@dataclass(frozen=True)
class Reference:
    name: str
    """[domain/]path, as written."""
    tag: str | None = None
    digest: str | None = None

    @property
    def host(self) -> str:
        """The registry's HOST[:PORT]: the name's domain, else Docker Hub."""
        first, slash, _ = self.name.partition("/")
        return first if slash and names_domain(first) else DOCKER_HUB

    @property
    def repository(self) -> str:
        """The repository path in that registry (Docker Hub's official images under library/)."""
        first, slash, rest = self.name.partition("/")
        if slash and names_domain(first):
            return rest
        return self.name if "/" in self.name else f"library/{self.name}"

    @property
    def reference(self) -> str:
        """What the registry API's manifests/ URL takes: the digest, else the tag, else latest."""
        return self.digest or self.tag or "latest"

    @property
    def api_host(self) -> str:
        return DOCKER_HUB_API if self.host == DOCKER_HUB else self.host


def names_domain(part: str) -> bool:
    """Whether the first component of a name is a registry's domain, as docker decides it."""
    return "." in part or ":" in part or part == "localhost"


def _name_problem(name: str) -> str | None:
    """Why `name` is not a repository name, or None."""
    if not name:
        return "the name is empty"
    if len(name) > NAME_MAX:
        return f"the name is longer than {NAME_MAX} characters"
    if any(c.isspace() for c in name):
        return "it contains a space"
    first, slash, rest = name.partition("/")
    path = name
    if slash and names_domain(first):
        problem = domain_problem(first)
        if problem is not None:
            return problem
        path = rest
    for component in path.split("/"):
        if not component:
            return "it has an empty path component (a leading, trailing or double '/')"
        if not _COMPONENT.fullmatch(component):
            if _COMPONENT.fullmatch(component.lower()):
                return f"the repository name must be lowercase ({component!r})"
            return (f"{component!r} is not a path component (lowercase letters and digits, "
                    "joined by '.', '_', '__' or '-')")
    return None


def domain_problem(domain: str) -> str | None:
    """Why `domain` is not a registry's HOST[:PORT], or None: a port is a number from 1 to
    65535 (0, 99999 or `abc` are a wrong request, not a registry that did not answer)."""
    if not _DOMAIN.fullmatch(domain):
        return f"{domain!r} is not a registry host[:port]"
    port = domain.rpartition("]")[2].partition(":")[2]
    if port and not 1 <= int(port) <= 65535:
        return f"{domain!r}: the port is not a number from 1 to 65535"
    return None


class BadRegistry(BadRequest):
    template = "{option} {text!r}: {why}; give HOST[:PORT]/NAMESPACE, e.g. ghcr.io/acme or 127.0.0.1:5000/ml"


_NAMESPACE = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$")


@dataclass(frozen=True)
class RegistryTarget:
    """A registry and a namespace in it, HOST[:PORT]/NAMESPACE: where publish's images and build
    caches go (--registry), and where build imports caches from (--cache-from-registry)."""

    host: str
    namespace: str = ""
    """May be empty: the images then sit at the registry's top level."""

    @classmethod
    def parse(cls, text: str, option: str = "--registry") -> RegistryTarget:
        """Refused with the reason (`option` names the flag) before any registry is asked."""
        host, _, namespace = text.strip().rstrip("/").partition("/")
        if "://" in text:
            raise BadRegistry(option=option, text=text,
                              why="no scheme: imagebuilder picks http for loopback, https elsewhere")
        if not host or not names_domain(host):
            raise BadRegistry(option=option, text=text,
                              why=f"{host!r} is not a registry host (it needs a dot, a port or to be localhost)")
        problem = domain_problem(host)
        if problem is not None:
            raise BadRegistry(option=option, text=text, why=problem)
        if namespace and not _NAMESPACE.match(namespace):
            raise BadRegistry(option=option, text=text,
                              why=f"namespace {namespace!r} must be lowercase letters, digits, . _ - and /")
        return cls(host, namespace)

    @property
    def base(self) -> str:
        """HOST[:PORT]/NAMESPACE, or HOST[:PORT] without a namespace: what a repository name follows."""
        return f"{self.host}/{self.namespace}" if self.namespace else self.host

    def repository(self, name: str) -> str:
        return f"{self.base}/{name}"


def parse_reference(text: str, what: str = "image") -> Reference:
    """`text` as an image reference, or InvalidReference saying why it is not one."""

    def invalid(why: str) -> InvalidReference:
        return InvalidReference(what=what, text=text, why=why)

    if not text:
        raise invalid("it is empty")
    remainder, at, digest = text.partition("@")
    if at:
        algorithm, colon, encoded = digest.partition(":")
        if not colon or not _ALGORITHM.fullmatch(algorithm) or not _ENCODED.fullmatch(encoded):
            raise invalid(f"{digest!r} is not a digest (ALGORITHM:HEX)")
        if algorithm == "sha256" and not _SHA256.fullmatch(encoded):
            raise invalid("a sha256 digest has 64 lowercase hex digits")
    # A ':' after the last '/' separates the tag; one before it is a registry's port.
    last_slash = remainder.rfind("/")
    last_colon = remainder.rfind(":")
    name, tag = ((remainder[:last_colon], remainder[last_colon + 1:]) if last_colon > last_slash
                 else (remainder, None))
    if tag is not None and not _TAG.fullmatch(tag):
        raise invalid("the tag after ':' is empty" if not tag else
                      f"{tag!r} is not a tag (letters, digits, '_', '.', '-'; at most 128; not starting with '.' or '-')")
    problem = _name_problem(name)
    if problem is not None:
        raise invalid(problem)
    return Reference(name, tag, digest if at else None)


def check_repository(text: str, what: str = "--repository") -> str:
    """`text` if it is a repository name (no tag, no digest), else InvalidRepository."""
    slash = text.rfind("/")
    if "@" in text or text.rfind(":") > slash:
        raise InvalidRepository(what=what, text=text, why="it has a tag or digest; tags come from the matrix")
    problem = _name_problem(text)
    if problem is not None:
        raise InvalidRepository(what=what, text=text, why=problem)
    return text


def repository_of(ref: str) -> str:
    """HOST/REPOSITORY of an image reference, docker's defaults filled in."""
    r = parse_reference(ref)
    return f"{r.host}/{r.repository}"


def pinned(ref: str, digest: str) -> str:
    """REPOSITORY@DIGEST: what cosign signs and checks (never a tag)."""
    return f"{repository_of(ref)}@{digest}"
