"""End to end on a real Docker Engine: build real torch images with the CLI and look inside.

These build images of several GB; they run in CI (IMAGEBUILDER_REQUIRE_DOCKER=1) and skip
elsewhere when no daemon answers.
"""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest

from support.cleanup import remove_local_tags
from support.real_images import TEST_REPOSITORY_PREFIX, build_cli, ca_bundle_args, imagebuilder
from support.registry import put_blob, put_manifest
from support.unavailable import _unavailable

pytestmark = [pytest.mark.docker, pytest.mark.slow]

PROBE = """
import importlib.metadata, json, os, shutil, torch
print(json.dumps({
    "torch": torch.__version__,
    "cuda": torch.version.cuda,
    "cudart": importlib.metadata.version("nvidia-cuda-runtime-cu12"),
    "cudnn": torch.backends.cudnn.version(),
    "nccl": ".".join(map(str, torch.cuda.nccl.version())),
    "cxx": shutil.which("g++"),
    "uid": os.getuid(),
    "ssl_cert_file": os.environ.get("SSL_CERT_FILE"),
    "ca_left": os.path.exists("/etc/imagebuilder/ca-bundle.pem"),
    "manifest": json.load(open("/opt/imagebuilder/manifest.json")),
    "debs": [f for f in os.listdir("/var/cache/apt/archives") if f.endswith(".deb")],
}))
"""


def run_in(docker_engine, image: str, command: list[str], timeout: float = 300, **kw) -> str:
    result = docker_engine.run(image, command, timeout=timeout, **kw)
    assert not result.timed_out and result.exit_code == 0, result.output[-3000:]
    return result.output


def test_runtime_image_has_what_its_labels_say(docker_engine, runtime_image):
    from imagebuilder.engine.select import decide

    ref = runtime_image["tags"][0]
    assert ref.endswith(":2.6.0-cuda12.1-cudnn9-debian12-runtime")
    labels = docker_engine.image_labels(ref)
    out = json.loads(run_in(docker_engine, ref, ["python", "-c", PROBE]).strip().splitlines()[-1])

    assert out["torch"].split("+")[0] == labels["io.imagebuilder.torch"] == "2.6.0"
    assert out["cuda"] == labels["io.imagebuilder.torch.cuda"] == "12.4"  # cu124 wheels on a 12.1 image
    assert labels["io.imagebuilder.cuda"] == "12.1.1"
    # Which CUDA is which (issue 45, part 7): the runtime the wheels brought, as installed.
    assert labels["io.imagebuilder.cuda.runtime"] == out["cudart"] == "12.4.127"
    assert "io.imagebuilder.cuda.toolkit" not in labels  # no nvcc in a runtime image
    cudnn = labels["io.imagebuilder.cudnn"].split(".")
    assert out["cudnn"] == int(cudnn[0]) * 10000 + int(cudnn[1]) * 100 + int(cudnn[2])  # 9.1.0 -> 90100
    assert labels["io.imagebuilder.cudnn"].startswith("9.1.")
    assert out["nccl"] == labels["io.imagebuilder.nccl"] == "2.21.5"
    assert out["cxx"] == "/usr/bin/g++"  # torch.compile needs it
    assert out["debs"] == []  # a debootstrap base keeps apt's downloads unless the build cleans them
    assert labels["io.imagebuilder.os"] == "debian12"  # read from the base image: no --os was given
    if ca_bundle_args() and decide("auto").kind == "classic":
        # The classic two-stage (--ca-bundle) build removed its 5.8 GB first stage: nobody asked
        # for it. BuildKit mounts the CA as a secret and keeps its stages in its cache.
        assert len(runtime_image["removed"]) == 1
        assert not docker_engine.image_exists(runtime_image["removed"][0])
    else:
        assert runtime_image["removed"] == []
    assert out["uid"] == 1000  # not root by default
    assert out["ssl_cert_file"] is None and not out["ca_left"]  # the build's CA stays in the build
    manifest = out["manifest"]
    assert manifest["inputs_hash"] == labels["io.imagebuilder.inputs-hash"] == runtime_image["inputs_hash"]
    assert (manifest["torch"], manifest["cudnn"], manifest["nccl"]) == ("2.6.0", labels["io.imagebuilder.cudnn"], "2.21.5")
    for key in ("version", "created", "source", "base.name", "title"):
        assert labels[f"org.opencontainers.image.{key}"], key
    assert labels["org.opencontainers.image.base.name"] == runtime_image["spec"]["base_image"]
    # Every tag of the scheme points at the image.
    ids = {docker_engine.image_labels(t) == labels for t in runtime_image["tags"]}
    assert ids == {True} and len(runtime_image["tags"]) >= 2


def test_the_main_job_says_what_it_assumed_and_is_never_silent(runtime_image):
    """The README's main job on the shipped matrix: the cu124-on-12.1 notice on the real build's
    output, and progress all the way (no gap over 15 s between its timed lines: the export and
    the unpack say what they do, as the steps do)."""
    err = runtime_image["stderr"]
    assert ("note: torch 2.6.0 has no CUDA 12.1 wheels; using cu124 wheels on the CUDA 12.1.1 image, which run "
            "there through CUDA minor-version compatibility") in err
    at = [float(m[1]) for m in re.finditer(r"^\[runtime\] .* at (\d+\.\d+)s$", err, re.M)]
    assert len(at) > 5 and at == sorted(at)
    gaps = [b - a for a, b in zip(at, at[1:])]
    assert max(gaps) <= 15.0, f"a silence of {max(gaps):.1f}s:\n{err[-3000:]}"
    from imagebuilder.engine.select import decide

    if decide("auto").kind == "buildkit":
        assert re.search(r"^\[runtime\] exporting layers \(zstd\)", err, re.M)  # zstd by default
        assert runtime_image["export_seconds"] > 0
        assert re.search(r"the export \(compress, unpack\) \d+\.\ds", runtime_image["stdout"])


def test_strict_refuses_the_cuda_121_fallback_before_anything_is_built(docker_engine, base_image):
    repository = f"{TEST_REPOSITORY_PREFIX}/strict-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    done = imagebuilder("build", "--torch", "2.6", "--cuda", "12.1", "--strict", "--base-image", base_image,
                        "--repository", repository, "--builder", "auto", *ca_bundle_args())
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: torch 2.6.0 is published for CUDA ")
    assert "--strict" in done.stderr and "building" not in done.stderr and "Traceback" not in done.stderr
    assert time.monotonic() - started < 30
    listed = subprocess.run(["docker", "images", "-q", "--filter", f"reference={repository}*"], capture_output=True,
                            text=True, timeout=60)
    assert listed.returncode == 0 and listed.stdout.strip() == ""


def test_smoke_tests_travel_with_the_image(docker_engine, runtime_image):
    result = docker_engine.run(runtime_image["tags"][0], ["python", "-m", "smoke_tests", "--json",
                                                          "--checks", "environment"], timeout=300)
    from imagebuilder.verify.output import parse_output

    parsed = parse_output(result.output, result.exit_code)
    assert result.exit_code == 0, result.output[-2000:]
    assert [(c.name, c.status) for c in parsed.checks] == [("environment", "pass")]
    assert parsed.torch and parsed.torch.startswith("2.6.0")


# A tiny torch.compile on the CPU; prints Inductor's cache counters for the test to read.
COMPILE_PROBE = """
import json, os, torch
from torch._dynamo.utils import counters
def f(x):
    return torch.nn.functional.gelu(x @ x.T + 1).sum(dim=-1)
torch.compile(f)(torch.randn(32, 32))
print("PROBE " + json.dumps({"cache_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
                             "fxgraph_cache_hit": counters["inductor"]["fxgraph_cache_hit"],
                             "fxgraph_cache_miss": counters["inductor"]["fxgraph_cache_miss"],
                             "autograd_cache_hit": counters["aot_autograd"]["autograd_cache_hit"]}))
"""


def _docker_run(ref: str, *command: str, volume: str | None = None, user: str | None = None) -> str:
    """`docker run --rm` of `command` in `ref`, with `volume` at the compile-cache folder: its
    output. Killed and removed at its time limit (a named volume needs the CLI: the engine's
    run() mounts host folders only)."""
    from imagebuilder.build.image_contents import COMPILE_CACHE

    name = f"{TEST_REPOSITORY_PREFIX}-cache-{uuid.uuid4().hex[:8]}"
    argv = ["docker", "run", "--rm", "--name", name, *(["-v", f"{volume}:{COMPILE_CACHE}"] if volume else []),
            *(["--user", user] if user else []), ref, *command]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=120)
        raise
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _tagged(output: str, prefix: str) -> dict:
    (line,) = [line for line in output.splitlines() if line.startswith(prefix)]
    found: dict = json.loads(line[len(prefix):])
    return found


def test_compiled_kernels_outlive_the_container_in_a_volume(runtime_image):
    """Issue 32: a fresh named volume at the compile-cache folder; a container compiles, and a
    second fresh container with the volume takes the graph from Inductor's FX graph cache. The
    image's cache check says whether a volume is there, and any uid can write the folder."""
    from imagebuilder.build.image_contents import COMPILE_CACHE

    ref = runtime_image["tags"][0]
    volume = f"{TEST_REPOSITORY_PREFIX}-cache-{uuid.uuid4().hex[:8]}"
    created = subprocess.run(["docker", "volume", "create", volume], capture_output=True, text=True, timeout=120)
    assert created.returncode == 0, created.stderr
    try:
        first = _tagged(_docker_run(ref, "python", "-c", COMPILE_PROBE, volume=volume), "PROBE ")
        assert first["cache_dir"] == f"{COMPILE_CACHE}/inductor"
        assert first["fxgraph_cache_hit"] == 0 and first["fxgraph_cache_miss"] >= 1, first
        # Docker seeded the new volume from the image's folder (mode 1777); the first container filled it.
        listing = _docker_run(ref, "sh", "-c", f"stat -c %a {COMPILE_CACHE} && find {COMPILE_CACHE}/inductor -type f",
                              volume=volume).split()
        assert listing[0] == "1777", listing[:5]
        assert any("/fxgraph/" in path for path in listing[1:]), listing[:20]
        second = _tagged(_docker_run(ref, "python", "-c", COMPILE_PROBE, volume=volume), "PROBE ")
        assert second["fxgraph_cache_hit"] >= 1 and second["fxgraph_cache_miss"] == 0, (first, second)

        cache_check = ["python", "-m", "smoke_tests", "--checks", "cache", "--json", "--allow-no-gpu"]
        kept = json.loads(_docker_run(ref, *cache_check, volume=volume))["checks"][0]
        assert kept["status"] == "pass" and kept["reason"].startswith(f"{COMPILE_CACHE} writable; a volume ("), kept
        lost = json.loads(_docker_run(ref, *cache_check))["checks"][0]
        assert lost["status"] == "pass", lost
        assert lost["reason"].startswith(f"{COMPILE_CACHE} writable; not a volume ("), lost
        assert "lost with the container" in lost["reason"] and f"-v torch-cache:{COMPILE_CACHE}" in lost["reason"]
        # OpenShift's arbitrary uid (gid 0) in a fresh container: the folder takes its files too.
        other = json.loads(_docker_run(ref, *cache_check, user="12345:0"))["checks"][0]
        assert other["status"] == "pass" and other["measurements"]["uid"] == 12345, other
    finally:
        subprocess.run(["docker", "volume", "rm", "-f", volume], capture_output=True, timeout=120)


def test_a_second_identical_build_is_fully_cached(docker_engine, base_image, runtime_image, tmp_path):
    """The same lock, built again: the same image. On the classic builder with --ca-bundle the
    first build removed its 5.8 GB wheels stage (nobody asked for it), so that stage runs again
    from the lock and the final stage, fed the same files, is served whole from the cache;
    BuildKit keeps every stage in its cache and is fully cached."""
    from imagebuilder.engine.docker import stores_manifests
    from imagebuilder.engine.select import decide

    buildkit = decide("auto").kind == "buildkit"
    if not buildkit and ca_bundle_args() and stores_manifests(docker_engine.info()):
        # Measured on Docker 26.1 with the containerd image store: the rebuild ran 26 of 28 steps
        # again and gave another image id. The classic builder there does not reuse the final
        # stage once the wheels stage it copied from was removed. A known gap, not a pass: this
        # engine cannot show the property, so the test does not run here (a failure in CI, whose
        # engine has buildx); BuildKit, what auto picks on that engine, rebuilds from its cache
        # (test_publish_buildkit).
        _unavailable("classic builder on the containerd store: a --ca-bundle rebuild is not served from cache "
                     "(measured on Docker 26.1: 26 of 28 steps ran again); give this engine buildx")
    def content(ref: str) -> tuple:
        """What an image is, whatever the store names it by: its config's creation time and layers."""
        attrs = docker_engine.inspect_image(ref)
        config = attrs["Config"]
        return (attrs["Created"], attrs["RootFS"]["Layers"], config.get("Labels"), config.get("Env"),
                config.get("Entrypoint"), config.get("Cmd"))

    first = content(runtime_image["tags"][0])
    report = build_cli(base_image, runtime_image["repository"], tmp_path / "again.json", "--variant", "runtime")
    again = report["images"][0]
    if buildkit:
        # What the session's images are built with on an engine with buildx: one cache for
        # every stage (the CA is a secret, nothing is removed), every step served from it.
        assert again["cached_steps"] >= again["steps"] - 3, again  # the FROM lines are not "cached"
        assert again["removed"] == []
        # The same image. Where the store names an image by its config (overlay2) that is its
        # id; the containerd store names it by the index BuildKit exported, whose provenance
        # attestation carries the build's own timestamps (measured: another id for every
        # fully cached build of one Dockerfile), so there the config is compared: the same
        # creation time (a step that ran again would set a new one) and the same layers.
        if not stores_manifests(docker_engine.info()):
            assert again["image_id"] == runtime_image["image_id"]
        assert content(again["tags"][0]) == first
        return
    assert again["image_id"] == runtime_image["image_id"]
    if ca_bundle_args():
        assert len(again["removed"]) == 1 and not docker_engine.image_exists(again["removed"][0])
    else:
        assert again["cached_steps"] >= again["steps"] - 3  # the FROM lines are never "cached"
        assert again["seconds"] < 30


@pytest.mark.beside_builds  # the classic builder, failing at the install step (FAILING_EARLY)
def test_build_failure_names_the_step_and_leaves_no_tag(docker_engine, base_image, tmp_path):
    repository = f"{TEST_REPOSITORY_PREFIX}/fail-{uuid.uuid4().hex[:8]}"
    done = imagebuilder("build", "--torch", "2.6", "--cuda", "12.1", "--os", "debian12", "--base-image", base_image,
                        "--repository", repository, "--index-url", "http://127.0.0.1:9/simple", *ca_bundle_args())
    assert done.returncode == 1
    assert "step" in done.stderr and "uv pip install" in done.stderr and "log" in done.stderr
    assert "could not reach 127.0.0.1:9" in done.stderr and "--index-url" in done.stderr  # named, with the host
    if ca_bundle_args():
        assert "--ca-bundle" not in done.stderr  # it was given: no advice to give it
    assert "last " in done.stderr and "lines of the failing step" in done.stderr
    assert "Traceback" not in done.stderr
    assert not docker_engine.image_exists(f"{repository}:2.6.0-cuda12.1-cudnn9-debian12-runtime")


def test_missing_base_image_suggests_base_image(docker_engine):
    done = imagebuilder("build", "--torch", "2.6", "--cuda", "12.1", "--os", "debian12",
                        "--base-image", "imagebuilder-test/no-such-base:1")
    # 2 when the registry answers that it does not exist, 1 when no registry could be asked.
    said_missing = re.search(r"not found|does not exist|pull access denied|manifest unknown", done.stderr)
    assert done.returncode == (2 if said_missing else 1), done.stderr
    assert "imagebuilder-test/no-such-base:1" in done.stderr and "--base-image" in done.stderr


def test_jupyter_runs_as_non_root_with_a_token(docker_engine, runtime_image, jupyter_image):
    import docker

    jupyter = jupyter_image["images"][-1]
    assert jupyter["spec"]["variant"] == "jupyter"
    assert jupyter["spec"]["base_image"] == runtime_image["tags"][0]  # built FROM the runtime image
    assert len(jupyter_image["images"]) == 1  # the runtime image was there: not built again
    # Its CUDA labels are its parent's, inherited through FROM.
    labels = docker_engine.image_labels(jupyter["tags"][0])
    assert labels["io.imagebuilder.cuda.runtime"] == "12.4.127"
    client = docker.from_env()
    # A None port is "any free one" to docker-py; types-docker's ports type leaves it out.
    container = client.containers.run(jupyter["tags"][0], detach=True,
                                      ports={"8888/tcp": ("127.0.0.1", None)})  # type: ignore[call-overload]
    try:
        container.reload()
        port = container.attrs["NetworkSettings"]["Ports"]["8888/tcp"][0]["HostPort"]
        base = f"http://127.0.0.1:{port}"
        token = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and token is None:
            match = re.search(r"token=([0-9a-f]{20,})", container.logs().decode())
            token = match.group(1) if match else None
            time.sleep(1)
        assert token, container.logs().decode()[-2000:]
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(f"{base}/api/contents", timeout=10)
        assert denied.value.code == 403
        with urllib.request.urlopen(f"{base}/api/contents?token={token}", timeout=10) as ok:
            assert ok.status == 200
        exit_code, out = container.exec_run(["id", "-u"])
        assert out.decode().strip() == "1000"
        exit_code, out = container.exec_run(["python", "-c", "import torch, jupyterlab; print(torch.__version__)"])
        assert exit_code == 0 and out.decode().startswith("2.6.0")
    finally:
        container.remove(force=True)


def test_verify_judges_the_jupyter_server(jupyter_image):
    """The jupyter variant's promise is checked by verify (and so by publish): the server
    starts in the image and lets in only who has its token."""
    done = imagebuilder("verify", jupyter_image["images"][-1]["tags"][0], "--allow-no-gpu", "--json", timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
    assert list(checks) == ["environment", "cuda", "nccl", "cache", "compile", "cuda_graph", "jupyter", "labels"]
    jupyter = checks["jupyter"]
    assert jupyter["status"] == "pass", jupyter
    assert (jupyter["measurements"]["without_token"], jupyter["measurements"]["with_token"]) == (403, 200)


# As a user writes them: SummaryWriter's default log_dir is runs/<date>_<host> under the working
# directory, /workspace; TensorBoard's logdir in the image is /workspace/runs.
WRITE_SCALARS = """
from torch.utils.tensorboard import SummaryWriter
writer = SummaryWriter()
for step, loss in enumerate([1.0, 0.5, 0.25]):
    writer.add_scalar("loss", loss, step)
writer.close()
print("log_dir:", writer.log_dir)
"""
# Every listening TCP socket of the container's network namespace: "address port" lines.
LISTENING = """
import os, socket
for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
    if not os.path.exists("/proc/net/" + name):
        continue
    for line in open("/proc/net/" + name).read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A":  # LISTEN
            address, port = local.split(":")
            raw = bytes.fromhex(address)  # 32-bit words in the host's (little-endian) order
            print(socket.inet_ntop(family, b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))), int(port, 16))
"""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # a redirect to the login page is the answer
        return None


# Straight to the container (no HTTP(S)_PROXY), a redirect reported as it came.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirects)


def test_tensorboard_answers_through_jupyter_with_its_token_only(jupyter_image):
    """Issue 32: the running Jupyter server serves TensorBoard at /tensorboard/ (jupyter-server-proxy
    starts it at the first request): scalars SummaryWriter wrote in the container read back over
    HTTP with the token, the same URL refused without it, and nothing but Jupyter's port listening
    beyond the container's loopback (no 0.0.0.0:6006)."""
    import docker

    token = uuid.uuid4().hex
    client = docker.from_env()
    container = client.containers.run(jupyter_image["images"][-1]["tags"][0], detach=True,
                                      environment={"JUPYTER_TOKEN": token},
                                      ports={"8888/tcp": ("127.0.0.1", None)})  # type: ignore[call-overload]
    try:
        exit_code, out = container.exec_run(["python", "-c", WRITE_SCALARS])
        logged = re.search(r"^log_dir: runs/(.+)$", out.decode(), re.M)
        assert exit_code == 0 and logged, out.decode()[-2000:]
        run = logged.group(1)  # the run's name: its folder under TensorBoard's logdir
        container.reload()
        port = container.attrs["NetworkSettings"]["Ports"]["8888/tcp"][0]["HostPort"]
        url = (f"http://127.0.0.1:{port}/tensorboard/data/plugin/scalars/scalars?"
               + urllib.parse.urlencode({"run": run, "tag": "loss"}))
        points, last = None, None
        deadline = time.monotonic() + 120
        while points is None and time.monotonic() < deadline:
            try:
                with _DIRECT.open(urllib.request.Request(url, headers={"Authorization": f"token {token}"}),
                                  timeout=70) as answer:
                    points = json.load(answer)
            except (urllib.error.URLError, OSError) as e:  # Jupyter or TensorBoard still starting
                last = e
                time.sleep(1)
        assert points is not None, f"{last}\n{container.logs().decode()[-3000:]}"
        assert [(step, value) for _, step, value in points] == [(0, 1.0), (1, 0.5), (2, 0.25)]

        with pytest.raises(urllib.error.HTTPError) as denied:
            _DIRECT.open(url, timeout=10)
        refused = denied.value.code == 403 or (denied.value.code == 302 and "/login" in denied.value.headers["Location"])
        assert refused, (denied.value.code, denied.value.headers)

        exit_code, out = container.exec_run(["python", "-c", LISTENING])
        assert exit_code == 0, out.decode()
        listening = {(ipaddress.ip_address(address), int(number))
                     for address, number in (line.split() for line in out.decode().splitlines())}
        assert (ipaddress.ip_address("0.0.0.0"), 6006) not in listening, listening
        outside = {number for address, number in listening
                   if not (getattr(address, "ipv4_mapped", None) or address).is_loopback}
        assert outside == {8888}, listening  # Jupyter's own port, and nothing else
        assert any(number != 8888 for _, number in listening)  # TensorBoard's, on the loopback
    finally:
        container.remove(force=True)


def test_verify_over_ssh_passes_the_built_image_in_cpu_mode(docker_engine, runtime_image, ssh_docker_host):
    """docs/verify.md's remote example for real: `DOCKER_HOST=ssh://gpu-box imagebuilder verify TAG`,
    this machine's daemon behind the tests' own sshd, the real torch image's smoke tests run."""
    logins = ssh_docker_host.logins()
    done = imagebuilder("verify", runtime_image["tags"][0], "--allow-no-gpu", "--json", timeout=1200,
                        env_extra=ssh_docker_host.env())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    doc = json.loads(done.stdout)
    status = {c["name"]: c["status"] for c in doc["checks"]}
    assert status == {"environment": "pass", "cuda": "skip", "nccl": "pass", "cache": "pass", "compile": "pass",
                      "cuda_graph": "skip", "labels": "pass"}
    assert ssh_docker_host.logins() > logins  # through our sshd, not the local socket
    leftover = subprocess.run(["docker", "ps", "-aq", "--filter", f"ancestor={runtime_image['tags'][0]}"],
                              capture_output=True, text=True, timeout=60)
    assert leftover.returncode == 0 and leftover.stdout.strip() == ""


def test_verify_fails_a_relabelled_image_naming_each_label_and_what_the_image_holds(docker_engine, runtime_image,
                                                                                    tmp_path):
    """Labels are facts verify checks: the runtime image under labels that say another torch, CUDA
    and Python (one LABEL on it: no layer, no torch build) fails the `labels` check, which names what
    each label says and what the image holds; every other check passes as for the image itself."""
    ref = f"{runtime_image['repository']}:relabelled-{uuid.uuid4().hex[:8]}"
    (tmp_path / "Dockerfile").write_text(f"FROM {runtime_image['tags'][0]}\n"
                                         "LABEL io.imagebuilder.torch=2.5.1 io.imagebuilder.torch.cuda=11.8 "
                                         "io.imagebuilder.python=3.9\n")
    try:
        built = subprocess.run(["docker", "build", "-q", "-t", ref, str(tmp_path)], capture_output=True, text=True,
                               timeout=600)
        assert built.returncode == 0, built.stderr[-2000:]
        done = imagebuilder("verify", ref, "--allow-no-gpu", "--json", timeout=1200)
        assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
        checks = {c["name"]: c for c in json.loads(done.stdout)["checks"]}
        assert {n: c["status"] for n, c in checks.items() if c["status"] == "fail"} == {"labels": "fail"}, checks
        reason, measured = checks["labels"]["reason"], checks["environment"]["measurements"]
        assert f"label io.imagebuilder.torch says 2.5.1 but the image's torch is {measured['torch']}" in reason
        assert f"label io.imagebuilder.torch.cuda says 11.8 but the image's torch's CUDA is {measured['torch_cuda']}" \
            in reason
        assert f"label io.imagebuilder.python says 3.9 but the image's Python is {measured['python']}" in reason
        assert measured["torch"].startswith("2.6.0") and "variant" not in reason
    finally:
        docker_engine.remove_image(ref, force=True)


# An image imagebuilder did not build, made from the family's runtime image in seconds instead of a
# second 6 GB install: the same pinned wheels in a venv on the same base (what a user's own
# `pip install torch` image is), without /opt/imagebuilder and without a C++ compiler (as such images
# come; one small layer on top), and with a config of its own: no labels, no user or working
# directory, PATH only. The config is written through a local registry: the image's layers are the
# runtime image's blobs (no copy of its 6 GB, which flattening it onto scratch took: 90-130 s of CI),
# and the engine pulls the new config alone (it has every layer).
FOREIGN_DOCKERFILE = """\
FROM {runtime}
USER 0
RUN rm -rf /opt/imagebuilder \\
 && for name in g++ c++ clang++; do while p=$(command -v "$name") && rm "$p"; do :; done; done \\
 && rm -f /usr/bin/*-linux-gnu-g++* /etc/alternatives/c++
"""
FOREIGN_PATH = "PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _registry_get(url: str, accept: str | None = None) -> bytes:
    request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return bytes(answer.read())


def _foreign_image(runtime: str, address: str, tmp_path) -> str:
    """The foreign image under ADDRESS/foreign-X:2.6.0, pulled into the engine; its ref."""
    repository = f"foreign-{uuid.uuid4().hex[:8]}"
    built = f"{address}/{repository}:built"
    (tmp_path / "Dockerfile").write_text(FOREIGN_DOCKERFILE.format(runtime=runtime))
    done = subprocess.run(["docker", "buildx", "build", "--provenance=false", "--output",
                           f"type=image,name={built},push=true,registry.insecure=true,oci-mediatypes=true",
                           str(tmp_path)], capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    api = f"http://{address}/v2/{repository}"
    oci = "application/vnd.oci.image.manifest.v1+json"
    manifest = json.loads(_registry_get(f"{api}/manifests/built", accept=oci))
    assert manifest.get("mediaType", oci) == oci, manifest
    config = json.loads(_registry_get(f"{api}/blobs/{manifest['config']['digest']}"))
    ours = json.dumps({
        "architecture": config["architecture"], "os": config["os"], "rootfs": config["rootfs"],
        "config": {"Env": [FOREIGN_PATH]},
        "history": [{"created_by": "a user's own build"} for _ in config["rootfs"]["diff_ids"]],
    }, sort_keys=True).encode()
    manifest["config"] = {**manifest["config"], **put_blob(address, repository, ours)}
    put_manifest(address, repository, "2.6.0", json.dumps(manifest).encode(), oci)
    ref = f"{address}/{repository}:2.6.0"
    pulled = subprocess.run(["docker", "pull", "-q", ref], capture_output=True, text=True, timeout=600)
    assert pulled.returncode == 0, pulled.stderr[-2000:]
    return ref


@pytest.mark.registry
def test_verify_fails_a_foreign_image_for_want_of_a_compiler(docker_engine, runtime_image, registry, tmp_path):
    """A user's own torch image, no labels, no compiler: verify lends it the smoke tests, judges it
    against what its own torch says it is, and fails the compile check naming what is missing."""
    try:
        ref = _foreign_image(runtime_image["tags"][0], registry, tmp_path)
        attrs = docker_engine.inspect_image(ref)
        assert not (attrs.get("Config", {}).get("Labels") or {}), attrs.get("Config")
        assert attrs["Config"].get("User", "") == "" and attrs["Config"]["Env"] == [FOREIGN_PATH]
        # The runtime image's layers and one more: nothing of the 6 GB was copied.
        runtime_layers = docker_engine.inspect_image(runtime_image["tags"][0])["RootFS"]["Layers"]
        assert attrs["RootFS"]["Layers"][:-1] == runtime_layers
        # No --mount-smoke-tests: a user verifying an image imagebuilder did not build.
        done = imagebuilder("verify", ref, "--allow-no-gpu", "--json", timeout=1200)
        assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
        doc = json.loads(done.stdout)
        checks = {c["name"]: c for c in doc["checks"]}
        assert checks["compile"]["status"] == "fail"
        assert "no C++ compiler" in checks["compile"]["reason"]
        # Judged against what its own torch says it is.
        assert checks["environment"]["measurements"]["torch"].startswith("2.6.0")
        assert checks["nccl"]["status"] == "pass"
        (notice,) = [line for line in done.stderr.splitlines() if line.startswith("notice:")]
        assert "carries no imagebuilder labels" in notice and "torch 2.6.0" in notice
        assert doc["notices"] == [notice]
        assert "error:" in done.stderr and "compile" in done.stderr
    finally:
        remove_local_tags(docker_engine, registry)


def test_a_cuda_image_without_a_gpu_is_not_green(docker_engine, runtime_image):
    """`docker run IMAGE python -m smoke_tests` without --gpus: a CUDA image fails, saying how
    to skip on purpose; with --allow-no-gpu the summary counts the skips, not passes.
    The runtime guard admits the drivers the wheels run on (minor-version compatibility)."""
    from imagebuilder.verify.output import parse_output

    ref = runtime_image["tags"][0]
    checks = ["python", "-m", "smoke_tests", "--checks", "environment,cuda"]
    required = docker_engine.run(ref, checks, timeout=300)
    assert required.exit_code == 1, required.output[-2000:]
    assert "pass --allow-no-gpu to skip the GPU checks on purpose" in required.output
    assert "FAILED: 1 failed, 1 passed" in required.output
    allowed = docker_engine.run(ref, checks + ["--allow-no-gpu", "--json"], timeout=300)
    assert allowed.exit_code == 0, allowed.output[-2000:]
    assert [(c.name, c.status) for c in parse_output(allowed.output, allowed.exit_code).checks] == [
        ("environment", "pass"), ("cuda", "skip")]
    env = docker_engine.run(ref, ["sh", "-c", "echo $NVIDIA_REQUIRE_CUDA"], timeout=60)
    assert env.output.strip() == "cuda>=12.0"
