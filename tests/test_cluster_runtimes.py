"""Issue 42: the images run where multi-GPU training runs, not only under `docker run`.

The run contract: started with no ENTRYPOINT (pyxis's default, `apptainer exec`), as a uid and
gid no passwd file names, on a read-only root, with HOME empty, an image imports torch, runs
torch.compile (Inductor's C++ kernels, written to its cache) and a DDP step over gloo. Proved
here under Docker, rootless Podman, bubblewrap over a squashfuse-mounted squashfs of the image
(Apptainer's model), Slurm's srun (two tasks that all-reduce, their ranks derived as enroot's
pytorch hook derives them), and two containers on one network ("two nodes") under torchrun's
c10d rendezvous. The devel image's run of the contract is in test_workspace.py (its family's).
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster_runtimes import (ALLREDUCE, CONTRACT, IMAGE_CACHE, PROBE, HostUser, Slurm, assert_the_contract_held,
                              assert_the_contract_holds_under_docker, bwrap_argv, host_user,
                              missing_tools, one_node_slurm, probe_result, rootless_podman, run_container,
                              slurm_task_script, squashfs_mounted)
from support.unavailable import _unavailable

pytestmark = [pytest.mark.docker, pytest.mark.slow]

def test_the_runtime_image_keeps_the_run_contract_without_its_entrypoint(runtime_image):
    assert_the_contract_holds_under_docker(runtime_image["tags"][0])


def test_the_jupyter_image_keeps_the_run_contract_without_its_entrypoint(jupyter_image):
    assert_the_contract_holds_under_docker(jupyter_image["images"][-1]["tags"][0])


def test_the_jupyter_server_serves_under_the_contract(jupyter_image):
    """JupyterLab as pyxis or Apptainer would start it (the image's CMD, no entrypoint, another
    uid, a read-only root, HOME empty): it writes its runtime files under the home Python's
    start gave it, and answers with its token (and without it, 403)."""
    import json as json_
    import re
    import time
    import urllib.error
    import urllib.request

    ref = jupyter_image["images"][-1]["tags"][0]
    name = f"ib-contract-{uuid.uuid4().hex[:8]}"
    command = json_.loads(subprocess.run(["docker", "image", "inspect", "--format", "{{json .Config.Cmd}}", ref],
                                         capture_output=True, text=True, check=True, timeout=60).stdout)
    subprocess.run(["docker", "run", "--detach", "--name", name, *CONTRACT, "-p", "127.0.0.1::8888", ref, *command],
                   check=True, capture_output=True, timeout=120)
    try:
        port = subprocess.run(["docker", "port", name, "8888/tcp"], capture_output=True, text=True, check=True,
                              timeout=60).stdout.split(":")[-1].strip()
        token, logs, deadline = None, "", time.monotonic() + 120
        while token is None and time.monotonic() < deadline:
            logs = subprocess.run(["docker", "logs", name], capture_output=True, text=True, timeout=60).stderr
            match = re.search(r"token=([0-9a-f]{20,})", logs)
            token = match.group(1) if match else None
            time.sleep(1)
        assert token, logs[-3000:]
        assert "/tmp/home-12345/.local/share/jupyter/runtime" in logs, logs[-3000:]
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents", timeout=10)
        assert denied.value.code == 403
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents?token={token}", timeout=10) as ok:
            assert ok.status == 200
    finally:
        subprocess.run(["docker", "rm", "--force", name], capture_output=True, timeout=60)


def test_a_named_volume_at_the_inductor_cache_itself_is_the_images_users(runtime_image):
    """Docker seeds a new named volume from the folder it is mounted over; a folder the image
    lacks becomes a root-owned one the image's user cannot write (torch.compile failed so)."""
    volume = f"ib-contract-{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "volume", "create", volume], check=True, capture_output=True, timeout=60)
    try:
        done = run_container("-v", f"{volume}:{IMAGE_CACHE}/inductor", "-v", f"{PROBE}:/probe.py:ro",
                             runtime_image["tags"][0], "python", "/probe.py")
        (probe,) = probe_result(done)
        assert_the_contract_held(probe, uid=1000, cache_root=IMAGE_CACHE)
        owner = run_container("--entrypoint", "", "-v", f"{volume}:/cache", runtime_image["tags"][0],
                              "sh", "-c", "stat -c '%u %a' /cache && ls /cache")
        assert owner.stdout.splitlines()[0] == "1000 1777", owner.stdout
        assert len(owner.stdout.splitlines()) > 1, owner.stdout  # the compiled kernels are in the volume
    finally:
        subprocess.run(["docker", "volume", "rm", "--force", volume], capture_output=True, timeout=60)


# --- rootless Podman, squashfs + bubblewrap (Apptainer's model), Slurm ---------------------

@pytest.fixture(scope="module")
def cluster_user() -> Iterator[HostUser]:
    missing = missing_tools()
    if missing:
        _unavailable(f"these tests need Debian's {', '.join(missing)} (.ci/setup --tests installs them)")
    with host_user() as user:
        for script in (PROBE, ALLREDUCE):
            shutil.copy(script, user.home / script.name)
            (user.home / script.name).chmod(0o644)
        yield user


@pytest.fixture(scope="module")
def podman_image(cluster_user: HostUser, signed_publish: dict) -> Iterator[str]:
    """The published runtime image (zstd layers, from the session's registry) pulled by rootless
    Podman as a user would; Podman's storage is reset after the module."""
    ref = signed_publish["image"]["ref"]
    with rootless_podman(cluster_user):
        done = cluster_user.run(["podman", "pull", "--quiet", "--tls-verify=false", ref], timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        yield ref


@pytest.mark.registry  # the published image comes from the session's registry
def test_rootless_podman_runs_the_published_image_under_the_contract(cluster_user, podman_image):
    done = cluster_user.run(["podman", "run", "--rm", "--network", "none", *CONTRACT,
                             "-v", f"{cluster_user.home / PROBE.name}:/probe.py:ro", podman_image,
                             "python", "/probe.py"], timeout=600)
    (probe,) = probe_result(done)
    assert_the_contract_held(probe, uid=12345, cache_root="/tmp/home-12345/.cache/torch")
    # Round five: the user's folder at /workspace as the docs mount it. Rootless Podman maps the
    # image's user, and the `--user "$(id -u):$(id -g)"` Docker's advice gives, to subordinate
    # uids; --userns=keep-id alone still runs the image's USER: none can write it, and the
    # entrypoint says what does: both together.
    project = cluster_user.home / "project"
    assert cluster_user.run(["mkdir", "-p", str(project)]).returncode == 0

    def write(*flags: str) -> subprocess.CompletedProcess[str]:
        return cluster_user.run(["podman", "run", "--rm", "--network", "none", *flags, "-v", f"{project}:/workspace",
                                 podman_image, "sh", "-c", "touch /workspace/made && echo WROTE"], timeout=300)

    mine = ("--user", f"{cluster_user.uid}:{cluster_user.gid}")
    for flags, uid in (((), 1000), (mine, cluster_user.uid), (("--userns=keep-id",), 1000)):
        done = write(*flags)
        assert done.returncode != 0 and "WROTE" not in done.stdout, (flags, done.stdout, done.stderr[-2000:])
        assert (f"/workspace is not writable by uid {uid}: " in done.stderr
                and '--user "$(id -u):$(id -g)" (rootless Podman: with --userns=keep-id)' in done.stderr), done.stderr
    done = write("--userns=keep-id", *mine)
    assert done.returncode == 0 and "WROTE" in done.stdout, done.stderr[-2000:]
    assert "not writable" not in done.stderr and (project / "made").stat().st_uid == cluster_user.uid
    # The cluster's uid adds a package as docs/clusters.md says: pip install --target a folder it
    # can write, on PYTHONPATH (a wheel of our own: the container has no network).
    wheel = _wheel(cluster_user.home, "ibprobe", "VALUE = 'IBPROBE-OK'\n")
    script = ("pip install --no-index --target /tmp/pydeps /wheels/" + wheel.name
              + " && PYTHONPATH=/tmp/pydeps python -c 'import os, ibprobe; print(ibprobe.VALUE, os.getuid())'")
    done = cluster_user.run(["podman", "run", "--rm", "--network", "none", *CONTRACT, "-v", f"{wheel.parent}:/wheels:ro",
                             podman_image, "sh", "-c", script], timeout=300)
    assert done.returncode == 0 and "IBPROBE-OK 12345" in done.stdout, (done.stdout, done.stderr[-2000:])


def _wheel(folder: Path, name: str, module: str) -> Path:
    """A pure-Python wheel of one module, `{name}-1.0-py3-none-any.whl` in folder/wheels, its RECORD
    hashed as pip checks it."""
    import base64
    import hashlib
    import zipfile

    info = f"{name}-1.0.dist-info"
    files = {f"{name}.py": module.encode(),
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
                     f"{len(data)}\n" for path, data in files.items()) + f"{info}/RECORD,,\n"
    (folder / "wheels").mkdir(exist_ok=True)
    path = folder / "wheels" / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for member, data in (*files.items(), (f"{info}/RECORD", record.encode())):
            wheel.writestr(member, data)
    (folder / "wheels").chmod(0o755)
    path.chmod(0o644)
    return path


@pytest.fixture(scope="module")
def flattened(cluster_user: HostUser, signed_publish: dict) -> Iterator[tuple[Path, dict[str, str], str]]:
    """The published image's squashfs as `publish --squashfs` pushes it (publish's own hook, from
    the registry's blobs) and `imagebuilder squashfs` fetches it, mounted by squashfuse; yields
    the mount, the environment pyxis gives a task (its /etc/environment, enroot's) and the
    image's working folder."""
    import time

    from imagebuilder.publish.squashfs import SquashfsPublisher
    from imagebuilder.registry.client import HttpRegistry
    from imagebuilder.squashfs.fetch import fetch_squashfs

    ref = signed_publish["image"]["ref"]
    registry = HttpRegistry(config={})
    started = time.monotonic()
    made = SquashfsPublisher(registry, say=print, workdir=cluster_user.home).ensure(ref, "linux/amd64")
    assert made.created, made
    squashfs = cluster_user.home / "image.sqfs"
    fetched = fetch_squashfs(registry, ref, squashfs, say=print)
    image_bytes = sum(size for size, _ in registry.blobs(ref).values())
    print(f"SQUASHFS made in {made.seconds:.1f} s ({made.unpacked_bytes} bytes unpacked, {made.size} bytes, the "
          f"image's blobs {image_bytes} bytes), fetched in {fetched.seconds:.1f} s, "
          f"{time.monotonic() - started:.1f} s in all")
    config = registry.image_config(ref)
    assert config is not None
    try:
        with squashfs_mounted(squashfs) as root:
            env = dict(line.split("=", 1) for line in (root / "etc" / "environment").read_text().splitlines())
            assert list(env.items()) == [tuple(item.split("=", 1)) for item in config[0]["config"]["Env"]]
            yield root, env, str(config[0]["config"].get("WorkingDir") or "/")
    finally:
        squashfs.unlink(missing_ok=True)


@pytest.mark.registry  # the published image comes from the session's registry
def test_the_published_squashfs_imports_torch_as_the_image_s_user_with_its_env(cluster_user, flattened):
    """pyxis's view: the image's root read-only, the environment its /etc/environment holds, the
    image's own user (its passwd's uid), no entrypoint."""
    root, env, workdir = flattened
    user = next(line.split(":") for line in (root / "etc" / "passwd").read_text().splitlines()
                if line.split(":")[2] != "0" and line.split(":")[5].startswith("/home/"))
    argv = bwrap_argv(root, cluster_user.home, env, workdir)
    script = "import os, torch; print('TORCH', os.getuid(), torch.__version__, os.environ['PYTORCH_VERSION'])"
    done = cluster_user.run([*argv, "--uid", user[2], "--gid", user[3], "python", "-c", script])
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("TORCH ")]
    _, uid, version, pytorch = line.split()
    assert uid == user[2] and version.split("+")[0] == pytorch, line


@pytest.mark.registry  # the published image comes from the session's registry
def test_bubblewrap_over_the_squashfs_runs_the_contract_as_the_host_user(cluster_user, flattened):
    """Apptainer's model: the host's uid (one the image's passwd does not name), its home bound
    and kept as HOME, a read-only root, no entrypoint. The compile caches land in the host's
    home, where they outlive the job."""
    root, env, workdir = flattened
    home = cluster_user.home
    argv = bwrap_argv(root, home, {**env, "HOME": str(home), "USER": cluster_user.name}, workdir)
    done = cluster_user.run([*argv, "python", f"{home}/{PROBE.name}"])
    (probe,) = probe_result(done)
    assert probe["home"] == str(home), probe
    assert_the_contract_held(probe, uid=cluster_user.uid, cache_root=f"{home}/.cache/torch")
    assert any((home / ".cache" / "torch" / "inductor").rglob("*.so")), "the kernels are not in the host's home"


@pytest.fixture(scope="module")
def slurm(cluster_user: HostUser) -> Iterator[Slurm]:
    with one_node_slurm() as cluster:
        yield cluster


@pytest.mark.registry  # the published image comes from the session's registry
def test_srun_starts_two_tasks_of_the_image_that_all_reduce_with_ranks_from_slurm(cluster_user, flattened, slurm):
    """`srun -n 2`: each task is the image under bwrap, given RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR and MASTER_PORT as enroot's hook derives them, which it does only because the
    image's environment has PYTORCH_VERSION; both reach the same sum over gloo."""
    root, env, workdir = flattened
    assert env.get("PYTORCH_VERSION"), "enroot's hook would set no rank: the image lacks PYTORCH_VERSION"
    home = cluster_user.home
    task = home / "task.sh"
    task.write_text(slurm_task_script(bwrap_argv(root, home, {**env, "HOME": str(home)}, workdir), env))
    task.chmod(0o755)
    done = cluster_user.run(["srun", "-n", "2", "--time=5", str(task), "python", f"{home}/{ALLREDUCE.name}"],
                            env=slurm.env, timeout=300)
    results = sorted(probe_result(done, "ALLREDUCE "), key=lambda r: r["rank"])
    assert [(r["rank"], r["local_rank"], r["world"], r["sum"]) for r in results] == [(0, "0", 2, 3.0), (1, "1", 2, 3.0)]
    assert len({r["master"] for r in results}) == 1 and int(results[0]["master"].rsplit(":", 1)[1]) >= 49152


def test_two_containers_on_one_network_train_together_under_torchrun(runtime_image):
    """Two nodes: a container each on one Docker network, torchrun's c10d rendezvous at the
    first, one process per node; both all-reduce over gloo and see the same sum."""
    network, names = f"ib-nodes-{uuid.uuid4().hex[:8]}", [f"ib-node{i}-{uuid.uuid4().hex[:6]}" for i in (0, 1)]
    subprocess.run(["docker", "network", "create", network], check=True, capture_output=True, timeout=60)
    try:
        for name in names:
            subprocess.run(["docker", "run", "--detach", "--name", name, "--network", network,
                            "-v", f"{ALLREDUCE}:/allreduce.py:ro", runtime_image["tags"][0],
                            "torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                            "--rdzv-endpoint", f"{names[0]}:29400", "--rdzv-id", network, "/allreduce.py"],
                           check=True, capture_output=True, timeout=120)
        exits = [subprocess.run(["docker", "wait", name], capture_output=True, text=True, timeout=300).stdout.strip()
                 for name in names]
        logs = [subprocess.run(["docker", "logs", name], capture_output=True, text=True, timeout=60) for name in names]
        assert exits == ["0", "0"], [log.stderr[-2000:] for log in logs]
        results = sorted((r for log in logs for r in probe_result(log, "ALLREDUCE ")), key=lambda r: r["rank"])
        assert [(r["rank"], r["world"], r["sum"]) for r in results] == [(0, 2, 3.0), (1, 2, 3.0)]
    finally:
        subprocess.run(["docker", "rm", "--force", *names], capture_output=True, timeout=60)
        subprocess.run(["docker", "network", "rm", network], capture_output=True, timeout=60)
