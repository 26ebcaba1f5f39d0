"""Images people work in: Jupyter over devel, /workspace, SSH with keys, the entrypoint
(signals, exit codes, any uid, the /dev/shm warning).

The real-engine tests share two images per session: conftest's devel image (torch 2.13,
CUDA 13.0 on the Debian base; its only users are here, so that its family, conftest's
IMAGE_FAMILIES, runs back to back) and a devel-jupyter image built FROM it. verify's devel
check runs here too. Containers are started with the docker CLI, as a user starts them, each under a timeout
and removed afterwards.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from support.real_images import DEVEL_CUDA, DEVEL_TORCH, E2E_OS, ca_bundle_args, imagebuilder
from imagebuilder.build.image_contents import ENTRYPOINT
from imagebuilder.build.per_platform import render_spec as render
from imagebuilder.build.render_options import RenderOptions
from imagebuilder.matrix.load import load_matrix
from imagebuilder.matrix.model import JUPYTER_PARENTS, VARIANTS
from imagebuilder.matrix.resolve import Request, resolve
from smoke_tests.shm import NCCL_SHM_MIN_BYTES, shm_bytes, shm_too_small

HERE = Path(__file__).parent
M = load_matrix(HERE / "data" / "matrix-small.yaml")
SSH_OPTIONS = ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
               "-o", "IdentitiesOnly=yes", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR"]


# --- fast: rendering and planning ----------------------------------------------------------


def test_devel_jupyter_is_built_from_its_devel_image_and_tagged_beside_jupyter():
    devel = render(resolve(M, Request("2.12", "13.0", variant="devel", os="debian12")), M)
    image = render(resolve(M, Request("2.12", "13.0", variant="devel-jupyter", os="debian12")), M)
    assert image.depends_on == devel.ref == image.base_image
    assert image.tags[0] == devel.tags[0].removesuffix("-devel") + "-devel-jupyter"
    assert f"ARG BASE_IMAGE={devel.ref}" in image.dockerfile
    assert "--ServerApp.root_dir=/workspace" in image.dockerfile
    for package in ("jupyterlab", "pandas", "matplotlib", "tqdm", "ipywidgets"):
        assert f"{package}==" in image.dockerfile and any(r.startswith(f"{package}==") and r in image.dockerfile
                                                          for r in M.tools.notebook_for(image.spec.python))
    # Pinned, and constrained to what the devel venv holds: torch and numpy stay as they are.
    assert "--constraint /tmp/constraints.txt" in image.dockerfile
    runtime_jupyter = render(resolve(M, Request("2.12", "13.0", variant="jupyter", os="debian12")), M)
    assert runtime_jupyter.base_image.endswith("-runtime")


def test_variant_all_and_the_matrix_include_devel_jupyter():
    from click.testing import CliRunner

    from imagebuilder.build.per_platform import Reading, each_platform
    from imagebuilder.cli import cli
    from imagebuilder.matrix.selection import ALL, Selection

    assert JUPYTER_PARENTS == {"jupyter": "runtime", "devel-jupyter": "devel"}
    # What `build --variant all` builds, parents before the jupyter images made FROM them.
    (each,) = each_platform(M, Selection("2.12", "13.0", variant=ALL, os="debian12"), RenderOptions(), ["linux/amd64"],
                            Reading(request=True), read_os_release=None, note=print, host="linux/amd64")
    planned = each.images
    assert [image.spec.variant for image in planned] == ["runtime", "devel", "jupyter", "devel-jupyter"]
    out = CliRunner().invoke(cli, ["--matrix", str(HERE / "data" / "matrix-small.yaml"), "matrix", "--torch", "2.12",
                                   "--cuda", "13.0", "--os", "debian12", "--format", "json"])
    assert out.exit_code == 0, out.output
    rows = {r["variant"]: r["tag"] for r in json.loads(out.output)}
    assert rows["devel-jupyter"] == rows["devel"] + "-jupyter"


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_works_in_workspace_under_tini(variant):
    text = render(resolve(M, Request("2.6", "12.4", variant=variant)), M).dockerfile
    assert "WORKDIR /workspace" in text
    if variant in JUPYTER_PARENTS:
        return  # the parent's entrypoint and /workspace carry over
    assert f"ENTRYPOINT {json.dumps(list(ENTRYPOINT))}" in text
    assert "install -d -o 1000 -g 0 -m 775 /workspace" in text
    assert ("openssh-server" in text) == (variant == "devel")
    assert ("rm -f /etc/ssh/ssh_host_*" in text) == (variant == "devel")  # never baked in


def test_the_entrypoint_carries_the_shm_floor_of_the_nccl_check():
    image = render(resolve(M, Request("2.6", "12.4")), M)
    script = image.files["rootfs/usr/local/bin/imagebuilder-entrypoint"].decode()
    assert script.startswith("#!/bin/sh\n") and f"-lt {NCCL_SHM_MIN_BYTES} ]" in script
    assert "rootfs/usr/local/bin/ssh-server" not in image.files  # runtime images have no sshd


@pytest.mark.parametrize("gpus, size, small", [
    (0, 64 << 20, False), (1, 64 << 20, False), (2, 64 << 20, True), (8, 512 << 20, True), (2, 1 << 30, False),
])
def test_shm_too_small(gpus, size, small):
    assert shm_too_small(gpus, size) is small


def test_shm_bytes_reads_the_file_system_and_is_zero_without_one(tmp_path):
    assert shm_bytes("/dev/shm") > 0 if Path("/dev/shm").is_dir() else True
    assert shm_bytes(str(tmp_path / "missing")) == 0


def test_the_rendered_entrypoint_is_executable_in_the_build_context(tmp_path):
    image = render(resolve(M, Request("2.12", "13.0", variant="devel", os="debian12")), M)
    image.write(tmp_path / "ctx")
    for name in ("imagebuilder-entrypoint", "ssh-server"):
        assert os.access(tmp_path / "ctx" / "rootfs" / "usr" / "local" / "bin" / name, os.X_OK)
    assert not os.access(tmp_path / "ctx" / "imagebuilder.pth", os.X_OK)


# --- real engine ----------------------------------------------------------------------------

def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, f"docker {' '.join(args)}: {done.stderr[-2000:]}"
    return done


@contextmanager
def container(*args: str) -> Iterator[str]:
    """A detached container, removed afterwards whatever happens."""
    name = f"imagebuilder-test-ws-{uuid.uuid4().hex[:10]}"
    docker("run", "-d", "--name", name, *args)
    try:
        yield name
    finally:
        docker("rm", "-f", name, check=False)


def host_port(name: str, port: int) -> int:
    return int(docker("port", name, str(port)).stdout.split()[0].rsplit(":", 1)[1])


def wait_for_log(name: str, pattern: str, timeout: float = 120) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while True:
        done = docker("logs", name)
        logs = done.stdout + done.stderr
        match = re.search(pattern, logs)
        if match:
            return match
        assert time.monotonic() < deadline, f"no {pattern!r} in the log:\n{logs[-3000:]}"
        time.sleep(1)


@pytest.fixture(scope="session")
def devel_jupyter_image(docker_engine, base_image, devel_image, tmp_path_factory) -> str:
    """devel-jupyter FROM the session's devel image (same repository: the CLI finds it and
    builds only JupyterLab's layer). conftest's devel fixture removes both."""
    report = tmp_path_factory.mktemp("devel-jupyter") / "report.json"
    done = imagebuilder("build", "--torch", DEVEL_TORCH, "--cuda", DEVEL_CUDA, "--os", E2E_OS,
                        "--variant", "devel-jupyter", "--builder", "auto", "--base-image", base_image,
                        "--repository", devel_image["repository"], *ca_bundle_args(), "--report", str(report))
    assert done.returncode == 0, f"build failed:\n{done.stderr[-4000:]}"
    images = json.loads(report.read_text())["images"]
    assert [i["spec"]["variant"] for i in images] == ["devel-jupyter"]  # the devel image was not rebuilt
    assert images[0]["spec"]["base_image"] == devel_image["tags"][0]
    return images[0]["tags"][0]


@pytest.mark.docker
@pytest.mark.slow
def test_devel_jupyter_serves_workspace_with_a_token(devel_jupyter_image, tmp_path):
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "notes.txt").write_text("hello from the host\n")
    folder.chmod(0o755)  # the server runs as uid 1000
    with container("-p", "127.0.0.1::8888", "-v", f"{folder}:/workspace", devel_jupyter_image) as name:
        token = wait_for_log(name, r"token=([0-9a-f]{20,})").group(1)
        base = f"http://127.0.0.1:{host_port(name, 8888)}"
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(f"{base}/api/contents", timeout=10)
        assert denied.value.code == 403
        with urllib.request.urlopen(f"{base}/api/contents/notes.txt?token={token}", timeout=10) as ok:
            assert ok.status == 200
            assert json.loads(ok.read())["content"] == "hello from the host\n"
        probe = docker("exec", name, "python", "-c",
                       "import os, torch, pandas, matplotlib, tqdm, ipywidgets, jupyterlab;"
                       "print(os.getuid(), os.getcwd(), torch.__version__)").stdout.split()
        assert probe[:2] == ["1000", "/workspace"] and probe[2].startswith(f"{DEVEL_TORCH}.")


@pytest.fixture(scope="session")
def ssh_key(tmp_path_factory) -> Path:
    if shutil.which("ssh") is None:
        pytest.fail("no ssh client: apt-get install openssh-client (.ci/setup --tests does)")
    key = tmp_path_factory.mktemp("ssh") / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=30)
    return key


def ssh(port: int, user: str, key: Path | None, *command: str, options: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    identity = ["-i", str(key)] if key else []
    return subprocess.run(["ssh", *SSH_OPTIONS, *options, *identity, "-p", str(port), f"{user}@127.0.0.1", *command],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.docker
@pytest.mark.slow
def test_ssh_takes_the_key_and_refuses_passwords_and_root(devel_image, ssh_key):
    image = devel_image["tags"][0]
    public = ssh_key.with_suffix(".pub").read_text()
    with container("-p", "127.0.0.1::22", "-e", f"SSH_AUTHORIZED_KEYS={public}", "-e", "PROJECT=demo",
                   image, "ssh-server") as name:
        wait_for_log(name, r"Server listening on 0\.0\.0\.0 port 22")
        port = host_port(name, 22)
        logged_in = ssh(port, "torch", ssh_key, "id -un; pwd; echo $PROJECT;"
                        " python -c 'import torch; print(torch.__version__)'")
        assert logged_in.returncode == 0, logged_in.stderr
        user, _, project, version = logged_in.stdout.split()
        # The container's environment (the venv on PATH, what -e gave) reaches the session.
        assert (user, project) == ("torch", "demo") and version.startswith(f"{DEVEL_TORCH}.")
        as_root = ssh(port, "root", ssh_key, "true")
        assert as_root.returncode == 255 and "Permission denied" in as_root.stderr
        password = ssh(port, "torch", None, "true", options=("-o", "PreferredAuthentications=password,keyboard-interactive",
                                                             "-o", "PubkeyAuthentication=no"))
        # The server offers public keys only: a password is never even asked for.
        assert password.returncode == 255 and "Permission denied (publickey)" in password.stderr
        first_key = subprocess.run(["ssh-keyscan", "-t", "ed25519", "-p", str(port), "127.0.0.1"],
                                   capture_output=True, text=True, timeout=30).stdout.split()[-1]
    with container("-p", "127.0.0.1::22", "-e", f"SSH_AUTHORIZED_KEYS={public}", image, "ssh-server") as name:
        wait_for_log(name, r"Server listening on 0\.0\.0\.0 port 22")
        second_key = subprocess.run(["ssh-keyscan", "-t", "ed25519", "-p", str(host_port(name, 22)), "127.0.0.1"],
                                    capture_output=True, text=True, timeout=30).stdout.split()[-1]
    assert first_key.startswith("AAAA") and second_key.startswith("AAAA") and first_key != second_key
    assert docker("run", "--rm", image, "sh", "-c", "ls /etc/ssh/ssh_host_* 2>/dev/null | wc -l").stdout.strip() == "0"


@pytest.mark.docker
@pytest.mark.slow
def test_ssh_without_a_key_and_root_password_get_one_line_each(devel_image):
    image = devel_image["tags"][0]
    no_key = docker("run", "--rm", image, "ssh-server", check=False)
    assert no_key.returncode == 2 and "no public key" in no_key.stderr and "SSH_AUTHORIZED_KEYS" in no_key.stderr
    guide = docker("run", "--rm", "-e", "ROOT_PASSWORD=secret", image, "true", check=False)
    lines = [line for line in guide.stderr.splitlines() if "ROOT_PASSWORD" in line]
    assert guide.returncode == 0 and len(lines) == 1 and "SSH_AUTHORIZED_KEYS" in lines[0]


FAKE_GPUS = ["--device", "/dev/null:/dev/nvidia0", "--device", "/dev/null:/dev/nvidia1"]


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("args, warned", [
    (["--shm-size", "64m", *FAKE_GPUS], True),
    (["--shm-size", "64m", *FAKE_GPUS, "-e", "CUDA_VISIBLE_DEVICES=1"], False),
    (["--shm-size", "64m", FAKE_GPUS[0], FAKE_GPUS[1]], False),
    (["--shm-size", "1g", *FAKE_GPUS], False),
])
def test_small_shm_with_several_gpus_is_warned_about(devel_image, args, warned):
    """Two device nodes named like the NVIDIA runtime's stand in for GPUs on a CPU host."""
    done = docker("run", "--rm", *args, devel_image["tags"][0], "true")
    warnings = [line for line in done.stderr.splitlines() if "/dev/shm" in line]
    if warned:
        assert len(warnings) == 1, done.stderr
        assert "2 GPUs" in warnings[0] and "64 MiB" in warnings[0]
        assert "--shm-size" in warnings[0] and "--ipc=host" in warnings[0]
    else:
        assert warnings == [], done.stderr


@pytest.mark.docker
@pytest.mark.slow
def test_exit_codes_pass_through_and_signals_stop_the_command(devel_image):
    image = devel_image["tags"][0]
    assert docker("run", "--rm", image, "sh", "-c", "exit 3", check=False).returncode == 3
    sleeper = ["python", "-c", "import time; print('ready', flush=True); time.sleep(600)"]
    # Ctrl-C on an attached `docker run`: the CLI forwards SIGINT, tini hands it to Python.
    name = f"imagebuilder-test-ws-{uuid.uuid4().hex[:10]}"
    attached = subprocess.Popen(["docker", "run", "--rm", "--name", name, image, *sleeper],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert attached.stdout is not None and attached.stdout.readline().strip() == "ready"
        started = time.monotonic()
        attached.send_signal(signal.SIGINT)
        assert attached.wait(timeout=30) == 130
        assert time.monotonic() - started < 10
    finally:
        attached.kill()
        docker("rm", "-f", name, check=False)
    # docker stop sends SIGTERM: without tini, Python as PID 1 would ignore it for 30 s.
    with container(image, *sleeper) as name:
        wait_for_log(name, "ready")
        started = time.monotonic()
        docker("stop", "-t", "30", name, timeout=60)
        assert time.monotonic() - started < 10
        assert docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip() == "143"


COMPILE = """
import getpass, os, torch
f = torch.compile(lambda x: torch.sin(x) + x * 2)
x = torch.randn(64)
assert torch.allclose(f(x), torch.sin(x) + x * 2)
open("/workspace/written", "w").close()
print("compiled", os.getuid(), getpass.getuser(), os.environ["HOME"])
"""


@pytest.mark.docker
@pytest.mark.slow
def test_an_arbitrary_uid_compiles_with_torch(devel_image):
    """OpenShift and `docker run --user 12345`: a uid with no passwd entry and gid 0."""
    done = docker("run", "--rm", "--user", "12345", devel_image["tags"][0], "python", "-c", COMPILE,
                  timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-4:] == ["compiled", "12345", "uid12345", "/tmp/home-12345"]


@pytest.mark.docker
@pytest.mark.slow
def test_the_devel_image_keeps_the_run_contract_without_its_entrypoint(devel_image):
    """Issue 42 (test_cluster_runtimes.py has the other images and runtimes): no entrypoint, a uid
    no passwd names, a read-only root, HOME empty: torch.compile and a DDP step all the same."""
    from cluster_runtimes import assert_the_contract_holds_under_docker

    assert_the_contract_holds_under_docker(devel_image["tags"][0])


# --- verify on the devel image (moved from test_e2e: the devel image's users run together) ---


@pytest.mark.docker
@pytest.mark.slow
def test_verify_proves_the_devel_image_compiles_a_cuda_extension(docker_engine, devel_image, devel_verdict):
    """verify runs the devel check in a devel image: nvcc of the image's CUDA at CUDA_HOME, and
    a CUDA extension built and loaded against torch, without a GPU (conftest's devel_verdict:
    `imagebuilder verify IMAGE --allow-no-gpu --json`, run once for the session)."""
    assert devel_verdict["ok"] is True and devel_verdict["target"].endswith(devel_image["tags"][0])
    checks = {c["name"]: c for c in devel_verdict["checks"]}
    devel = checks["devel"]
    assert devel["status"] == "pass", devel
    assert devel["measurements"]["nvcc"] == devel["measurements"]["expected_cuda"] == "13.0"
    assert devel["measurements"]["cuda_home"].endswith("/nvidia/cu13")
    # The toolkit label names the update of the nvcc verify just ran (issue 45, part 7).
    labels = docker_engine.image_labels(devel_image["tags"][0])
    assert labels["io.imagebuilder.cuda.toolkit"] == "13.0.2"
    assert labels["io.imagebuilder.cuda.toolkit"].startswith(devel["measurements"]["nvcc"] + ".")
    assert labels["io.imagebuilder.cuda.runtime"] == "13.0.96"
    assert "jupyter" not in checks


@pytest.mark.docker
@pytest.mark.slow
def test_verify_fails_a_devel_image_without_nvcc(docker_engine, devel_image, image_repo, tmp_path):
    """A devel image without nvcc (a CUDA 12 devel on a base without NVIDIA's devel layers)
    fails the devel check that verify, and so publish, runs."""
    from imagebuilder.engine.api import BuildRequest
    from imagebuilder.engine.classic import ClassicBuilder
    from imagebuilder.verify.output import parse_output

    context = tmp_path / "no-nvcc"
    context.mkdir()
    (context / "Dockerfile").write_text(f'FROM {devel_image["tags"][0]}\nRUN rm "$CUDA_HOME/bin/nvcc"\n')
    ref = f"{image_repo}:no-nvcc"
    ClassicBuilder(docker_engine).build(BuildRequest(context=context, tags=(ref,), timeout=300))
    result = docker_engine.run(ref, ["python", "-m", "smoke_tests", "--json", "--checks", "devel", "--allow-no-gpu"],
                               timeout=300)
    (devel,) = parse_output(result.output, result.exit_code).checks
    assert result.exit_code == 1 and devel.status == "fail"
    assert "has no bin/nvcc" in devel.reason and "a devel image must compile CUDA code" in devel.reason
