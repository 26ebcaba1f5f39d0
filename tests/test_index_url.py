"""Index URLs (issue 29, item 2): refused unless uv can use them, quoted in the RUN line, and
their credentials in no layer and no history entry: a BuildKit secret, or a refusal."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from imagebuilder.build.image_plan import CredentialsNeedBuildKit
from imagebuilder.build.install_steps import NETRC_SECRET_ID
from imagebuilder.build.per_platform import render_spec as render
from imagebuilder.build.render_options import RenderOptions
from imagebuilder.lock.index_url import BadIndexUrl, IndexUrl, netrc, parse_index_url
from imagebuilder.matrix.load import load_matrix
from imagebuilder.matrix.resolve import Request, resolve

SMALL = Path(__file__).parent / "data" / "matrix-small.yaml"
M = load_matrix(SMALL)
SPEC = resolve(M, Request(torch="2.6", cuda="12.4", os="debian12"))
WITH_CREDENTIALS = "https://alice:s3cr3t@mirror.example.com/simple"


@pytest.mark.parametrize(("url", "reason"), [
    ("", "it is empty"),
    ("notaurl", "its scheme is missing"),
    ("ftp://x/simple", "its scheme is ftp://"),
    ("https:///simple", "it names no host"),
    ("https://a b/simple", "contains a space"),
    ("https://mirror.example.com:abc/simple", "its port is not a number from 1 to 65535"),
    ("https://mirror.example.com:0/simple", "its port is not a number from 1 to 65535"),
    ("https://mirror.example.com:99999/simple", "its port is not a number from 1 to 65535"),
    ("file://alice:pw@/srv/simple", "a file:// URL takes no user or password"),
    ("https://alice:a%20b@mirror.example.com/simple", "a netrc file cannot carry"),
])
def test_a_url_uv_cannot_use_is_refused_with_its_reason(url: str, reason: str) -> None:
    with pytest.raises(BadIndexUrl, match=reason) as caught:
        parse_index_url(url)
    assert caught.value.exit_code == 2


def test_a_refused_url_never_shows_its_password() -> None:
    with pytest.raises(BadIndexUrl) as caught:
        parse_index_url("https://alice:s3cr3t@mirror.example.com:abc/simple")
    assert "s3cr3t" not in str(caught.value) and "alice:***@" in str(caught.value)


@pytest.mark.parametrize(("url", "parsed"), [
    ("https://mirror.example.com/simple", IndexUrl("https://mirror.example.com/simple", "mirror.example.com")),
    (WITH_CREDENTIALS, IndexUrl("https://mirror.example.com/simple", "mirror.example.com", "alice", "s3cr3t")),
    ("https://tok%40en@mirror.example.com:8443/simple",
     IndexUrl("https://mirror.example.com:8443/simple", "mirror.example.com", "tok@en")),
    ("file:///srv/simple", IndexUrl("file:///srv/simple", "")),
])
def test_a_url_is_split_into_what_a_dockerfile_may_show_and_its_credentials(url: str, parsed: IndexUrl) -> None:
    assert parse_index_url(url) == parsed


def test_netrc_has_a_line_per_host_with_credentials() -> None:
    urls = [parse_index_url(u) for u in (WITH_CREDENTIALS, "https://other.example/simple", "https://tok@third.example/s")]
    assert netrc(urls) == (b"machine mirror.example.com login alice password s3cr3t\n"
                           b"machine third.example login tok\n")


def test_credentials_reach_a_buildkit_build_as_a_secret_and_never_the_dockerfile() -> None:
    image = render(SPEC, M, RenderOptions(index_url=WITH_CREDENTIALS, buildkit=True))
    written = image.dockerfile + "".join(data.decode(errors="replace") for data in image.files.values())
    assert "s3cr3t" not in written and "alice" not in written
    assert "--index-url https://mirror.example.com/simple" in image.dockerfile
    assert f"--mount=type=secret,id={NETRC_SECRET_ID}," in image.dockerfile
    assert "NETRC=/run/secrets/index-netrc" in image.dockerfile
    assert image.secrets[NETRC_SECRET_ID] == b"machine mirror.example.com login alice password s3cr3t\n"
    # The mirror's password is not what defines the image.
    assert image.inputs_hash == render(SPEC, M, RenderOptions(index_url="https://bob:pw@mirror.example.com/simple",
                                                              buildkit=True)).inputs_hash


def test_the_classic_builder_refuses_credentials_it_would_write_into_the_history() -> None:
    with pytest.raises(CredentialsNeedBuildKit, match="--builder buildkit") as caught:
        render(SPEC, M, RenderOptions(index_url=WITH_CREDENTIALS))
    assert caught.value.exit_code == 2


@pytest.mark.parametrize("url", ["https://mirror.example.com/a$HOME", "https://mirror.example.com/a&b", "https://x.example/a;b"])
def test_an_index_url_is_one_word_of_the_run_line(url: str) -> None:
    image = render(SPEC, M, RenderOptions(extra_index_urls=(url,)))
    line = next(line for line in image.dockerfile.splitlines() if "--extra-index-url" in line)
    assert shlex.split(line.strip().removesuffix("\\")) == ["--extra-index-url", url]


def test_an_index_error_never_shows_the_urls_password() -> None:
    from imagebuilder.lock.index import BadIndexAnswer, IndexUnavailable

    answered = BadIndexAnswer(url=f"{WITH_CREDENTIALS}/torch/", detail="HTTP 401 Unauthorized")
    unavailable = IndexUnavailable(host="alice:s3cr3t@mirror.example.com", detail="timed out")
    assert "s3cr3t" not in str(answered) and "alice:***@mirror.example.com/simple/torch/" in str(answered)
    assert "s3cr3t" not in str(unavailable) and "at mirror.example.com: timed out" in str(unavailable)
