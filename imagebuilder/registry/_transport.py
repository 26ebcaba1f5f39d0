"""One registry client's HTTP: the URL of an API call, TLS as dockerd does it, the scheme a
loopback registry answers on, the auth challenge and its cached token, the retries (through
registry.retry.send) and the one line a stopped request gives. HttpRegistry (registry/client.py)
makes its API calls over it."""

from __future__ import annotations

import base64
import json
import shutil
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from .api import (RegistryDenied, RegistryError, RegistryFailing, RegistryProtocolError, RegistryTimeout,
                  RegistryUnavailable)
from .auth import RegistryTlsError, credentials_for, daemon_ca, docker_config, is_insecure_by_default, parse_challenge
from .reference import Reference
from .retry import REGISTRY_POLICY, HttpFault, RetryPolicy, send, stderr


class _NoAuthOnRedirect(urllib.request.HTTPRedirectHandler):
    """Blob downloads redirect to storage (S3, a CDN) that rejects the registry's token. A HEAD
    stays a HEAD (urllib follows a redirected HEAD with a GET: has_blob would download the blob)."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                         headers: Any, newurl: str) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and req.get_method() == "HEAD":
            new.method = "HEAD"
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.headers.pop("Authorization", None)
            new.unredirected_hdrs.pop("Authorization", None)
        return new


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str]
    body: bytes


class RegistryTransport:
    """The HTTP under a registry client: openers and schemes per host, tokens per repository scope."""

    def __init__(self, config: Mapping[str, Any] | None = None, policy: RetryPolicy = REGISTRY_POLICY,
                 ca_file: Path | None = None, certs_root: Path = Path("/etc/docker/certs.d"),
                 say: Callable[[str], None] = stderr) -> None:
        self._config = docker_config() if config is None else config
        self._policy = policy
        self._say = say
        self._tokens: dict[tuple[str, str], str] = {}
        self._ca_file = ca_file
        self._certs_root = certs_root
        self._openers: dict[str, urllib.request.OpenerDirector] = {}
        self._schemes: dict[str, str] = {}  # api host -> the scheme it answered on

    def _json(self, r: Reference, path: str, got: Response) -> dict[str, Any]:
        """An answer that must be a JSON object; one that is not is a fault of the registry's, said at once."""
        try:
            document = json.loads(got.body)
        except ValueError as e:
            raise RegistryProtocolError(url=f"GET {self._url(r, path)}", detail=f"the answer is not JSON ({e}); "
                                        "check that the address is a Docker registry, not a proxy's page") from e
        if not isinstance(document, dict):
            raise RegistryProtocolError(url=f"GET {self._url(r, path)}", detail="the answer is not a JSON object")
        return document

    def _url(self, r: Reference, path: str) -> str:
        return f"{self._scheme(r.api_host)}://{r.api_host}/v2/{r.repository}/{path}"

    def _opener(self, host: str) -> urllib.request.OpenerDirector:
        """https trusting what dockerd trusts for this host: --registry-ca, else certs.d, else the system."""
        if host not in self._openers:
            ca = self._ca_file or daemon_ca(host, self._certs_root)
            context = ssl.create_default_context(cafile=str(ca) if ca else None)
            self._openers[host] = urllib.request.build_opener(
                _NoAuthOnRedirect(), urllib.request.HTTPSHandler(context=context))
        return self._openers[host]

    def _scheme(self, host: str) -> str:
        """https, as dockerd uses it; for a loopback registry that does not speak TLS, http
        (dockerd's fallback for insecure registries). Asked once per host."""
        if host in self._schemes:
            return self._schemes[host]
        if not is_insecure_by_default(host):
            self._schemes[host] = "https"
            return "https"
        def probe() -> None:
            self._opener(host).open(urllib.request.Request(f"https://{host}/v2/"), timeout=self._policy.timeout_s).close()

        try:
            # One try (any failure means "not over TLS", and the call after it retries), through
            # send() for its line every 15 s while a registry that accepts and never answers stalls it.
            send(probe, request=f"GET https://{host}/v2/", policy=replace(self._policy, attempts=1, stalled_attempts=1),
                 idempotent=True, say=self._say)
            scheme = "https"
        except HttpFault as e:
            if isinstance(e.error, urllib.error.HTTPError):
                scheme = "https"  # it answered over TLS (401 wants a login)
            else:
                reason = getattr(e.error, "reason", e.error)
                if isinstance(reason, ssl.SSLCertVerificationError):
                    raise RegistryTlsError(url=f"https://{host}/v2/", host=host, detail=str(reason)) from e
                scheme = "http"  # plain http (TLS handshake refused) or nothing there: say so over http
        self._schemes[host] = scheme
        return scheme

    def _request(self, method: str, r: Reference, path: str, headers: Mapping[str, str],
                 data: bytes | IO[bytes] | None = None, push: bool = False, also: str = "",
                 sink: IO[bytes] | None = None) -> Response | None:
        """One API call; None on 404. Authenticates on a 401 challenge and asks once more.
        `also`: another scope the call needs (a mount's pull of its source repository). `data`
        may be a file (sent from its start on each try); `sink` takes the answer's body."""
        url = self._url(r, path)
        scope = f"repository:{r.repository}:{'pull,push' if push else 'pull'}" + (f" {also}" if also else "")
        auth = self._tokens.get((r.api_host, scope))
        for attempt in range(2):
            request = urllib.request.Request(url, data=data, method=method, headers=dict(headers))
            if auth:
                request.add_header("Authorization", auth)
            try:
                return self._send(request, r.api_host, sink, None if isinstance(data, bytes) else data)
            except HttpFault as e:
                if e.status == 404:
                    return None
                if e.status == 401 and attempt == 0 and isinstance(e.error, urllib.error.HTTPError):
                    auth = self._authenticate(r, scope, e.error.headers.get("WWW-Authenticate", ""), url)
                    continue
                raise self._fault(request, r.api_host, e) from e
        raise AssertionError("unreachable")

    def _send(self, request: urllib.request.Request, host: str, sink: IO[bytes] | None = None,
              body: IO[bytes] | None = None) -> Response:
        def once() -> Response:
            if body is not None:
                body.seek(0)
            with self._opener(host).open(request, timeout=self._policy.timeout_s) as response:
                if sink is None:
                    return Response(response.status, dict(response.headers.items()), response.read())
                sink.seek(0)
                sink.truncate()
                shutil.copyfileobj(response, sink, 1 << 20)
                return Response(response.status, dict(response.headers.items()), b"")

        # A POST (a mount, which may open an upload session) is repeated only where the registry
        # said it did nothing; a manifest PUT sends bytes whose digest is fixed, so repeating it
        # leaves the same tag, as repeating a GET, HEAD or DELETE does.
        return send(once, request=f"{request.get_method()} {request.full_url}", policy=self._policy,
                    idempotent=request.get_method() != "POST", say=self._say)

    def _fault(self, request: urllib.request.Request, host: str, fault: HttpFault) -> RegistryError:
        """The one line a stopped request gives: the registry, the request, the status, what to do."""
        method, url = request.get_method(), request.full_url
        parts = urllib.parse.urlsplit(url)
        # The API root for an API call; a token server is named by its host.
        root = f"{parts.scheme}://{parts.netloc}" + ("/v2/" if parts.path.startswith("/v2/") else "")
        asked = f"{method} {parts.path}"
        error = fault.error
        reason = getattr(error, "reason", None)
        if isinstance(reason, ssl.SSLCertVerificationError):
            return RegistryTlsError(url=url, host=host, detail=str(reason))
        if fault.timed_out:
            return RegistryTimeout(url=root, request=asked, seconds=self._policy.timeout_s, attempts=fault.attempts)
        if not isinstance(error, urllib.error.HTTPError):
            return RegistryUnavailable(url=root, request=asked, detail=fault.reason)
        detail = _error_detail(error)
        if error.code in (401, 403):
            return RegistryDenied(url=url, method=method, status=error.code, detail=detail)
        if error.code == 429 or error.code >= 500:
            return RegistryFailing(url=root, request=asked, status=error.code, detail=detail, attempts=fault.attempts)
        return RegistryProtocolError(url=f"{method} {url}", detail=f"HTTP {error.code}: {detail}")

    def _authenticate(self, r: Reference, scope: str, challenge: str, url: str) -> str:
        scheme, params = parse_challenge(challenge)
        creds = credentials_for(self._config, r.host)
        basic = "Basic " + base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode() if creds else None
        if scheme == "basic":
            if basic is None:
                raise RegistryDenied(url=url, status=401, detail="the registry wants a login and none is stored")
            self._tokens[(r.api_host, scope)] = basic
            return basic
        if scheme != "bearer" or "realm" not in params:
            raise RegistryDenied(url=url, status=401, detail=f"unsupported challenge {challenge!r}")
        # One scope parameter per scope, as docker asks for them (a mount needs two).
        query: dict[str, str | list[str]] = {"scope": (params.get("scope") or scope).split()}
        if "service" in params:
            query["service"] = params["service"]
        token_url = f"{params['realm']}?{urllib.parse.urlencode(query, doseq=True)}"
        request = urllib.request.Request(token_url, headers={"Authorization": basic} if basic else {})
        try:
            got = self._send(request, r.api_host)
        except HttpFault as e:
            raise self._fault(request, r.api_host, e) from e
        try:
            document = json.loads(got.body)
        except ValueError as e:
            raise RegistryProtocolError(url=f"GET {token_url}", detail="the token answer is not JSON") from e
        token = (document.get("token") or document.get("access_token")) if isinstance(document, dict) else None
        if not token:
            raise RegistryProtocolError(url=token_url, detail="the token answer holds no token")
        bearer = f"Bearer {token}"
        self._tokens[(r.api_host, scope)] = bearer
        return bearer


def _error_detail(error: urllib.error.HTTPError) -> str:
    """The registry's own words for an error status (its JSON `errors`), else the reason phrase."""
    try:
        errors = json.loads(error.read()).get("errors") or []
        return "; ".join(f"{x.get('code')}: {x.get('message')}" for x in errors) or str(error.reason)
    except (ValueError, AttributeError, OSError):
        return str(error.reason)
