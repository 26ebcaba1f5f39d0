"""estargz/profile.py: strace's output read into a start profile (pure, tables), and one real
profile of the Debian base image traced from this host."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from support.unavailable import _unavailable

from imagebuilder.estargz.profile import StartFailed, start_profile
from imagebuilder.estargz.trace import MARK, STRACE_FLAGS, Opened, interpreter_of, parse_trace, profile_files

# Containers of the base image and classic builds of tiny images on it, no BuildKit and no
# torch image of the session's: CI runs these beside the builds (.ci/run, beside_builds).
pytestmark = pytest.mark.beside_builds

if TYPE_CHECKING:
    from imagebuilder.engine.docker import DockerEngine

# What `strace -f -qq -y -o FILE` wrote for a shell that ran cat, abridged; the pids prefix each line.
TRACE = """\
101 execve("/bin/sh", ["sh", "-c", "cat /etc/x"], 0x7ffd /* 5 vars */) = 0
101 openat(AT_FDCWD</>, "/etc/ld.so.cache", O_RDONLY|O_CLOEXEC) = 3</etc/ld.so.cache>
101 openat(AT_FDCWD</>, "/lib/x86_64-linux-gnu/libc.so.6", O_RDONLY|O_CLOEXEC) = 3</usr/lib/x86_64-linux-gnu/libc.so.6>
101 openat(AT_FDCWD</>, "/usr/lib/locale/locale-archive", O_RDONLY|O_CLOEXEC) = -1 ENOENT (No such file or directory)
101 openat(AT_FDCWD</>, "/usr/lib/python3/dist-packages", O_RDONLY|O_NONBLOCK|O_CLOEXEC|O_DIRECTORY) = 3</usr/lib/python3/dist-packages>
101 openat(AT_FDCWD</>, "/tmp/out", O_WRONLY|O_CREAT|O_TRUNC, 0666) = 3</tmp/out>
102 execve("/usr/bin/cat", ["cat", "/etc/x"], 0x55 /* 5 vars */ <unfinished ...>
101 openat(AT_FDCWD</>, "/proc/self/maps", O_RDONLY <unfinished ...>
102 <... execve resumed>) = 0
101 <... openat resumed>) = 4</proc/101/maps>
102 openat(AT_FDCWD</>, "/etc/x", O_RDONLY) = 3</etc/x>
102 open("/etc/ld.so.cache", O_RDONLY) = 3</etc/ld.so.cache>
[pid   103] openat2(AT_FDCWD</>, "/etc/y", {flags=O_RDONLY|O_CLOEXEC, resolve=0}, 24) = 5</etc/y>
103 execve("/usr/local/bin/nope", ["nope"], 0x55 /* 5 vars */) = -1 ENOENT (No such file or directory)
103 openat(3</opt/venv>, "lib/site.py", O_RDONLY|O_CLOEXEC) = 6</opt/venv/lib/site.py>
103 openat(AT_FDCWD</>, "/opt/a\\"b", O_RDONLY) = 7</opt/a\\"b>
103 openat(AT_FDCWD</>, "/.imagebuilder-start-mark", O_RDONLY|O_CLOEXEC) = -1 ENOENT (No such file or directory)
103 openat(AT_FDCWD</>, "/dev/null", O_RDWR) = 8</dev/null>
103 openat(AT_FDCWD</>, "/data/mounted", O_RDONLY) = 9</data/mounted>
103 <... openat resumed>) = 10</orphan>
103 +++ exited with 0 +++
"""


def test_the_trace_gives_reading_opens_and_execs_in_order() -> None:
    assert parse_trace(TRACE.splitlines()) == (
        Opened("/bin/sh", executed=True),
        Opened("/etc/ld.so.cache"),
        Opened("/usr/lib/x86_64-linux-gnu/libc.so.6"),  # -y's real file, not the symlink opened
        Opened("/usr/bin/cat", executed=True),  # resumed before the /proc open it interrupted
        Opened("/proc/101/maps"),
        Opened("/etc/x"),
        Opened("/etc/ld.so.cache"),
        Opened("/etc/y"),
        Opened("/opt/venv/lib/site.py"),  # relative to a directory fd: the decoded result says where
        Opened('/opt/a"b'),
        Opened(MARK),  # its open fails, as it should: where the start's first part ended
        Opened("/dev/null"),
        Opened("/data/mounted"),
    )


@pytest.mark.parametrize(("resolved", "directories", "excluded", "expected"), [
    ({}, (), (), ("/bin/sh", "/etc/ld.so.cache", "/etc/x", "/usr/bin/cat", "/data/m")),
    ({"/bin/sh": ["/usr/bin/dash", "/usr/lib/ld.so"]}, (), ("/data",),
     ("/usr/bin/dash", "/usr/lib/ld.so", "/etc/ld.so.cache", "/etc/x", "/usr/bin/cat")),
    ({"/usr/bin/cat": ["/usr/bin/cat", "/usr/lib/ld.so"]}, ("/etc/x",), ("/data/",),
     ("/bin/sh", "/etc/ld.so.cache", "/usr/bin/cat", "/usr/lib/ld.so")),
], ids=["as-opened", "exec-resolved", "directory-dropped"])
def test_the_profile_is_each_image_file_once_where_first_opened(resolved: dict[str, list[str]],
                                                                 directories: tuple[str, ...],
                                                                 excluded: tuple[str, ...],
                                                                 expected: tuple[str, ...]) -> None:
    opened = [Opened("/bin/sh", executed=True), Opened("/etc/ld.so.cache"), Opened("/proc/1/maps"), Opened("/etc/x"),
              Opened("/usr/bin/cat", executed=True), Opened("/etc/ld.so.cache"), Opened("/dev/null"),
              Opened("/sys/fs/cgroup/cpu.max"), Opened("/data/m"), Opened("/etc/x")]
    assert profile_files(opened, resolved, directories=directories, excluded=excluded) == expected


def test_interpreter_of_reads_pt_interp_and_shebangs() -> None:
    assert interpreter_of(b"#!/usr/bin/env python3\nprint()\n") == "/usr/bin/env"
    assert interpreter_of(b"#!\n") is None
    assert interpreter_of(b"plain text") is None
    assert interpreter_of(b"\x7fELF") is None  # cut short
    assert interpreter_of(b"\x7fELF\x02\x01" + bytes(50)) is None  # a 64-bit header cut short
    head = Path("/bin/sh").resolve().read_bytes()[:65536]
    expected = subprocess.run(["readelf", "-l", "/bin/sh"], capture_output=True, text=True).stdout if shutil.which(
        "readelf") else ""
    found = interpreter_of(head)
    assert found is not None and found.startswith("/lib") and "ld-linux" in found
    assert not expected or found in expected
    assert interpreter_of(Path(sys.executable).resolve().read_bytes()[:65536]) in (found, None)


@pytest.mark.docker
def test_a_real_start_profile_lists_what_the_start_read_in_order(docker_engine: DockerEngine, base_image: str) -> None:
    if shutil.which("strace") is None:
        _unavailable("strace is missing: .ci/setup --tests installs it")
    command = ["sh", "-c", "cat /etc/debian_version >/dev/null; head -c1 /usr/share/common-licenses/GPL-3 >/dev/null"]
    profile = start_profile(base_image, command, user="12345:12345", timeout=60)
    files = list(profile.files)
    assert profile.user == "12345:12345" and profile.command == tuple(command)
    # -y's paths are container paths, as /proc/PID/fd shows them from the host: the image's
    # merged-/usr paths, not the overlay's directory under /var/lib/docker.
    assert files[0] == "/usr/bin/dash", files[:3]
    assert any(path.startswith("/usr/lib/") and "/ld-linux" in path for path in files[:3]), files[:3]
    assert not any(path.startswith(("/var/lib/docker", "/proc", "/dev")) for path in files)
    assert files.index("/usr/bin/cat") < files.index("/etc/debian_version") < files.index("/usr/bin/head") \
        < files.index("/usr/share/common-licenses/GPL-3"), files
    assert "/usr/share/common-licenses/Apache-2.0" not in files
    # What it read of each, from the page cache (residency.py): head -c1 of GPL-3 brought its one
    # chunk in; every file the start opened was measured.
    gpl = profile.reads["/usr/share/common-licenses/GPL-3"]
    assert gpl[0] > 30_000 and gpl[1] == gpl[0], gpl
    assert set(profile.reads) == set(files) and profile.prefetched() == profile.files
    assert not any(path.endswith("/LC_MESSAGES") for path in files), "a directory opened without O_DIRECTORY"
    assert profile.to_json()["files"] == files
    with pytest.raises(StartFailed, match=r"exited with 3, .* It said: bad start$"):
        start_profile(base_image, ["sh", "-c", "echo bad start >&2; exit 3"], user="12345:12345", timeout=60)
    # Of this image only: CI's other session profiles its own images meanwhile.
    listed = subprocess.run(["docker", "ps", "-a", "--filter", "name=imagebuilder-profile-", "--format",
                             "{{.Names}} {{.Image}}"], capture_output=True, text=True, check=True).stdout
    left = [line for line in listed.splitlines() if line.split(" ", 1)[1:] == [base_image]]
    assert left == [], f"containers left behind: {left}"


def test_strace_flags_are_ones_this_strace_takes(tmp_path: Path) -> None:
    if shutil.which("strace") is None:
        _unavailable("strace is missing: .ci/setup --tests installs it")
    out = tmp_path / "trace"
    done = subprocess.run(["strace", *STRACE_FLAGS, "-o", str(out), "cat", "/etc/hostname"], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "/etc/hostname" in [entry.path for entry in parse_trace(out.read_text().splitlines())]


@pytest.mark.docker
def test_a_start_that_fails_at_once_is_said_before_the_image_is_read(docker_engine: DockerEngine, base_image: str,
                                                                      tmp_path: Path) -> None:
    """Issue 52: the profile runs beside the save of the image; its failure ends the save."""
    import time

    from imagebuilder.publish.estargz import EstargzPublisher

    if shutil.which("strace") is None:
        _unavailable("strace is missing: .ci/setup installs it")

    size = int(subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", base_image], capture_output=True,
                              text=True, check=True).stdout)

    class Slow:
        """The engine's own save, taking 120 s (the read of a large image): the failed start,
        seconds in, must end it long before."""

        finished = False

        def save_image(self, ref: str) -> Iterator[bytes]:
            for chunk in docker_engine.save_image(ref):
                time.sleep(len(chunk) * 120 / size)
                yield chunk
            Slow.finished = True

    publisher = EstargzPublisher(Slow(), registry=None, start=("sh", "-c", "echo no torch here >&2; exit 1"),  # type: ignore[arg-type]
                                 workdir=tmp_path, say=lambda line: None)
    started = time.monotonic()
    with pytest.raises(StartFailed, match=r"exited with 1, .* It said: no torch here$"):
        publisher.push(base_image, [], None)
    assert not Slow.finished and time.monotonic() - started < 90 and list(tmp_path.iterdir()) == []


def test_a_start_that_does_not_end_is_told_what_it_can_change() -> None:
    """Issue 52: the limit is fixed (600 s), so the line advises no timeout that no option sets."""
    from imagebuilder.estargz.profile import StartTimedOut

    said = str(StartTimedOut(ref="r:t", command="python -m server", timeout=600))
    assert "within 600 s" in said and "--start-command" in said and "longer timeout" not in said
