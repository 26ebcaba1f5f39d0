"""Every bad input of issue 18, as a table: the command, its exit code, the one line it prints,
and that it wrote nothing, left nothing running and nothing behind.

The exit codes (docs/exit-codes.md): 0 done; 1 the world failed (daemon, network, a build
step, a failed check); 2 the request is wrong (a flag, a file given, an image that does not
exist, an input the command cannot use); 130 interrupted. CliRunner for the rows that need no
daemon; the rows marked docker use the real engine (and a real local registry).
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from imagebuilder.cli import cli

# Containers of the base image and classic builds of tiny images on it, no BuildKit and no
# torch image of the session's: CI runs these beside the builds (.ci/run, beside_builds).
pytestmark = pytest.mark.beside_builds

SMALL = Path(__file__).parent / "data" / "matrix-small.yaml"
RENDER = ("render", "--torch", "2.6", "--cuda", "12.4")
BUILD = ("build", "--torch", "2.6", "--cuda", "12.1")  # cu124 wheels on the CUDA 12.1 image
PUBLISH = ("publish", "--registry", "127.0.0.1:5999/ns", "--torch", "2.6", "--cuda", "12.1")  # no registry there
LOCK = ("lock", "--torch", "2.6", "--cuda", "12.4", "--os", "debian12", "--variant", "runtime")
NO_DAEMON = "unix:///nonexistent/docker.sock"  # any daemon call would end in "could not reach"


@dataclass(frozen=True)
class Row:
    args: tuple[str, ...]
    code: int
    line: str  # in the one `error:` line (or the note, for exit 0)
    files: tuple[tuple[str, bytes], ...] = ()  # inputs the row writes first, relative to its folder
    env: tuple[tuple[str, str], ...] = ()  # the environment the row runs in, beside DOCKER_HOST=NO_DAEMON


def _matrix(replace: str, by: str) -> bytes:
    text = SMALL.read_text()
    assert replace in text
    return text.replace(replace, by, 1).encode()


ROWS = {
    # 1. a line instead of a traceback
    "verify uppercase": Row(("verify", "Pytorch:2.6"), 2, "'Pytorch:2.6' is not an image reference: the repository name must be lowercase"),
    "verify empty tag": Row(("verify", "pytorch:"), 2, "'pytorch:' is not an image reference: the tag after ':' is empty"),
    "verify short digest": Row(("verify", "pytorch@sha256:abc"), 2, "a sha256 digest has 64 lowercase hex digits"),
    "verify empty": Row(("verify", ""), 2, "'' is not an image reference: it is empty"),
    "build repository": Row(("build", "--torch", "2.6", "--cuda", "12.4", "--repository", "My/PyTorch"), 2,
                            "--repository 'My/PyTorch' is not a repository name: the repository name must be lowercase"),
    "render repository empty": Row((*RENDER, "--dry-run", "--repository", ""), 2, "--repository '' is not a repository name: the name is empty"),
    "render repository space": Row((*RENDER, "--dry-run", "--repository", "a b"), 2, "--repository 'a b' is not a repository name: it contains a space"),
    "render repository tag": Row((*RENDER, "--dry-run", "--repository", "pytorch:latest"), 2, "it has a tag or digest"),
    "render base image": Row((*RENDER, "--dry-run", "--base-image", "BAD REF"), 2, "--base-image 'BAD REF' is not an image reference: it contains a space"),
    "render -o /proc": Row((*RENDER, "-o", "/proc/x"), 2, "-o /proc/x: /proc is on the kernel's proc file system"),
    "render -o /sys": Row((*RENDER, "-o", "/sys/x"), 2, "-o /sys/x: /sys is on the kernel's sysfs file system"),
    "render -o under a file": Row((*RENDER, "-o", "afile.txt/sub"), 2, "afile.txt is not a folder", (("afile.txt", b"x"),)),
    "render -o /dev/null": Row((*RENDER, "-o", "/dev/null"), 2, "-o /dev/null: it is a device, not a folder"),
    "matrix not UTF-8": Row(("--matrix", "m.yaml", "matrix"), 2, "m.yaml:1: <top>: not UTF-8 text (byte 0xff)",
                            (("m.yaml", b"\xff\xfe" + SMALL.read_bytes()),)),
    "matrix alias loop": Row(("--matrix", "m.yaml", "matrix"), 2, "a YAML alias inside the anchor it names",
                             (("m.yaml", _matrix("os:\n", "os: &loop\n  loop: *loop\n")),)),
    "matrix min_driver": Row(("--matrix", "m.yaml", "matrix"), 2, "cuda.12.4.min_driver: not a driver version",
                             (("m.yaml", _matrix('min_driver: "550.54.15"', 'min_driver: "550.x"')),)),
    "matrix python null": Row(("--matrix", "m.yaml", "matrix"), 2, 'torch.2.6.python: expected a list of Python versions',
                              (("m.yaml", _matrix('    python: ["3.9", "3.10", "3.11", "3.12", "3.13"]', "    python: null")),)),
    "lock --uv not a program": Row((*LOCK, "--uv", "/etc/hostname"), 2, "--uv /etc/hostname is not a uv executable"),
    # 2. refused now, not minutes later
    "ca-bundle text": Row((*RENDER, "--dry-run", "--ca-bundle", "/etc/hostname"), 2, "--ca-bundle /etc/hostname holds no PEM certificate"),
    "ca-bundle empty": Row((*RENDER, "--dry-run", "--ca-bundle", "empty.pem"), 2, "holds no PEM certificate", (("empty.pem", b""),)),
    "ca-bundle BEGIN/END around junk": Row((*RENDER, "--dry-run", "--ca-bundle", "junk.pem"), 2,
                                           "holds a PEM block that is not a certificate OpenSSL can read",
                                           (("junk.pem", b"-----BEGIN CERTIFICATE-----\nMIIBjunk\n-----END CERTIFICATE-----\n"),)),
    "ca-bundle /dev/null": Row((*RENDER, "--dry-run", "--ca-bundle", "/dev/null"), 2, "--ca-bundle /dev/null holds no PEM certificate"),
    "render --with torch": Row((*RENDER, "--dry-run", "--with", "torch==2.5.1"), 2,
                               "--with 'torch==2.5.1' contradicts the image's torch==2.6.0"),
    "render --with torchvision": Row((*RENDER, "--dry-run", "--with", "torchvision<0.20"), 2, "contradicts the image's torchvision==0.21.0"),
    "render --with triton": Row((*RENDER, "--dry-run", "--with", "triton==3.1.0"), 2, "contradicts the image's triton==3.2.0"),
    # issue 29, item 7: without a lock too, and whatever the spelling; a direct URL is another build
    "render --with nvidia-cudnn, no lock": Row((*RENDER, "--dry-run", "--with", "nvidia-cudnn-cu12==8.9.2.26"), 2,
                                               "contradicts the image's nvidia-cudnn-cu12==9.1.0.70"),
    "render --with nvidia_nccl underscores": Row((*RENDER, "--dry-run", "--with", "NVIDIA_NCCL_CU12<2"), 2,
                                                 "contradicts the image's nvidia-nccl-cu12=="),
    "render --with torch @ URL": Row((*RENDER, "--dry-run", "--with", "torch @ https://example.com/torch-2.6.0-cp311-none.whl"), 2,
                                     "contradicts the image's torch==2.6.0"),
    "lock --with torch": Row((*LOCK, "--with", "torch==2.5.1"), 2, "contradicts the image's torch==2.6.0"),
    # 4. one request, one answer
    "matrix cross-major": Row(("matrix", "--torch", "2.6", "--cuda", "13.0"), 2, "another CUDA major cannot be used"),
    "matrix unknown os": Row(("matrix", "--os", "nope"), 2, "OS nope is not in matrix.yaml; known:"),
    "matrix unknown python": Row(("matrix", "--python", "9.9"), 2, "no torch release of the matrix ships wheels for Python 9.9"),
    "matrix python of another torch": Row(("matrix", "--torch", "2.6", "--python", "3.14"), 2, "torch 2.6.0 ships no wheels for Python 3.14"),
    "matrix valid, empty": Row(("matrix", "--cuda", "12.8", "--os", "ubuntu22.04", "--variant", "devel"), 0, "(no images match)"),
    # 6. messages that blame the right thing
    "python empty": Row((*RENDER, "--dry-run", "--python", ""), 2, "--python is empty; give a value"),
    "os empty": Row(("matrix", "--os", ""), 2, "--os is empty; give a value"),
    "matrix path empty": Row(("--matrix", "", "matrix"), 2, "--matrix '': the path is empty"),
    "cuda update noted": Row(("render", "--torch", "2.6", "--cuda", "12.4.0", "--dry-run"), 0,
                             "note: --cuda 12.4.0: the matrix's CUDA 12.4 is 12.4.1"),
    # issue 29, item 2: index URLs uv can use, credentials in no RUN line
    "render --index-url not a URL": Row((*RENDER, "--dry-run", "--index-url", "notaurl"), 2,
                                        "--index-url notaurl is not a package index URL: its scheme is missing"),
    "render --extra-index-url ftp": Row((*RENDER, "--dry-run", "--extra-index-url", "ftp://x/simple"), 2,
                                        "--extra-index-url ftp://x/simple is not a package index URL: its scheme is ftp://"),
    "lock --index-url bad port": Row((*LOCK, "--index-url", "https://127.0.0.1:abc/simple"), 2,
                                     "its port is not a number from 1 to 65535"),
    "matrix check --online not a URL": Row(("matrix", "check", "--online", "--index-url", "notaurl"), 2,
                                           "--index-url notaurl is not a package index URL"),
    "matrix add not a URL": Row(("matrix", "add", "--torch", "2.6.0", "--index-url", "notaurl"), 2,
                                "--index-url notaurl is not a package index URL"),
    "render credentials, classic": Row((*RENDER, "--dry-run", "--index-url", "https://alice:s3cr3t@mirror.example.com/simple"), 2,
                                       "the classic builder would write into the image's history; use --builder buildkit"),
    # issue 29, item 4: a flag that would be ignored, or would say OK for what it did not check
    "verify --signature-only without --key": Row(("verify", "pytorch:2.6", "--signature-only"), 2,
                                                 "--signature-only checks the signature against --key: give --key PUB"),
    "verify --signature-only --json without --key": Row(("verify", "pytorch:2.6", "--signature-only", "--json"), 2,
                                                        "give --key PUB"),
    "verify --local with a TAG": Row(("verify", "--local", "pytorch:2.6"), 2, "--local checks this Python environment, not an image"),
    "publish --merge-only --no-merge": Row(("publish", "--registry", "127.0.0.1:5000/ns", "--platform", "linux/amd64,linux/arm64",
                                            "--merge-only", "--no-merge"), 2, "--merge-only writes the indexes that --no-merge leaves out"),
    "build --compression-level alone": Row(("build", "--torch", "2.6", "--cuda", "12.4", "--compression-level", "3"), 2,
                                           "give --compression zstd, gzip, estargz, zstd:chunked or gzip+zstd with it"),
    # issue 46, item 2: --compression and its level parsed into one value before any
    # daemon or registry is asked, in a dry run too
    "build --compression-level out of range, no daemon": Row((*BUILD, "--compression", "gzip", "--compression-level", "10"),
                                                             2, "--compression-level 10 is not a gzip level; gzip takes 0..9"),
    "build --dry-run --compression-level out of range": Row((*BUILD, "--dry-run", "--compression", "zstd",
                                                             "--compression-level", "23"), 2, "zstd takes 0..22"),
    "publish --dry-run --compression-level -1": Row((*PUBLISH, "--dry-run", "--compression", "zstd",
                                                     "--compression-level", "-1"), 2,
                                                    "--compression-level -1 is not a zstd level; zstd takes 0..22"),
    # issue 43, part 4: gzip+zstd exports each of its two at BuildKit's default level
    "publish --dry-run --compression gzip+zstd with a level": Row((*PUBLISH, "--dry-run", "--compression", "gzip+zstd",
                                                                   "--compression-level", "3"), 2,
                                                                  "gzip+zstd exports each at BuildKit's default"),
    # issue 44: the start profile orders eStargz layers; with any other compression it would be ignored
    "publish --squashfs --no-push": Row((*PUBLISH, "--squashfs", "--no-push"), 2,
                                        "--squashfs pushes each image's squashfs beside it: drop --no-push or --squashfs"),
    "publish --dry-run --squashfs --no-push": Row((*PUBLISH, "--dry-run", "--no-push", "--squashfs"), 2,
                                                  "drop --no-push or --squashfs"),
    "publish --dry-run --start-command without estargz": Row((*PUBLISH, "--dry-run", "--compression", "zstd",
                                                              "--start-command", "python -c 'import torch'"), 2,
                                                             "--start-command orders eStargz layers: give --compression estargz"),
    "publish --dry-run --start-command without compression": Row((*PUBLISH, "--dry-run", "--start-command", ""), 2,
                                                                 "give --compression estargz (or zstd:chunked) with it, or drop it"),
    # issue 52, round five: a start command sh could not read either
    "publish --dry-run --start-command with a quote unclosed": Row(
        (*PUBLISH, "--dry-run", "--compression", "estargz", "--start-command", "python -c 'import torch"), 2,
        "--start-command \"python -c 'import torch\" does not read as a shell command (no closing quotation)"),
    "build --compression zstd:chunked": Row((*BUILD, "--compression", "zstd:chunked"), 2,
                                            "--compression zstd:chunked is written by publish"),
    "publish --dry-run --compression zstd:chunked level 23": Row(
        (*PUBLISH, "--dry-run", "--compression", "zstd:chunked", "--compression-level", "23"), 2,
        "--compression-level 23 is not a zstd:chunked level; zstd:chunked takes 0..22"),
    "build --compression lz4": Row((*BUILD, "--compression", "lz4"), 2,
                                   "--compression 'lz4' is not a compression; give zstd, gzip, estargz, zstd:chunked or gzip+zstd"),
    "publish --dry-run --compression ZSTD": Row((*PUBLISH, "--dry-run", "--compression", "ZSTD"), 2,
                                                "--compression 'ZSTD' is not a compression; give zstd, gzip, estargz, zstd:chunked or gzip+zstd"),
    "build --cache-from-registry with a scheme, no daemon": Row((*BUILD, "--cache-from-registry", "https://ghcr.io/acme"), 2,
                                                                "--cache-from-registry 'https://ghcr.io/acme': no scheme"),
    "build --dry-run --cache-from-registry uppercase": Row((*BUILD, "--dry-run", "--cache-from-registry", "ghcr.io/Acme"), 2,
                                                           "--cache-from-registry 'ghcr.io/Acme': namespace 'Acme' must be lowercase"),
    "build --cache-from-registry a Hub user": Row((*BUILD, "--cache-from-registry", "acme"), 2,
                                                  "--cache-from-registry 'acme': 'acme' is not a registry host"),
    "build --cache-from-registry port 0": Row((*BUILD, "--cache-from-registry", "127.0.0.1:0/ns"), 2,
                                              "the port is not a number from 1 to 65535"),
    # ... and what the classic builder asked for cannot export, refused before any daemon is asked
    "build --builder classic --compression zstd, no daemon": Row((*BUILD, "--builder", "classic", "--compression", "zstd"), 2,
                                                                 "--compression zstd needs BuildKit: the classic builder"),
    "build --dry-run --builder classic --cache-from-registry": Row((*BUILD, "--dry-run", "--builder", "classic",
                                                                   "--cache-from-registry", "127.0.0.1:5000/ns"), 2,
                                                                  "--cache-from-registry needs BuildKit"),
    "publish --dry-run --builder classic --compression zstd": Row((*PUBLISH, "--dry-run", "--builder", "classic",
                                                                   "--compression", "zstd"), 2,
                                                                  "--compression zstd needs BuildKit: the classic builder"),
    "publish --dry-run --builder classic --compression-level": Row((*PUBLISH, "--dry-run", "--builder", "classic",
                                                                    "--compression", "gzip", "--compression-level", "3"),
                                                                   2, "--compression-level needs BuildKit"),
    "publish --registry with a scheme": Row(("publish", "--registry", "https://ghcr.io/acme", "--dry-run"), 2,
                                            "--registry 'https://ghcr.io/acme': no scheme"),
    "render --dry-run -o": Row((*RENDER, "--dry-run", "-o", "out"), 2, "or --dry-run to print the Dockerfile (not both)"),
    # issue 29, item 5: a line, not a traceback, and before any work
    "verify --timeout nan": Row(("verify", "--local", "--timeout", "nan"), 2, "--timeout nan is not a number of seconds from 1 to 604800"),
    "verify --timeout inf": Row(("verify", "pytorch:2.6", "--timeout", "inf"), 2, "--timeout inf is not a number of seconds"),
    # Echoed as typed, not converted (round five: 1e400 came back as `inf`, 1e300 as `1e+300`).
    "verify --timeout 1e300": Row(("verify", "pytorch:2.6", "--timeout", "1e300"), 2, "--timeout 1e300 is not a number of seconds"),
    "verify --timeout 1e400": Row(("verify", "pytorch:2.6", "--timeout", "1e400"), 2, "--timeout 1e400 is not a number of seconds"),
    "publish --registry-timeout 1E999": Row((*PUBLISH, "--dry-run", "--registry-timeout", "1E999"), 2,
                                            "--registry-timeout 1E999 is not a number of seconds"),
    "publish --start-timeout 0": Row((*PUBLISH, "--dry-run", "--start-timeout", "0"), 2,
                                     "--start-timeout 0 is not a number of seconds"),
    "publish --verify-timeout nan": Row(("publish", "--registry", "127.0.0.1:5000/ns", "--verify-timeout", "nan"), 2,
                                        "--verify-timeout nan is not a number of seconds"),
    "build --report unwritable": Row(("build", "--torch", "2.6", "--cuda", "12.4", "--report", "afile/r.json"), 2,
                                     "--report afile/r.json: cannot write a file there", (("afile", b"x"),)),
    "build --report a folder": Row(("build", "--torch", "2.6", "--cuda", "12.4", "--report", "."), 2,
                                   "--report .: cannot write a file there"),
    "build --report /proc": Row(("build", "--torch", "2.6", "--cuda", "12.4", "--report", "/proc/r.json"), 2,
                                "--report /proc/r.json: cannot write a file there"),
    "publish --registry port abc": Row(("publish", "--registry", "127.0.0.1:abc/ns", "--dry-run"), 2,
                                       "'127.0.0.1:abc' is not a registry host[:port]"),
    "verify port abc": Row(("verify", "127.0.0.1:abc/x:1"), 2, "'127.0.0.1:abc' is not a registry host[:port]"),
    "verify port abc --signature-only": Row(("verify", "127.0.0.1:abc/x:1", "--key", "k.pub", "--signature-only"), 2,
                                            "'127.0.0.1:abc' is not a registry host[:port]"),
    # issue 29, item 6: a wrong request, not a registry that did not answer
    "publish --registry port 0": Row(("publish", "--registry", "127.0.0.1:0/ns", "--dry-run"), 2,
                                     "the port is not a number from 1 to 65535"),
    "publish --registry port 99999": Row(("publish", "--registry", "127.0.0.1:99999/ns", "--dry-run"), 2,
                                         "the port is not a number from 1 to 65535"),
    "publish --registry empty port": Row(("publish", "--registry", "127.0.0.1:/ns", "--dry-run"), 2,
                                         "'127.0.0.1:' is not a registry host[:port]"),
    "verify port 99999": Row(("verify", "127.0.0.1:99999/x:1"), 2, "the port is not a number from 1 to 65535"),
    "lock --uv missing": Row((*LOCK, "--uv", "/nope/uv"), 2, "--uv /nope/uv is not a uv executable (no such file)"),
    "DOCKER_HOST garbage": Row(("build", "--torch", "2.6", "--cuda", "12.4"), 2,
                               "DOCKER_HOST=garbage is not a Docker daemon address", env=(("DOCKER_HOST", "garbage"),)),
    "DOCKER_HOST port abc": Row(("build", "--torch", "2.6", "--cuda", "12.4"), 2,
                                "its port is not a number from 1 to 65535", env=(("DOCKER_HOST", "tcp://h:abc"),)),
    "matrix add already there": Row(("matrix", "add", "--torch", "2.6.0"), 2, "already has torch 2.6 (2.6.0)"),
    "matrix add --cuda-variant banana": Row(("matrix", "add", "--torch", "2.99.0", "--cuda-variant", "banana"), 2,
                                            "--cuda-variant 'banana' is not a CUDA wheel variant"),
    "publish --registry-ca without a certificate": Row(("publish", "--registry", "127.0.0.1:5000/ns", "--dry-run",
                                                        "--registry-ca", "ca.pem"), 2,
                                                       "--registry-ca ca.pem holds no PEM certificate", (("ca.pem", b"junk\n"),)),
    # issue 29, item 6: a wrong request to build is refused before any daemon is asked (the
    # rows run with DOCKER_HOST at no daemon: asking one first would be exit 1)
    "build --with nvidia-cudnn, no daemon": Row((*BUILD, "--with", "nvidia-cudnn-cu12==1.0"), 2,
                                                "contradicts the image's nvidia-cudnn-cu12==9.1.0.70"),
    "build --with torch, no daemon": Row((*BUILD, "--with", "torch==2.5.1"), 2,
                                         "--with 'torch==2.5.1' contradicts the image's torch==2.6.0"),
    "build --with nvidia_nccl underscores, no daemon": Row((*BUILD, "--with", "NVIDIA_NCCL_CU12<2"), 2,
                                                           "contradicts the image's nvidia-nccl-cu12=="),
    "build --with torch @ URL, no daemon": Row((*BUILD, "--with", "torch @ https://example.com/torch-2.6.0-cp311-none.whl"),
                                               2, "contradicts the image's torch==2.6.0"),
    "build --with not a requirement, no daemon": Row((*BUILD, "--with", "pandas=="), 2,
                                                     "--with 'pandas==' is not a requirement"),
    "build --with, every variant, no daemon": Row((*BUILD, "--variant", "all", "--with", "torchvision<0.20"), 2,
                                                  "contradicts the image's torchvision==0.21.0"),
    "build --with, --base-image without --os, no daemon": Row((*BUILD, "--base-image", "mirror.local/cuda:12.1.1",
                                                               "--with", "triton==3.1.0"), 2,
                                                              "contradicts the image's triton==3.2.0"),
    "build unknown torch, no daemon": Row(("build", "--torch", "9.9", "--cuda", "12.1"), 2, "torch 9.9 is not in matrix.yaml"),
    "build --python, no daemon": Row((*BUILD, "--python", "3.99"), 2, "ships no wheels for Python 3.99"),
    "build credentials, classic, no daemon": Row((*BUILD, "--builder", "classic", "--index-url",
                                                  "https://alice:s3cr3t@mirror.example.com/simple"), 2,
                                                 "the classic builder would write into the image's history"),
    # the same for publish: its filters' images, every platform's, before any daemon or registry
    "publish --with nvidia-cudnn, no daemon": Row((*PUBLISH, "--with", "nvidia-cudnn-cu12==1.0"), 2,
                                                  "contradicts the image's nvidia-cudnn-cu12==9.1.0.70"),
    "publish --with not a requirement, no daemon": Row((*PUBLISH, "--with", "pandas=="), 2,
                                                       "--with 'pandas==' is not a requirement"),
    "publish unknown torch, no daemon": Row(("publish", "--registry", "127.0.0.1:5999/ns", "--torch", "9.9"), 2,
                                            "torch 9.9 is not in matrix.yaml"),
    "publish --with, two platforms, no daemon": Row((*PUBLISH, "--cuda", "12.4", "--platform", "linux/amd64,linux/arm64",
                                                     "--with", "torchvision<0.20"), 2,
                                                    "contradicts the image's torchvision==0.21.0"),
    "publish --with, --base-image without --os, no daemon": Row((*PUBLISH, "--base-image", "mirror.local/cuda:12.1.1",
                                                                 "--with", "triton==3.1.0"), 2,
                                                                "contradicts the image's triton==3.2.0"),
    "publish credentials, classic, no daemon": Row((*PUBLISH, "--builder", "classic", "--index-url",
                                                    "https://alice:s3cr3t@mirror.example.com/simple"), 2,
                                                   "the classic builder would write into the image's history"),
    "publish --merge-only --with, no daemon": Row((*PUBLISH, "--platform", "linux/amd64,linux/arm64", "--merge-only",
                                                   "--with", "nvidia-cudnn-cu12==1.0"), 2,
                                                  "contradicts the image's nvidia-cudnn-cu12==9.1.0.70"),
    # 5. the world's failure
    "no daemon": Row(("build", "--torch", "2.6", "--cuda", "12.4"), 1, "could not reach the Docker daemon"),
    # a good request with a --with, or a --base-image whose OS only the daemon can tell, is asked of it
    "no daemon, a good --with": Row((*BUILD, "--with", "pandas==2.2.3"), 1, "could not reach the Docker daemon"),
    "no daemon, --base-image without --os": Row((*BUILD, "--base-image", "mirror.local/cuda:12.1.1"), 1,
                                                "could not reach the Docker daemon"),
    "publish, no daemon, a good --with": Row((*PUBLISH, "--with", "pandas==2.2.3"), 1, "could not reach the Docker daemon"),
    "publish --dry-run, no registry, a good --with": Row((*PUBLISH, "--dry-run", "--with", "pandas==2.2.3"), 1,
                                                         "the registry at http://127.0.0.1:5999/v2/ did not answer"),
}


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name", list(ROWS))
def test_a_bad_input_gets_one_line_and_its_exit_code_and_writes_nothing(name: str, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    row = ROWS[name]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DOCKER_HOST", NO_DAEMON)  # proves no row but "no daemon" asks one
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for key, value in row.env:
        monkeypatch.setenv(key, value)
    for relative, data in row.files:
        (tmp_path / relative).write_bytes(data)
    before = _tree(tmp_path)
    args = row.args if row.args[0] == "--matrix" else ("--matrix", str(SMALL), *row.args)
    result = CliRunner().invoke(cli, list(args))
    err = result.stderr
    assert result.exit_code == row.code, (result.exit_code, err, result.exception)
    assert "Traceback" not in err and "Traceback" not in result.stdout
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    if row.code == 0:
        assert row.line in result.output
    else:
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, err
        assert row.line in err, err
        assert result.stdout == ""
    after = _tree(tmp_path)
    assert after == before, "the command wrote files"
    assert not Path("/proc/x").exists() and not Path("/sys/x").exists()


def test_render_never_follows_a_link_out_of_the_output_folder(tmp_path: Path) -> None:
    out, user = tmp_path / "out", tmp_path / "user"
    runner = CliRunner()
    assert runner.invoke(cli, ["--matrix", str(SMALL), *RENDER, "-o", str(out)]).exit_code == 0
    user.mkdir()
    (user / "manifest.json").write_text("mine")
    theirs = _tree(user)
    ours = _tree(out)
    # The user replaced a folder imagebuilder wrote with a link to their own folder.
    for sub in sorted(p for p in out.iterdir() if p.is_dir()):
        moved = tmp_path / f"moved-{sub.name}"
        sub.rename(moved)
        sub.symlink_to(user, target_is_directory=True)
        result = runner.invoke(cli, ["--matrix", str(SMALL), *RENDER, "-o", str(out)])
        assert result.exit_code == 2, result.stderr
        assert f"{sub} is a symbolic link (to {user})" in result.stderr
        assert "does not follow links out of it" in result.stderr
        assert _tree(user) == theirs, "a file of the user's folder was touched"
        sub.unlink()
        moved.rename(sub)
    assert _tree(out) == ours
    # A link in place of one of our files is replaced itself; what it pointed to stays.
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep")
    (out / "Dockerfile").unlink()
    (out / "Dockerfile").symlink_to(target)
    assert runner.invoke(cli, ["--matrix", str(SMALL), *RENDER, "-o", str(out)]).exit_code == 0
    assert not (out / "Dockerfile").is_symlink() and target.read_text() == "keep"


def test_ctrl_c_exits_130(monkeypatch: pytest.MonkeyPatch) -> None:
    from imagebuilder import pipeline

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "each_platform", interrupted)
    result = CliRunner().invoke(cli, ["--matrix", str(SMALL), *RENDER, "--dry-run"])
    assert result.exit_code == 130 and result.stderr.strip() == "interrupted"


# A daemon whose containers cannot start for a reason of its own (its bridge is gone), in its
# own words (moby's libnetwork), beside the refusal of a daemon without the NVIDIA toolkit.
BRIDGE_GONE = ("failed to create endpoint quirky_hopper on network bridge: adding interface veth3f1a2b3 to "
               "bridge docker0 failed: could not find bridge docker0: route ip+net: no such network interface")


@pytest.mark.parametrize(("said", "blames_toolkit"), [
    (BRIDGE_GONE, False),
    ('could not select device driver "" with capabilities: [[gpu]]', True),
    ("failed to create task for container: error running hook #0: nvidia-container-cli: initialization error", True),
    ("mkdir /var/lib/docker/overlay2/abc: no space left on device (image nvidia/cuda:12.4.1-base-ubuntu22.04)", False),
])
def test_only_a_gpu_refusal_is_blamed_on_the_nvidia_toolkit(said: str, blames_toolkit: bool) -> None:
    from imagebuilder.engine.errors import refuses_gpus
    from imagebuilder.verify.preflight import read_gpu_probe

    probe = read_gpu_probe(said)
    assert ("NVIDIA Container Toolkit" in (probe.error or "")) is blames_toolkit
    assert refuses_gpus(said) is blames_toolkit
    if not blames_toolkit:
        assert "not a GPU problem" in (probe.error or "")


def test_verify_local_without_torch_names_the_python_it_checked() -> None:
    from imagebuilder.verify.run import verify_local

    python = "/usr/bin/python3"
    if not Path(python).exists() or subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0:
        pytest.skip(f"needs a {python} without torch")
    report = verify_local(python=python, allow_no_gpu=True, timeout=120)
    assert report.error is not None and f"torch is not importable in {python}" in report.error
    assert "the image's" not in report.error


# --------------------------------------------------------------------------- the real engine


def docker(*args: str, timeout: float = 120) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=True).stdout


@pytest.fixture
def leftovers(docker_engine: object) -> Iterator[str]:
    """A repository name for the row; after it, no image of that name and no container the
    row's commands started may be left."""
    repository = f"imagebuilder-test/badinput-{uuid.uuid4().hex[:8]}"
    running = set(docker("ps", "-aq", "--filter", "label=org.imagebuilder.run").split())
    yield repository
    assert docker("images", "-q", repository) == ""
    started = set(docker("ps", "-aq", "--filter", "label=org.imagebuilder.run").split()) - running
    # Others share this daemon (CI's other session runs and removes containers of the base
    # meanwhile): only a container of ours (its image) that is still there counts, and one of
    # the base only if it outlives another run's few seconds.
    ours = _still_there(started, repository)
    if any(repository not in image for image in ours.values()):
        time.sleep(10)
        ours = _still_there(set(ours), repository)
    assert ours == {}


def _still_there(containers: set[str], repository: str) -> dict[str, str]:
    """container -> its image, for those that exist and are of the base or of `repository`."""
    found = {}
    for container in containers:
        done = subprocess.run(["docker", "inspect", "-f", "{{.Config.Image}}", container], capture_output=True,
                              text=True, timeout=120)
        if done.returncode == 0 and ("imagebuilder-base" in done.stdout or repository in done.stdout):
            found[container] = done.stdout.strip()
    return found


def imagebuilder(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    exe = Path(os.environ.get("VIRTUAL_ENV", Path(__file__).resolve().parents[1] / ".venv")) / "bin" / "imagebuilder"
    command = [str(exe)] if exe.exists() else ["python", "-m", "imagebuilder"]
    return subprocess.run([*command, "--matrix", str(SMALL), *args], capture_output=True, text=True, timeout=timeout)


def _one_line(done: subprocess.CompletedProcess[str], code: int, line: str) -> None:
    assert done.returncode == code, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    errors = [e for e in done.stderr.splitlines() if e.startswith("error:")]
    assert len(errors) == 1 and line in errors[0], done.stderr[-3000:]


@pytest.mark.docker
def test_verify_of_an_image_without_torch_says_it_is_not_a_pytorch_image(base_image: str, leftovers: str) -> None:
    done = imagebuilder("verify", base_image, "--allow-no-gpu")
    _one_line(done, 2, "not a PyTorch image: it has no python3 on its PATH")
    assert 'exec: "python3"' not in done.stderr


@pytest.mark.docker
@pytest.mark.registry
def test_an_image_that_exists_nowhere_is_a_bad_request(registry: str, base_image: str, leftovers: str) -> None:
    missing = f"{registry}/{leftovers}:nope"
    _one_line(imagebuilder("verify", missing, "--allow-no-gpu"), 2, f"image {missing} is not here and could not be pulled")
    done = imagebuilder("build", "--torch", "2.6", "--cuda", "12.4", "--base-image", missing, "--repository", leftovers)
    _one_line(done, 2, f"base image {missing} is not available locally and could not be pulled")


@pytest.mark.docker
def test_a_registry_that_cannot_be_asked_is_the_worlds_failure(docker_engine: object, leftovers: str) -> None:
    # No registry answers on this port: the image may well exist, so exit 1 (retrying may help).
    missing = "127.0.0.1:9/nope:1"
    done = imagebuilder("build", "--torch", "2.6", "--cuda", "12.4", "--base-image", missing, "--repository", leftovers)
    _one_line(done, 1, f"base image {missing} is not available locally and could not be pulled")


@pytest.mark.docker
def test_build_refuses_a_with_that_contradicts_the_torch_pins(base_image: str, leftovers: str) -> None:
    done = imagebuilder("build", "--torch", "2.6", "--cuda", "12.4", "--base-image", base_image, "--repository",
                        leftovers, "--with", "torch==2.5.1")
    _one_line(done, 2, "--with 'torch==2.5.1' contradicts the image's torch==2.6.0")
    assert "building" not in done.stderr


@pytest.mark.docker
def test_a_devel_base_image_without_nvcc_fails_the_first_build_step(base_image: str, leftovers: str) -> None:
    """The one real build of this table: on the nvcc-less base it stops at its first RUN."""
    ca = os.environ.get("SSL_CERT_FILE")
    done = imagebuilder("build", "--torch", "2.6", "--cuda", "12.4", "--variant", "devel", "--base-image", base_image,
                        "--repository", leftovers, *(["--ca-bundle", ca] if ca else []), timeout=900)
    _one_line(done, 2, "the --base-image has no CUDA compiler")
    assert f"imagebuilder: no nvcc in --base-image {base_image}: a CUDA 12.4 devel image needs nvcc 12.4" in done.stderr
    assert "step 2/" in done.stderr  # before any install


@pytest.mark.docker
@pytest.mark.parametrize(("user", "writable", "warned"), [("1000", False, True), ("0", False, False), ("1000", True, False)])
def test_an_unwritable_workspace_is_warned_about_at_start(base_image: str, tmp_path: Path, leftovers: str,
                                                          user: str, writable: bool, warned: bool) -> None:
    """The rendered entrypoint in a real container of the smallest image that can run it (the
    Debian base, the entrypoint mounted in): a torch image's start runs the same script."""
    context = tmp_path / "ctx"
    assert imagebuilder("render", *RENDER[1:], "--os", "debian12", "-o", str(context)).returncode == 0
    entrypoint = context / "rootfs" / "usr" / "local" / "bin" / "imagebuilder-entrypoint"
    workspace = tmp_path / "work"
    workspace.mkdir(mode=0o777 if writable else 0o755)
    workspace.chmod(0o777 if writable else 0o755)
    done = subprocess.run(["docker", "run", "--rm", "--label", "org.imagebuilder.run=1", "--user", user,
                           "-v", f"{entrypoint}:/e:ro", "-v", f"{workspace}:/workspace", base_image,
                           "sh", "/e", "true"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "/workspace" in line]
    if warned:
        assert lines == [f"imagebuilder: warning: /workspace is not writable by uid {user}: files there open but "
                         "saving fails (JupyterLab: 403 Permission denied); run the container as the folder's "
                         'owner: --user "$(id -u):$(id -g)" (rootless Podman: with --userns=keep-id)']
    else:
        assert lines == []


def test_every_bad_input_docs_exit_codes_documents_behaves_as_documented() -> None:
    """tests/battery.py over the table of docs/exit-codes.md, as a user runs each command."""
    import battery

    cases = battery.documented_cases()
    assert len(cases) >= 40 and {case.code for case in cases} == {1, 2}
    failures = [f"{case.command}: {problem}" for case, problem in battery.run_battery(cases) if problem]
    assert failures == []
    # The battery can fail: a documented code that is wrong is caught.
    assert "exit 2, not 0" in (battery.run_case(battery.Case(0, "imagebuilder matrix --os nope")) or "")
