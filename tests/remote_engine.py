"""A second Docker engine, as a remote build host would be: its own network namespace with its
own bridge, reached over TCP with TLS; torn down (daemon, namespace, files) afterwards.

Never a second daemon in this machine's network namespace: one started there with
`"bridge": "none"` deleted the first daemon's docker0 bridge and broke its builds. In its own
namespace it makes its own docker0, which no other daemon sees.

A registry on this host's loopback (127.0.0.1:PORT, insecure by default for every engine) is
made reachable inside the namespace at the same address by two small TCP forwarders over
the namespace's veth pair, so image and cache refs are the same strings on both engines.
Whatever the engine downloads crosses that pair from the host's end, whose egress limit_rate
shapes (a GPU node's link, for the cold-start benchmark).

lazy=True: the engine pulls eStargz images lazily, as a node with the stargz snapshotter does.
Its dockerd runs on a containerd of its own (not the one it would start itself: that one has
no way to add a snapshotter) whose proxy plugin `stargz` is containerd-stargz-grpc
(.ci/stargz-install.sh), with `"storage-driver": "stargz"`: a pull fetches each eStargz layer's
table of contents only and mounts the layer over FUSE; a file's bytes come from the registry
when it is first read. All three run in the namespace, with every file under the engine's
temp root, and are stopped (dockerd, the snapshotter, containerd) and their mounts unmounted
whatever happened.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

FORWARDER = """
import asyncio, sys
listen_host, listen_port, to_host, to_port = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
async def pipe(reader, writer):
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()
async def handle(reader, writer):
    try:
        up_reader, up_writer = await asyncio.open_connection(to_host, to_port)
    except OSError:
        writer.close()
        return
    await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)
async def main():
    server = await asyncio.start_server(handle, listen_host, listen_port)
    async with server:
        await server.serve_forever()
asyncio.run(main())
"""


@dataclass(frozen=True)
class RemoteEngine:
    name: str
    """The buildx builder (a docker context in `docker_config`) that builds on it."""
    host: str
    """tcp://ADDRESS:2376, TLS."""
    cert_path: Path
    docker_config: Path
    link: str
    """The host's end of the veth pair: its egress is what the engine downloads (tx_bytes in
    /sys/class/net/LINK/statistics counts it; limit_rate shapes it)."""
    left_mounted: list[str] = field(default_factory=list)
    """Filled at teardown: the mounts under the engine's root that its daemons left and the
    teardown had to unmount (none, when they stopped as they should)."""

    def env(self) -> dict[str, str]:
        """The environment in which docker, buildx and imagebuilder talk to this engine."""
        return {**os.environ, "DOCKER_HOST": self.host, "DOCKER_TLS_VERIFY": "1",
                "DOCKER_CERT_PATH": str(self.cert_path), "DOCKER_CONFIG": str(self.docker_config)}


def limit_rate(link: str, rate: str | None) -> None:
    """Shape `link`'s egress to `rate` (tc's units: 1gbit, 200mbit) with a token bucket, replacing
    any limit it had; None: unshaped. A token bucket because netem is not built into every kernel
    (this host's lacks it); tbf is, and gave 23.9 MB/s at 200mbit here."""
    if rate is None:
        subprocess.run(["tc", "qdisc", "del", "dev", link, "root"], capture_output=True, check=False)
    else:
        _run("tc", "qdisc", "replace", "dev", link, "root", "tbf", "rate", rate, "burst", "1mb", "latency", "50ms")


def _run(*argv: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=True, timeout=120, **kw)  # type: ignore[call-overload]


def _certs(folder: Path, address: str) -> None:
    """A CA, the daemon's certificate for `address`, and a client certificate."""
    folder.mkdir(parents=True)
    o = folder

    def ssl(*args: str) -> None:
        _run("openssl", *args, cwd=o)

    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca-key.pem", "-out", "ca.pem",
        "-days", "1", "-subj", "/CN=imagebuilder-test-ca")
    (o / "server.ext").write_text(f"subjectAltName=IP:{address}\nextendedKeyUsage=serverAuth\n")
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server-key.pem", "-out", "server.csr", "-subj", "/CN=remote")
    ssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem", "-CAcreateserial",
        "-out", "server-cert.pem", "-days", "1", "-extfile", "server.ext")
    (o / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem", "-out", "client.csr", "-subj", "/CN=client")
    ssl("x509", "-req", "-in", "client.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem", "-CAcreateserial",
        "-out", "cert.pem", "-days", "1", "-extfile", "client.ext")


def _wait_for(engine_env: dict[str, str], daemon: subprocess.Popen[bytes], log: Path, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            raise RuntimeError(f"the remote dockerd exited: {log.read_text()[-3000:]}")
        if subprocess.run(["docker", "version"], env=engine_env, capture_output=True, timeout=30).returncode == 0:
            return
        time.sleep(1)
    raise RuntimeError(f"the remote dockerd did not answer in {seconds:.0f}s: {log.read_text()[-3000:]}")


def _wait_for_socket(path: Path, process: subprocess.Popen[bytes], log: Path, what: str,
                     seconds: float = 60) -> None:
    """Until `process` accepts connections on the unix socket `path`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited: {log.read_text()[-3000:]}")
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(str(path))
                return
            except OSError:
                pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not answer on {path} in {seconds:.0f}s: {log.read_text()[-3000:]}")


def _start_lazy_backend(root: Path, netns: str, processes: list[tuple[subprocess.Popen[bytes], signal.Signals]]) -> Path:
    """containerd with the stargz proxy plugin, and containerd-stargz-grpc, in the namespace;
    each appended to `processes` with the signal that stops it cleanly; returns containerd's
    socket, for dockerd's "containerd"."""
    stargz_socket, containerd_socket = root / "stargz" / "grpc.sock", root / "containerd" / "grpc.sock"
    (root / "containerd.toml").write_text(f"""version = 2
root = "{root}/containerd/root"
state = "{root}/containerd/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]

[grpc]
  address = "{containerd_socket}"

[ttrpc]
  address = "{containerd_socket}.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[proxy_plugins.stargz]
  type = "snapshot"
  address = "{stargz_socket}"
""")
    nsenter = ["nsenter", f"--net=/run/netns/{netns}"]
    for argv, sock, what, stop in (
            ([*nsenter, "containerd", "--config", str(root / "containerd.toml")], containerd_socket,
             "the remote containerd", signal.SIGTERM),
            # SIGINT: the snapshotter unmounts its layers before it exits (SIGTERM leaves them).
            ([*nsenter, "containerd-stargz-grpc", "--address", str(stargz_socket), "--root",
              str(root / "stargz" / "root")], stargz_socket,
             "the remote containerd-stargz-grpc", signal.SIGINT)):
        sock.parent.mkdir(parents=True, exist_ok=True)
        log = root / f"{argv[2]}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=out, start_new_session=True)
        processes.append((process, stop))
        _wait_for_socket(sock, process, log, what)
    return containerd_socket


def _stop(process: subprocess.Popen[bytes], stop: signal.Signals = signal.SIGTERM) -> None:
    """Signal `process`'s group; SIGKILL it after 60 s."""
    if process.poll() is None:
        os.killpg(process.pid, stop)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@contextmanager
def remote_engine(registry_port: int | None = None, lazy: bool = False,
                  dockerd: str = "dockerd") -> Iterator[RemoteEngine]:
    """Start the engine (lazy: on the stargz snapshotter); yield it; tear everything down,
    whatever happened. `dockerd`: another daemon's binary (Docker 20.10's, unpacked by
    .ci/docker-20.10.sh), run on the classic image store (it has no containerd store), with its
    package's helpers (docker-proxy, docker-init) first on its PATH."""
    tag = uuid.uuid4().hex[:6]
    netns, host_if, ns_if = f"ib-remote-{tag}", f"ibh{tag}", f"ibn{tag}"
    subnet = random.randrange(0, 250)
    host_ip, ns_ip = f"10.213.{subnet}.1", f"10.213.{subnet}.2"
    root = Path(tempfile.mkdtemp(prefix=f"ibr{tag}-", dir="/tmp"))
    processes: list[subprocess.Popen[bytes]] = []
    daemon: subprocess.Popen[bytes] | None = None
    engine: RemoteEngine | None = None
    backend: list[tuple[subprocess.Popen[bytes], signal.Signals]] = []  # lazy: containerd, stargz
    try:
        _run("ip", "netns", "add", netns)
        _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _run("ip", "link", "set", ns_if, "netns", netns)
        _run("ip", "addr", "add", f"{host_ip}/30", "dev", host_if)
        _run("ip", "link", "set", host_if, "up")
        for cmd in (["ip", "addr", "add", f"{ns_ip}/30", "dev", ns_if], ["ip", "link", "set", ns_if, "up"],
                    ["ip", "link", "set", "lo", "up"]):
            _run("ip", "netns", "exec", netns, *cmd)
        _certs(root / "tls", ns_ip)
        client = root / "client"
        client.mkdir()
        for name in ("ca.pem", "cert.pem", "key.pem"):
            shutil.copy(root / "tls" / name, client / name)
        config = {
            "data-root": str(root / "data"), "exec-root": str(root / "exec"), "pidfile": str(root / "docker.pid"),
            "hosts": [f"unix://{root}/docker.sock", f"tcp://{ns_ip}:2376"],
            "tlsverify": True, "tlscacert": str(root / "tls" / "ca.pem"),
            "tlscert": str(root / "tls" / "server-cert.pem"), "tlskey": str(root / "tls" / "server-key.pem"),
            **({"features": {"containerd-snapshotter": True}} if dockerd == "dockerd" else {}),
            "bip": "172.31.254.1/24",  # its own docker0, inside its own namespace
        }
        if lazy:
            config["containerd"] = str(_start_lazy_backend(root, netns, backend))
            config["storage-driver"] = "stargz"
        (root / "daemon.json").write_text(json.dumps(config))
        log = root / "dockerd.log"
        with log.open("wb") as out:
            # nsenter, not `ip netns exec`: that one remounts /sys, hiding the cgroup mounts.
            package = Path(dockerd).parent.parent  # DIR/usr of an unpacked package
            path = f"{package / 'sbin'}:{package / 'bin'}:{os.environ.get('PATH', '')}"
            daemon = subprocess.Popen(["nsenter", f"--net=/run/netns/{netns}", dockerd,
                                       "--config-file", str(root / "daemon.json")],
                                      stdout=out, stderr=out, start_new_session=True,
                                      env={**os.environ, "PATH": path} if dockerd != "dockerd" else None)
        if registry_port is not None:
            # host veth -> the registry on this host's loopback; inside: loopback -> host veth.
            for argv in (["python3", "-c", FORWARDER, host_ip, str(registry_port), "127.0.0.1", str(registry_port)],
                         ["nsenter", f"--net=/run/netns/{netns}", sys.executable, "-c", FORWARDER, "127.0.0.1",
                          str(registry_port), host_ip, str(registry_port)]):
                processes.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                                  start_new_session=True))
        docker_config = root / "config"
        docker_config.mkdir()
        engine = RemoteEngine(name=f"ib-remote-{tag}", host=f"tcp://{ns_ip}:2376", cert_path=client,
                              docker_config=docker_config, link=host_if)
        _wait_for(engine.env(), daemon, log)
        # The builder instance: buildx's docker driver on a context that reaches the engine.
        _run("docker", "context", "create", engine.name, "--docker",
             f"host={engine.host},ca={client}/ca.pem,cert={client}/cert.pem,key={client}/key.pem",
             env={**os.environ, "DOCKER_CONFIG": str(docker_config)})
        yield engine
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)
        if daemon is not None:
            _stop(daemon)
        for process, stop in reversed(backend):  # the snapshotter, then containerd
            _stop(process, stop)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)  # and its veth end
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, check=False)
        # Mounts the daemon's snapshotter may have left under its data root, then the files.
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                  if line.split()[1].startswith(str(root))]
        for mount in sorted(mounts, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
        if engine is not None:
            engine.left_mounted.extend(mounts)
        shutil.rmtree(root, ignore_errors=True)
