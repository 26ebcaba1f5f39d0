"""The first-install paths of .ci/ that only a new machine takes, for real, where this machine
(installed long ago) would never take them (issue 52):

- docker-install.sh and cosign-install.sh on a new Debian 12, and cosign-install.sh on a new
  Debian 13: in a throwaway container of the local base (its own apt, through this site's
  proxy), so the host's Docker and cosign are never touched. The install only: dockerd is not
  started there (a policy-rc.d forbids the package's service, as in Debian's containers).
- podman5-image.sh's make of a missing tool image on the local Debian 13 base (a small package
  for Podman: the make, the CA and the label are what is checked; Podman itself is used by
  test_podman5_partial.py), then its second run that only reads the label.
- base-image.sh and arm64-base.sh's make of a missing image, under this test's own repository:
  their debootstrap is a stand-in on PATH that unpacks the local base's own rootfs (a real
  debootstrap is 1-2.5 min and runs on every fresh machine's `.ci/setup`, measured in
  docs/development.md); everything after it (the import, the multi-platform build, apt and
  `uname -m` inside the image) is real. And base-image.sh's wait for an engine that is not there.

qemu.sh's registration is not run: binfmt_misc is the kernel's, shared with the host (and every
helper's arm64 builds), not a container's.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support.unavailable import _unavailable

CI = Path(__file__).resolve().parent.parent / ".ci"
pytestmark = [pytest.mark.docker, pytest.mark.network, pytest.mark.slow]


def _in_container(image: str, script: str, timeout: int) -> subprocess.CompletedProcess[str]:
    """SCRIPT run by bash as root in a throwaway container of IMAGE, with .ci/ at /ci (read-only)."""
    return subprocess.run(["docker", "run", "--rm", "-v", f"{CI}:/ci:ro", image, "bash", "-euo", "pipefail", "-c",
                           script], capture_output=True, text=True, timeout=timeout)


NO_SERVICES = "printf '#!/bin/sh\\nexit 101\\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d\n"


@pytest.mark.beside_builds
def test_docker_and_cosign_install_on_a_new_debian_12_move_only_their_packages(base_image):
    """docker-install.sh then cosign-install.sh, as a new Debian 12 runs them: Debian 13's
    packages, pinned (libc6 and runc stay Debian 12's), the containerd store configured, then a
    second run of each finds them. About 1-2 minutes (apt downloads ~80 MB)."""
    done = _in_container(base_image, NO_SERVICES + """
libc_before=$(dpkg-query -W -f='${Version}' libc6)
bash /ci/docker-install.sh
bash /ci/cosign-install.sh
echo "libc6 $libc_before -> $(dpkg-query -W -f='${Version}' libc6)"
echo "runc $(dpkg-query -W -f='${Version}' runc)"
echo "daemon.json $(cat /etc/docker/daemon.json)"
cosign version 2>&1 | grep -m1 GitVersion
bash /ci/docker-install.sh
bash /ci/cosign-install.sh
""", timeout=900)
    out = done.stdout
    assert done.returncode == 0, f"{out[-3000:]}\n{done.stderr[-3000:]}"
    assert "Debian 12: docker.io docker-cli docker-buildx containerd from Debian 13's suite" in out
    dockerd = next(line for line in out.splitlines() if line.startswith("docker-install: installed: Docker version"))
    assert int(dockerd.split("Docker version ")[1].split(".")[0]) >= 26, dockerd
    assert "cosign-install: installed: cosign 2." in out
    libc = next(line for line in out.splitlines() if line.startswith("libc6 "))
    before, after = libc.split()[1], libc.split()[3]
    assert before == after and before.startswith("2.36"), libc  # bookworm's glibc, unmoved
    assert next(line for line in out.splitlines() if line.startswith("runc ")).startswith("runc 1.1."), out
    assert 'daemon.json {"features": {"containerd-snapshotter": true}}' in out
    assert out.count("already installed") == 2, out  # both second runs only checked


@pytest.mark.beside_builds
def test_cosign_install_on_a_new_debian_13_takes_its_own_package(docker_engine):
    """trixie-packages.sh's Debian 13 branch (no pin, no extra source), through cosign-install.sh
    in a throwaway container of imagebuilder-base:trixie (.ci/setup --tests makes it). ~30-60 s."""
    trixie = "imagebuilder-base:trixie"
    if not docker_engine.image_exists(trixie):
        _unavailable(f"{trixie} is missing: .ci/setup --tests makes it")
    done = _in_container(trixie, """
bash /ci/cosign-install.sh
ls /etc/apt/sources.list.d/ /etc/apt/preferences.d/
""", timeout=600)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "Debian 13: installing its own cosign" in done.stdout
    assert "cosign-install: installed: cosign 2." in done.stdout
    assert "imagebuilder-trixie" not in done.stdout  # no pinned source where the suite is trixie itself


def _stand_in_debootstrap(folder: Path, image: str, platform: str) -> dict[str, str]:
    """A `debootstrap` first on PATH that unpacks IMAGE's rootfs (PLATFORM's variant) into the
    target it is given, and logs its arguments: the environment to run a script with."""
    folder.mkdir()
    log = folder / "calls"
    (folder / "debootstrap").write_text(f"""#!/bin/bash
set -euo pipefail
echo "$*" >>{log}
target="${{@: -1}}"
mkdir -p "$target"
id=$(docker create --platform {platform} {image} true)
trap 'docker rm "$id" >/dev/null' EXIT
docker export "$id" | tar -C "$target" -x
""")
    (folder / "debootstrap").chmod(0o755)
    return {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"}


def _script(name: str, *args: str, env: dict[str, str], timeout: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(CI / name), *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.beside_builds
def test_base_image_sh_makes_a_missing_base_then_finds_it(base_image, image_repo, tmp_path):
    """The import of a fresh rootfs, its clean-up, apt inside the new image; then a second run
    does nothing. ~15-30 s (apt-get update in the image)."""
    env = _stand_in_debootstrap(tmp_path / "bin", base_image, "linux/amd64")
    image = f"{image_repo}:bookworm"
    first = _script("base-image.sh", image, "bookworm", env=env, timeout=600)
    assert first.returncode == 0, f"{first.stdout[-3000:]}\n{first.stderr[-3000:]}"
    assert (tmp_path / "bin" / "calls").read_text().startswith("--variant=minbase bookworm /tmp/base-image.")
    assert f"{image} ready" in first.stdout
    lists = subprocess.run(["docker", "run", "--rm", image, "sh", "-c", "ls /var/lib/apt/lists | wc -l; echo $LANG"],
                           capture_output=True, text=True, timeout=120)
    assert lists.stdout.split() == ["0", "C.UTF-8"], lists  # apt's lists left out, the env set
    again = _script("base-image.sh", image, "bookworm", env=env, timeout=60)
    assert f"{image} already exists" in again.stdout and "debootstrap" not in again.stdout


@pytest.mark.beside_builds
def test_base_image_sh_waits_for_an_engine_then_gives_up_leaving_nothing(base_image, tmp_path):
    """.ci/setup runs base-image.sh beside the engine's install: with no engine yet it debootstraps,
    waits BASE_IMAGE_WAIT_S, and stops at once when BASE_IMAGE_GIVE_UP_IF appears."""
    env = _stand_in_debootstrap(tmp_path / "bin", base_image, "linux/amd64")
    before = set(Path("/tmp").glob("base-image.*"))
    nowhere = {**env, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    # The stand-in reaches the real engine (its own DOCKER_HOST); the script's docker calls do not.
    (tmp_path / "bin" / "debootstrap").write_text((tmp_path / "bin" / "debootstrap").read_text().replace(
        "set -euo pipefail\n", "set -euo pipefail\nunset DOCKER_HOST\n"))
    waited = _script("base-image.sh", "imagebuilder-test/never:made", env={**nowhere, "BASE_IMAGE_WAIT_S": "3"},
                     timeout=300)
    assert waited.returncode == 1 and "no Docker Engine answers (waited 3s)" in waited.stderr, waited
    assert "waiting for the Docker Engine to answer (0s)" in waited.stdout
    flag = tmp_path / "docker.failed"
    flag.touch()
    gave_up = _script("base-image.sh", "imagebuilder-test/never:made",
                      env={**nowhere, "BASE_IMAGE_WAIT_S": "600", "BASE_IMAGE_GIVE_UP_IF": str(flag)}, timeout=300)
    assert gave_up.returncode == 1 and "no Docker Engine answers (waited 0s)" in gave_up.stderr, gave_up
    assert set(Path("/tmp").glob("base-image.*")) == before  # the rootfs removed, its log too


def test_arm64_base_sh_makes_a_multi_platform_base_from_a_fresh_rootfs(base_image, image_repo, tmp_path):
    """arm64-base.sh's make of a missing base: the rootfs in through BuildKit as linux/arm64,
    joined with the native base as linux/amd64, both run (arm64 under QEMU). ~40 s here, 150 s
    on a host loaded 20-fold."""
    arm64 = "imagebuilder-base:bookworm-arm64"
    if not Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists():
        _unavailable("qemu-aarch64 is not registered: .ci/setup --tests registers it (.ci/qemu.sh)")
    if subprocess.run(["docker", "image", "inspect", arm64], capture_output=True, timeout=60).returncode != 0:
        _unavailable(f"{arm64} is missing: .ci/setup --tests makes it")
    env = _stand_in_debootstrap(tmp_path / "bin", arm64, "linux/arm64")
    image = f"{image_repo}:bookworm-arm64"
    first = _script("arm64-base.sh", image, "bookworm", base_image, env=env, timeout=600)
    assert first.returncode == 0, f"{first.stdout[-3000:]}\n{first.stderr[-3000:]}"
    assert (tmp_path / "bin" / "calls").read_text().startswith("--arch=arm64 --variant=minbase bookworm ")
    # "ready" comes after the script's own runs of `uname -m` on each platform (aarch64, x86_64).
    assert "checking that the image runs under QEMU" in first.stdout and f"{image} ready" in first.stdout
    again = _script("arm64-base.sh", image, "bookworm", base_image, env=env, timeout=60)
    assert f"{image} already exists" in again.stdout


@pytest.mark.beside_builds
def test_podman5_image_sh_makes_a_missing_tool_image_then_finds_it(docker_engine, image_repo, tmp_path):
    """podman5-image.sh's make of a missing image (a fresh machine's path), under this test's own
    repository, on imagebuilder-base:trixie with its apt through this site's proxy: a small
    package for podman (PODMAN5_PACKAGES: the make is what is checked here; the real image's
    Podman pulls in tests/test_podman5_partial.py), the CA as SSL_CERT_FILE; a second run only
    reads the image's label. ~15 s."""
    trixie = "imagebuilder-base:trixie"
    if not docker_engine.image_exists(trixie):
        _unavailable(f"{trixie} is missing: .ci/setup --tests makes it")
    ca = tmp_path / "ca-bundle.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\nnot checked by the script\n-----END CERTIFICATE-----\n")
    image = f"{image_repo}:podman5"
    env = {**os.environ, "PODMAN5_PACKAGES": "hello"}
    first = _script("podman5-image.sh", image, trixie, str(ca), env=env, timeout=600)
    assert first.returncode == 0, f"{first.stdout[-3000:]}\n{first.stderr[-3000:]}"
    assert first.stdout.splitlines() == [f"podman5-image: making {image} from {trixie}: hello (Debian's packages, ~1 min)",
                                         f"podman5-image: {image} ready: no podman"], first.stdout
    inside = subprocess.run(["docker", "run", "--rm", image, "sh", "-c", 'hello; cat "$SSL_CERT_FILE"'],
                            capture_output=True, text=True, timeout=120)
    assert inside.stdout == "Hello, world!\n" + ca.read_text(), inside
    again = _script("podman5-image.sh", image, trixie, str(ca), env=env, timeout=60)
    assert again.stdout == f"podman5-image: {image} already made by this script; nothing to do\n", again
