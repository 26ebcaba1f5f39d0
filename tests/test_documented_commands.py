"""Every imagebuilder command the documentation shows runs without a crash.

Documentation: README.md, docs/*.md, and the Examples of each command's --help. A documented
command is a line in a code block (a fenced ```sh / ```bash / ```console / unlabelled block, or
an indented one) that invokes `imagebuilder` or `.venv/bin/imagebuilder` (also after `&&`);
`\\` continuations are joined, the shell expands it (so ${SSL_CERT_FILE:+...} works), and
redirections and pipes after it are dropped. A synopsis (a line with `...` or `[--`) and
fenced ```text blocks are not commands.

What each command costs decides how it runs:
- every command is parsed by click (options, values, files that must exist): a documented
  flag that does not exist fails here, in the fast run;
- matrix (listing, offline check), render and --help/--version run in-process, and must exit 0
  (render -o writes into a temporary folder);
- build and publish run with --dry-run (the plan, with the daemon and registry asked; nothing
  is built or pushed), verify as written: marked docker. A dry run must exit 0: publish's
  example registry is replaced by a local one (docs_registry), so the plan really reads a
  registry; a build dry run whose base image names a mirror this machine cannot reach, and a
  verify of an image or registry that is not here (or of a GPU this host lacks), must fail
  with exit 1 for that reason (EXPECTED_FAILURES), never with a traceback or a usage error.
  The README's main job is built for real by conftest's runtime_image, which CI runs anyway;
- lock, matrix check --online, matrix add and project read the package index, scan the Debian
  archive: parsed only here (their own network tests run them), so CI never resolves or downloads
  for a documentation line.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from support.unavailable import _unavailable

from imagebuilder.cli import cli

ROOT = Path(__file__).resolve().parent.parent
_INVOCATION = re.compile(r"(?:^|&&|;|\$)\s*(?:[\w./-]*/)?imagebuilder\s+(?P<args>.*)$")
_END = re.compile(r"\s(?:&&|\|\||\||;|\d?>>?)\s")  # what follows the command: another one, a pipe, a redirection
_COMMAND_BLOCKS = {"", "sh", "bash", "shell", "console"}


@dataclass(frozen=True)
class Documented:
    where: str  # file:line, or `imagebuilder CMD --help`
    args: str  # the text after `imagebuilder`, as written

    def argv(self) -> list[str]:
        """The arguments as the shell would pass them (variables expanded, quotes removed)."""
        done = subprocess.run(["bash", "-c", f"printf '%s\\0' {self.args}"], capture_output=True, text=True,
                              timeout=10, env=os.environ)
        assert done.returncode == 0, f"{self.where}: the shell cannot read `{self.args}`: {done.stderr}"
        return done.stdout.split("\0")[:-1]


def _code_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of every line in a command code block, `\\` continuations joined."""
    fence: str | None = None
    pending: tuple[int, str] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else stripped[3:].strip().lower()
            continue
        in_code = (fence is not None and fence in _COMMAND_BLOCKS) or (fence is None and line.startswith(("    ", "\t")))
        if not in_code:
            pending = None
            continue
        if pending is not None:
            number, stripped = pending[0], f"{pending[1]} {stripped}"
        if stripped.endswith("\\"):
            pending = (number, stripped[:-1].rstrip())
            continue
        pending = None
        yield number, stripped


def _command(line: str, where: str) -> Documented | None:
    match = _INVOCATION.search(line)
    if match is None:
        return None
    args = _END.split(f" {match['args']} ", maxsplit=1)[0].strip()
    if "..." in args or "[--" in args:
        return None  # a synopsis, not a command
    return Documented(where, args)


def _commands_in(text: str, name: str) -> Iterator[Documented]:
    for number, line in _code_lines(text):
        if (doc := _command(line, f"{name}:{number}")) is not None:
            yield doc


def _help_examples(command: click.Command, path: str) -> Iterator[Documented]:
    for line in (command.help or "").splitlines():
        if line.startswith(" ") and (doc := _command(line.strip(), f"`{path} --help`")) is not None:
            yield doc
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _help_examples(sub, f"{path} {name}")


def documented() -> list[Documented]:
    found: list[Documented] = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        found += _commands_in(page.read_text(encoding="utf-8"), page.relative_to(ROOT).as_posix())
    found += _help_examples(cli, "imagebuilder")
    return list(dict.fromkeys(found))


# ----------------------------------------------------------------------------- the tiers

NETWORK = "network"  # reads the package index: parsed only
DOCKER = "docker"  # build, publish (as dry runs), verify
FAST = "fast"


def subcommand(argv: list[str]) -> list[str]:
    """The command words: ["matrix", "check"], ["render"], ... (after a global --matrix PATH)."""
    if argv[:1] == ["--matrix"]:
        argv = argv[2:]
    words = argv[:1]
    if words == ["matrix"] and argv[1:2] and argv[1] in ("check", "add"):
        words.append(argv[1])
    return words


def tier(argv: list[str]) -> str:
    words = subcommand(argv)
    if words in (["lock"], ["matrix", "add"], ["project"], ["scan"]) or (words == ["matrix", "check"] and "--online" in argv):
        return NETWORK  # scan: the Debian archive (tests/test_scan_real.py runs it)
    if words and words[0] in ("build", "publish", "verify", "squashfs"):  # squashfs: asks a registry
        return DOCKER
    return FAST


def cheap(argv: list[str]) -> list[str]:
    """What runs for a documented command: build and publish plan and stop."""
    if subcommand(argv)[:1] in (["build"], ["publish"]) and "--dry-run" not in argv:
        return [*argv, "--dry-run"]
    return argv


DOCUMENTED = documented()
ARGVS = {doc: doc.argv() for doc in DOCUMENTED}


def _ids(docs: list[Documented]) -> list[str]:
    return [f"{d.where}: {d.args[:60]}" for d in docs]


def test_the_documentation_shows_commands():
    """The collector still finds what the pages show (a format change must not make this pass empty)."""
    readme = [d for d in DOCUMENTED if d.where.startswith("README.md")]
    assert readme, "README.md shows no imagebuilder command in a code block"
    assert any(subcommand(ARGVS[d])[:1] == ["build"] for d in readme), "README.md shows no build command"
    assert any(d.where.startswith("`imagebuilder render --help`") for d in DOCUMENTED)


@pytest.mark.parametrize("doc", DOCUMENTED, ids=_ids(DOCUMENTED))
def test_every_documented_command_parses(doc):
    """Options and values as click reads them, without running anything."""
    argv = ARGVS[doc]
    if {"--help", "-h", "--version"} & set(argv):
        return  # they exit while parsing; the fast tier runs them
    ctx = cli.make_context("imagebuilder", list(argv))
    with ctx:
        while isinstance(ctx.command, click.Group) and ctx._protected_args + ctx.args:
            name, cmd, rest = ctx.command.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
            assert cmd is not None, f"{doc.where}: no command {name!r}"
            ctx = cmd.make_context(name or "", rest, parent=ctx)
    assert not ctx.args, f"{doc.where}: arguments left over: {ctx.args}"


FAST_DOCS = [d for d in DOCUMENTED if tier(ARGVS[d]) == FAST]
DOCKER_DOCS = [d for d in DOCUMENTED if tier(ARGVS[d]) == DOCKER]


def run_in(tmp_path: Path, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    monkeypatch.chdir(tmp_path)  # render -o build/x lands here
    result = CliRunner().invoke(cli, argv)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"crashed: {result.exception!r}") from result.exception
    return result.exit_code, result.output


@pytest.mark.parametrize("doc", FAST_DOCS, ids=_ids(FAST_DOCS))
def test_every_documented_offline_command_succeeds(doc, tmp_path, monkeypatch):
    code, output = run_in(tmp_path, ARGVS[doc], monkeypatch)
    assert code == 0, f"{doc.where}: `imagebuilder {doc.args}` exited {code}:\n{output[-2000:]}"


def _give_the_reader_their_key(folder: Path, argv: list[str]) -> None:
    """A documented `verify ... --key cosign.pub` assumes the reader holds the pipeline's public
    key: make a real cosign key pair under that name, so the command meets the registry (and
    fails there, exit 1, where the example's registry is unreachable), not a missing file."""
    for option in ("--key", "--sign-key"):
        if option in argv[:-1]:
            name = argv[argv.index(option) + 1]
            if "://" in name or (folder / name).exists():
                continue
            if shutil.which("cosign") is None:
                _unavailable("cosign is missing: .ci/cosign-install.sh installs it")
            done = subprocess.run(["cosign", "generate-key-pair"], cwd=folder, capture_output=True, text=True,
                                  env={**os.environ, "COSIGN_PASSWORD": ""}, timeout=120)
            assert done.returncode == 0, done.stderr
            stem = name.removesuffix(".pub").removesuffix(".key")
            for suffix in (".pub", ".key"):
                if stem != "cosign":
                    (folder / f"cosign{suffix}").rename(folder / f"{stem}{suffix}")


# Why a documented docker-tier command that cannot succeed on this machine fails, each pattern the
# error line the CLI prints for that reason and no other: an example registry's host (ghcr.io/acme,
# registry.example.com) that this machine cannot reach, or that refuses an anonymous reader; an
# image the reader built or pulled; a mirror's base image; a GPU.
EXPECTED_FAILURES = {
    "unreachable registry": r"^error: the registry at https?://\S+ did not answer ",
    "registry refuses": r"^error: the registry refused (?:[A-Z]+ )?https?://\S+ \(HTTP 40[13]: ",
    "image not here": r"^error: \S+ failed verification: image: image \S+ is not here and could not be pulled",
    "mirror base image": r"^error: base image \S+ is not available locally and could not be pulled",
    "no GPU": r"^error: local \S+ failed verification: gpu: no NVIDIA GPU visible on this host",
}
HOST_HAS_GPU = shutil.which("nvidia-smi") is not None


def _registry_host(ref: str) -> str | None:
    """The registry host a reference names (None: Docker Hub's, which the daemon pulls from)."""
    first, slash, _ = ref.partition("/")
    return first if slash and ("." in first or ":" in first or first == "localhost") else None


def _resolves(host: str) -> bool:
    """Whether this machine can look `host` up and connect to it (CI's and the developers'
    machines reach no registry; a loopback example's port has nothing behind it here)."""
    import socket

    name, _, port = host.rpartition(":") if ":" in host else (host, "", "443")
    try:
        with socket.create_connection((name, int(port)), timeout=10):
            return True
    except OSError:
        return False


def must_succeed(argv: list[str]) -> bool:
    """Whether this documented command must exit 0 here: every dry run (build on a base image
    that is local or the default; publish against docs_registry) and a CPU-allowed local verify."""
    return expected(argv) == (0, None)


def expected(argv: list[str]) -> tuple[int, str | None]:
    """The exit status this documented command has on this machine, and the EXPECTED_FAILURES
    reason its error line gives (None: it succeeds). Raises for a command nobody decided about."""
    words = subcommand(argv)
    if words[:1] == ["build"] and "--dry-run" in argv:
        base = argv[argv.index("--base-image") + 1] if "--base-image" in argv[:-1] else None
        if base is not None and _registry_host(base) is not None:
            return 1, "mirror base image"  # a mirror's name, which no machine here resolves
        return 0, None  # the default base, or one that is local
    if words[:1] == ["publish"] and "--dry-run" in argv:
        return 0, None  # against docs_registry
    if words == ["verify"] and "--local" in argv:
        return (0, None) if "--allow-no-gpu" in argv or HOST_HAS_GPU else (1, "no GPU")
    if words == ["squashfs"]:  # the example's registry: a name no machine here resolves, or one that refuses
        host = _registry_host(argv[1])
        assert host is not None, argv
        return 1, "registry refuses" if _resolves(host) else "unreachable registry"
    if words == ["verify"]:
        ref = next(arg for arg in argv[1:] if not arg.startswith("-") and argv[argv.index(arg) - 1] not in
                   ("--key", "--timeout", "--manifest"))
        host = _registry_host(ref)
        if host is None:
            return 1, "image not here"  # an image the reader built or pulled, not here
        return 1, "registry refuses" if _resolves(host) else "unreachable registry"
    raise AssertionError(f"no expected outcome for `imagebuilder {' '.join(argv)}`: add it to expected()")


def with_local_registry(argv: list[str], registry: str) -> list[str]:
    """A publish's --registry HOST/NAMESPACE with HOST replaced by the local registry."""
    argv = list(argv)
    if "--registry" in argv[:-1]:
        i = argv.index("--registry") + 1
        argv[i] = f"{registry}/{argv[i].split('/', 1)[1] if '/' in argv[i] else 'ml'}"
    return argv


@pytest.fixture(scope="module")
def docs_registry() -> Iterator[str]:
    """A local registry standing in for the documentation's example registries."""
    from support.registry import throwaway_registry

    with throwaway_registry() as address:
        yield address


def _check_outcome(doc: Documented, argv: list[str], code: int, output: str) -> None:
    shown = f"{doc.where}: `imagebuilder {' '.join(argv)}` exited {code}:\n{output[-2000:]}"
    assert "Traceback" not in output, shown
    want, reason = expected(argv)
    assert code == want, f"expected exit {want}: {shown}"
    if reason is not None:
        reasons = [name for name, pattern in EXPECTED_FAILURES.items() if re.search(pattern, output, re.M)]
        assert reasons == [reason], f"expected the reason {reason!r}, found {reasons}: {shown}"


PUBLISH_DOCS = [d for d in DOCKER_DOCS if subcommand(ARGVS[d])[:1] == ["publish"]]
BUILD_VERIFY_DOCS = [d for d in DOCKER_DOCS if d not in PUBLISH_DOCS]


def test_the_docker_tier_has_commands_that_must_succeed():
    """The rule is not vacuous: the pages show dry runs of build and publish that must exit 0."""
    assert PUBLISH_DOCS and any(must_succeed(cheap(ARGVS[d])) for d in BUILD_VERIFY_DOCS)
    assert not must_succeed(["build", "--base-image", "mirror.local/ubuntu:22.04", "--dry-run"])
    assert must_succeed(["build", "--base-image", "imagebuilder-base:bookworm", "--dry-run"])
    assert with_local_registry(["publish", "--registry", "ghcr.io/acme", "--dry-run"], "127.0.0.1:5") == [
        "publish", "--registry", "127.0.0.1:5/acme", "--dry-run"]


def test_every_documented_docker_command_has_one_expected_outcome():
    """Each documented build and verify has one outcome on this machine, decided here: exit 0, or
    exit 1 for one named reason (no command may fail for any reason in a list)."""
    outcomes = {" ".join(cheap(ARGVS[d])): expected(cheap(ARGVS[d])) for d in BUILD_VERIFY_DOCS + PUBLISH_DOCS}
    assert all(code in (0, 1) and (code == 0) == (reason is None) for code, reason in outcomes.values()), outcomes
    assert {reason for _, reason in outcomes.values()} - {None} <= set(EXPECTED_FAILURES)
    assert expected(["verify", "ghcr.io/acme/pytorch:2.6", "--key", "cosign.pub"])[1] in (
        "unreachable registry", "registry refuses")
    assert expected(["verify", "pytorch:2.6.0-cuda12.4-cudnn9-runtime", "--allow-no-gpu", "--json"]) == (
        1, "image not here")


# The lines the CLI printed for these commands on this project's machine (2026-12-04), and lines
# that a reason's pattern must not take for its own.
SAID = {
    "unreachable registry": "error: the registry at https://ghcr.io/v2/ did not answer HEAD /v2/acme/pytorch/manifests/"
                            "2.6.0-cuda12.4-cudnn9-runtime ([Errno -2] Name or service not known); check that it runs "
                            "and that this machine can reach it",
    "registry refuses": "error: the registry refused HEAD https://ghcr.io/v2/acme/pytorch/manifests/2.6 (HTTP 401: "
                        "unauthorized); log in with `docker login ghcr.io` (imagebuilder uses docker's stored "
                        "credentials)",
    "image not here": "error: pytorch:2.6.0-cuda12.4-cudnn9-runtime failed verification: image: image "
                      "pytorch:2.6.0-cuda12.4-cudnn9-runtime is not here and could not be pulled: failed to resolve "
                      "reference \"docker.io/library/pytorch:2.6.0-cuda12.4-cudnn9-runtime\"",
    "mirror base image": "error: base image mirror.local/ubuntu:22.04 is not available locally and could not be "
                         "pulled (failed to resolve reference \"mirror.local/ubuntu:22.04\")",
    "no GPU": "error: local /usr/bin/python3 failed verification: gpu: no NVIDIA GPU visible on this host "
              "(nvidia-smi not found: no NVIDIA driver installed); run on a GPU host, or pass --allow-no-gpu",
}
NOT_A_REFUSAL = [
    "error: lock file locks/torch2.6.0-cu124-py3.11-runtime.txt not found; run imagebuilder lock",
    "error: cosign.pub: no such file; give a cosign key file",
    "error: the base image's python3 not found",
    "error: torch 2.6.0 is published for CUDA 12.4 (HTTP 404 page)",
]


@pytest.mark.parametrize("reason", list(EXPECTED_FAILURES))
def test_each_reason_takes_its_own_line_and_no_other(reason):
    assert [name for name, pattern in EXPECTED_FAILURES.items() if re.search(pattern, SAID[reason], re.M)] == [reason]


@pytest.mark.parametrize("line", NOT_A_REFUSAL)
def test_a_line_that_says_not_found_is_no_refusal_of_the_registry(line):
    assert not any(re.search(pattern, line, re.M) for pattern in EXPECTED_FAILURES.values()), line


@pytest.mark.docker
@pytest.mark.beside_builds  # dry runs and verifies: nothing built
@pytest.mark.parametrize("doc", BUILD_VERIFY_DOCS, ids=_ids(BUILD_VERIFY_DOCS))
def test_every_documented_build_and_verify_command_runs_as_expected(doc, tmp_path, monkeypatch, docker_engine):
    argv = cheap(ARGVS[doc])
    _give_the_reader_their_key(tmp_path, argv)
    if argv[:1] == ["verify"] and "--local" in argv:
        # The smoke tests on this host for real: conftest runs each argv once per session
        # (test_verify's local runs ask for docs/verify.md's too).
        from support.host_runs import host_verify

        code, stdout, stderr = host_verify(*argv[1:])
        output = stdout + stderr
    else:
        code, output = run_in(tmp_path, argv, monkeypatch)
    _check_outcome(doc, argv, code, output)


@pytest.mark.registry
@pytest.mark.parametrize("doc", PUBLISH_DOCS, ids=_ids(PUBLISH_DOCS))
def test_every_documented_publish_dry_run_succeeds_against_a_registry(doc, tmp_path, monkeypatch, docs_registry):
    """A publish dry run asks the registry, never the daemon: the fast tier runs these."""
    argv = with_local_registry(cheap(ARGVS[doc]), docs_registry)
    _give_the_reader_their_key(tmp_path, argv)
    # The dry run tries --sign-key as the run would: the reader's key has its password (none) in
    # COSIGN_PASSWORD, as docs/signing.md says.
    monkeypatch.setenv("COSIGN_PASSWORD", "")
    code, output = run_in(tmp_path, argv, monkeypatch)
    _check_outcome(doc, argv, code, output)


def test_every_test_docs_clusters_names_exists():
    """docs/clusters.md says which test runs each runtime's command: those tests exist (a pattern
    with `*` names several, each of which exists)."""
    text = (ROOT / "docs" / "clusters.md").read_text()
    named = set(re.findall(r"`(test_[\w*]+)`", text))
    assert len(named) >= 6, named
    defined = {match for path in (ROOT / "tests").glob("test_*.py")
               for match in re.findall(r"^def (test_\w+)", path.read_text(), re.MULTILINE)}
    for name in named:
        pattern = re.compile("^" + name.replace("*", r"\w+") + "$")
        matches = [test for test in defined if pattern.match(test)]
        assert len(matches) >= (2 if "*" in name else 1), name


def test_the_readme_s_command_table_has_every_command() -> None:
    """Issue 52: a new user reads the table first; `squashfs` and `squashfs-release` were missing."""
    from imagebuilder.cli import cli

    rows = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `")]
    missing = [name for name in sorted(cli.commands) if not any(re.match(rf"\| `{re.escape(name)}[ `]", row)
                                                                for row in rows)]
    assert missing == [], f"README.md's command table lacks {missing}"
