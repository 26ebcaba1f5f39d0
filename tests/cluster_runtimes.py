"""The runtimes multi-GPU training starts images with, for real on this host (all Debian packages):

- rootless Podman, run by a non-root host user;
- the image's root as a squashfs, the one `publish --squashfs` pushes beside it (every file
  root's, enroot's configuration files in it; docs/clusters-squashfs.md), mounted by
  `squashfuse` and run by `bubblewrap` as the host user with the host's home bound and the
  image's environment: Apptainer's model (`apptainer exec`: a read-only root, the host's uid,
  no ENTRYPOINT);
- a one-node Slurm (slurmctld, slurmd and a munged of its own) whose `srun` starts tasks of
  that root, with the variables enroot's pytorch hook derives from Slurm's (RANK, LOCAL_RANK,
  WORLD_SIZE, MASTER_ADDR, MASTER_PORT), in an image whose environment has PYTORCH_VERSION only,
  as that hook does.

Everything made here (the user, Podman's storage, the squashfs, its mount, the daemons and their
files) is removed on the way out, whatever happened.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

TOOLS = {"podman": "podman", "bwrap": "bubblewrap", "squashfuse": "squashfuse", "mksquashfs": "squashfs-tools",
         "srun": "slurm-wlm", "slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "munged": "munge",
         "newuidmap": "uidmap", "fusermount3": "fuse3"}


DATA = Path(__file__).parent / "data"
PROBE, ALLREDUCE = DATA / "contract_probe.py", DATA / "allreduce_probe.py"
# What pyxis and Apptainer give an image: no entrypoint, another uid, a read-only root, no HOME.
CONTRACT = ("--entrypoint", "", "--user", "12345:12345", "--read-only", "--tmpfs", "/tmp:rw,exec", "-e", "HOME=")
IMAGE_CACHE = "/home/torch/.cache/torch"


def run_container(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`docker run` of args under a name of its own, removed afterwards whatever happened."""
    name = f"ib-contract-{uuid.uuid4().hex[:8]}"
    try:
        return subprocess.run(["docker", "run", "--name", name, *args], capture_output=True, text=True,
                              timeout=timeout)
    finally:
        subprocess.run(["docker", "rm", "--force", name], capture_output=True, timeout=60)


def probe_result(done: subprocess.CompletedProcess[str], prefix: str = "PROBE ") -> list[dict]:
    results = [json.loads(line[len(prefix):]) for line in done.stdout.splitlines() if line.startswith(prefix)]
    assert done.returncode == 0 and results, f"exit {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return results


def assert_the_contract_held(probe: dict, *, uid: int, cache_root: str | None = None) -> None:
    """What the probe saw: this uid, a home it could write, a C++ kernel compiled into a cache
    it could write, a DDP step taken, torch's version in PYTORCH_VERSION, the RDMA libraries."""
    assert probe["uid"] == uid, probe
    assert probe["kernels"] >= 1, probe  # Inductor compiled and wrote a kernel where its variable points
    assert probe["ddp_step"] is True, probe
    assert probe["PYTORCH_VERSION"] == probe["torch"].split("+")[0], probe
    assert {"libibverbs.so.1", "librdmacm.so.1", "libmlx5.so.1", "libefa.so.1"} <= set(probe["rdma"]), probe
    if cache_root is not None:
        assert probe["caches"] == {"TORCHINDUCTOR_CACHE_DIR": f"{cache_root}/inductor",
                                   "TRITON_CACHE_DIR": f"{cache_root}/triton"}, probe


def assert_the_contract_holds_under_docker(ref: str) -> None:
    """The contract under plain Docker with what pyxis and Apptainer give (CONTRACT): the home and
    the caches move to /tmp, the only place such a container can write."""
    done = run_container(*CONTRACT, "-v", f"{PROBE}:/probe.py:ro", ref, "python", "/probe.py")
    (probe,) = probe_result(done)
    assert (probe["home"], probe["user"]) == ("/tmp/home-12345", "uid12345"), probe
    assert_the_contract_held(probe, uid=12345, cache_root="/tmp/home-12345/.cache/torch")


def missing_tools() -> list[str]:
    """The Debian packages of the tools this module needs that this host lacks."""
    return sorted({package for tool, package in TOOLS.items() if shutil.which(tool) is None
                   and not Path("/usr/sbin", tool).exists()})


@dataclass(frozen=True)
class HostUser:
    name: str
    uid: int
    gid: int
    home: Path

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 600,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """argv as this user, with a login's HOME, USER and PATH (and env)."""
        environment = {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name,
                       "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", **(env or {})}
        return subprocess.run(["runuser", "-u", self.name, "--", "env", "-i",
                               *(f"{k}={v}" for k, v in environment.items()), *argv],
                              capture_output=True, text=True, timeout=timeout, cwd=cwd or self.home)


@contextmanager
def host_user(name: str = "ib-cluster-test") -> Iterator[HostUser]:
    """A non-root user of this host with a home and subordinate ids (rootless Podman's), made
    here and removed afterwards with its home (one that was here before is left as it was)."""
    made = False
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True,
                       capture_output=True, timeout=60)
        made = True
    entry = pwd.getpwnam(name)
    try:
        yield HostUser(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))
    finally:
        if made:
            subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True, timeout=30)
            subprocess.run(["userdel", "--remove", name], capture_output=True, timeout=60)


@contextmanager
def rootless_podman(user: HostUser) -> Iterator[None]:
    """Podman for user, on the kernel's own overlay (rootless since Linux 5.13; Podman 4.3
    otherwise picks vfs, a full copy of the image per layer); its storage is reset afterwards."""
    config = user.home / ".config" / "containers"
    config.mkdir(parents=True, exist_ok=True)
    (config / "storage.conf").write_text('[storage]\ndriver = "overlay"\n')
    subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(user.home / ".config")], check=True, timeout=30)
    try:
        yield
    finally:
        user.run(["podman", "system", "reset", "--force"], timeout=300)


@contextmanager
def squashfs_mounted(squashfs: Path) -> Iterator[Path]:
    """squashfs mounted read-only by squashfuse, readable by every user (allow_other: this
    host's /dev/fuse is root's alone, so the mount is root's, as Apptainer's setuid mode
    mounts its images); unmounted afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="ib-squashfs-root-"))
    folder.chmod(0o755)
    subprocess.run(["squashfuse", "-o", "allow_other", str(squashfs), str(folder)], check=True, timeout=60)
    try:
        yield folder
    finally:
        subprocess.run(["fusermount3", "-u", str(folder)], capture_output=True, timeout=60)
        folder.rmdir()


def bwrap_argv(root: Path, home: Path, env: Mapping[str, str], workdir: str) -> list[str]:
    """bubblewrap over root as Apptainer runs an image: the root read-only, the host's home bound
    at its own path (on a tmpfs /home that keeps the image's own homes, as Apptainer's underlay
    does), the host's /etc/hosts and resolv.conf, a private /tmp, the host's network, no
    ENTRYPOINT; the environment is exactly env."""
    homes = [arg for entry in sorted((root / "home").iterdir())
             for arg in ("--ro-bind", str(entry), f"/home/{entry.name}")] if (root / "home").is_dir() else []
    return ["bwrap", "--unshare-all", "--share-net", "--die-with-parent", "--clearenv",
            "--ro-bind", str(root), "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
            "--ro-bind", "/etc/hosts", "/etc/hosts", "--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf",
            "--tmpfs", "/home", *homes, "--bind", str(home), str(home), "--chdir", workdir,
            *(arg for key, value in env.items() for arg in ("--setenv", key, value))]


# enroot's hooks/extra/50-slurm-pytorch.sh, as it behaves (read from enroot's source): only when
# the image's environment has PYTORCH_VERSION, and never over a value the environment has.
ENROOT_PYTORCH_HOOK = """
if [ -n "${IMAGE_PYTORCH_VERSION:-}" ]; then
    export MASTER_ADDR="${MASTER_ADDR:-$(scontrol show hostname "$SLURM_STEP_NODELIST" | head -n1)}"
    export MASTER_PORT="${MASTER_PORT:-$((SLURM_JOB_ID % 16384 + 49152))}"
    export WORLD_SIZE="${WORLD_SIZE:-$SLURM_NTASKS}" RANK="${RANK:-$SLURM_PROCID}" LOCAL_RANK="${LOCAL_RANK:-$SLURM_LOCALID}"
fi
"""


def slurm_task_script(bwrap: Sequence[str], image_env: Mapping[str, str]) -> str:
    """One Slurm task: the hook's variables, then the image under bwrap with them."""
    import shlex

    passed = " ".join(f'--setenv {name} "${name}"' for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE",
                                                                 "RANK", "LOCAL_RANK"))
    pytorch = shlex.quote(image_env.get("PYTORCH_VERSION", ""))
    return (f"#!/bin/bash\nset -eu\nIMAGE_PYTORCH_VERSION={pytorch}\n{ENROOT_PYTORCH_HOOK}\n"
            f'if [ -n "$IMAGE_PYTORCH_VERSION" ]; then hook=({passed}); else hook=(); fi\n'
            f'exec {shlex.join(bwrap)} "${{hook[@]}}" "$@"\n')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Slurm:
    conf: Path

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}


@contextmanager
def one_node_slurm() -> Iterator[Slurm]:
    """slurmctld and slurmd for this host alone (its CPUs, one partition), authenticated by a
    munged of their own (own key and socket), every file in a temp folder; all stopped and
    removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="ib-slurm-"))
    folder.chmod(0o755)  # slurmd's spool and the socket are read by the job's user
    node = socket.gethostname().split(".")[0]
    socket_path, key = folder / "munge.socket", folder / "munge.key"
    key.write_bytes(os.urandom(128))
    key.chmod(0o600)
    conf = folder / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=imagebuilder-test", f"SlurmctldHost={node}(127.0.0.1)",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        "AuthType=auth/munge", f"AuthInfo=socket={socket_path}", "SlurmUser=root", "SlurmdUser=root",
        f"StateSaveLocation={folder}/state", f"SlurmdSpoolDir={folder}/spool",
        f"SlurmctldPidFile={folder}/slurmctld.pid", f"SlurmdPidFile={folder}/slurmd.pid",
        f"SlurmctldLogFile={folder}/slurmctld.log", f"SlurmdLogFile={folder}/slurmd.log",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU", "ReturnToService=2", "MpiDefault=none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN",
        "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""]))
    for sub in ("state", "spool"):
        (folder / sub).mkdir()
    processes: list[subprocess.Popen[bytes]] = []
    try:
        munged = subprocess.run(["munged", "--force", f"--socket={socket_path}", f"--key-file={key}",
                                 f"--pid-file={folder}/munged.pid", f"--log-file={folder}/munged.log",
                                 f"--seed-file={folder}/munged.seed"], capture_output=True, text=True, timeout=30)
        assert munged.returncode == 0, f"munged did not start: {munged.stderr}"
        for daemon in ("slurmctld", "slurmd"):
            processes.append(subprocess.Popen([daemon, "-D", "-f", str(conf)], stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL, env={**os.environ, "SLURM_CONF": str(conf)}))
        deadline = time.monotonic() + 60
        state = ""
        while time.monotonic() < deadline:
            done = subprocess.run(["sinfo", "--noheader", "--format=%T"], capture_output=True, text=True,
                                  timeout=30, env={**os.environ, "SLURM_CONF": str(conf)})
            state = done.stdout.strip() or done.stderr.strip()
            if state == "idle":
                break
            time.sleep(0.5)
        else:
            logs = "\n".join((folder / f"{d}.log").read_text()[-1500:] for d in ("slurmctld", "slurmd")
                             if (folder / f"{d}.log").exists())
            raise AssertionError(f"the one-node Slurm did not come up (sinfo: {state!r}):\n{logs}")
        yield Slurm(conf)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)
        _stop_munged(folder / "munged.pid")
        shutil.rmtree(folder, ignore_errors=True)


def _stop_munged(pid_file: Path) -> None:
    """SIGTERM to our munged, then wait for it to go: it writes its seed file as it exits."""
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, 15)
    except (OSError, ValueError):
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.1)
