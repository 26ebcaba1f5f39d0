"""Pure: BuildSpec -> Dockerfile text and build-context files (Jinja2, StrictUndefined).

Python computes every value and list; the templates only loop and lay out. Same inputs,
same bytes: nothing here reads the clock, the environment or the host.

The values are image_contents.py's (paths, packages, environment, manifest) and
install_steps.py's (the install RUNs and their mounts); here they become the template
context, the context files and the inputs hash.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from smoke_tests.shm import NCCL_SHM_MIN_BYTES, SHM_ADVICE

from . import __version__
from .base_pin import BasePin
from .errors import BadRequest
from .image_contents import (CA_PATH, COMPILE_CACHE, COMPILE_CACHES, ENTRYPOINT, HOME, JUPYTER_LOCK_PATH, LOCK_PATH, SBOM_PATH,
                             SESSION_ENV, TENSORBOARD_LOGDIR, TENSORBOARD_PATH, TENSORBOARD_START_TIMEOUT_S, USER_ID,
                             USER_NAME, VENV, WORKSPACE, apt_packages, constraints_for, env_for, has_ssh,
                             manifest_for, nvcc_check, python_path)
from .install_steps import (ADDED_LOCK_PATH, CA_CONTEXT, CA_CONTEXT_FILE, CA_SECRET_ID, LAYER_EPOCH, LAYERS_DIR,
                            NETRC_SECRET_ID, added_commands, apt_mount, apt_options, index_netrc, install_commands,
                            jupyter_commands, native_install, native_uv_run, run_mounts, shared_venv, torch_layers)
from .layers import wheel_groups
from .lockfile import Lock, check_extras, parse_extras
from .matrix import Matrix
from .resolve import BuildSpec
from .output import write_tree
from .render_options import DEFAULT_SOURCE, RenderOptions
from .resources import smoke_tests_dir, templates_dir
from .tags import image_ref, labels_for, primary_tag, tags_for
from .variants import variant

# Files the image carries at these paths (context folder rootfs/), rendered from templates/.
ROOTFS_TEMPLATES = {"usr/local/bin/imagebuilder-entrypoint": "entrypoint.sh.j2"}
SSH_ROOTFS_TEMPLATES = {"usr/local/bin/ssh-server": "ssh-server.sh.j2",
                        "etc/ssh/sshd_config.d/imagebuilder.conf": "sshd.conf.j2"}
# jupyter, devel-jupyter: Jupyter's settings, in its system-wide config folder (read before the
# user's ~/.jupyter, so a user's own file still wins).
JUPYTER_ROOTFS_TEMPLATES = {"etc/jupyter/jupyter_server_config.py": "jupyter_server_config.py.j2"}
# The module every Python start of the image imports (from /opt/imagebuilder, by imagebuilder.pth).
PYTHON_START, PYTHON_START_TEMPLATE = "imagebuilder_start", "python_start.py.j2"


class CredentialsNeedBuildKit(BadRequest):
    template = ("the index URL carries a user or password, which the classic builder would write into the "
                "image's history; use --builder buildkit (they reach the build as a secret) or an index without them")


@dataclass(frozen=True)
class RenderedImage:
    spec: BuildSpec
    repository: str
    tags: tuple[str, ...]
    dockerfile: str
    files: Mapping[str, bytes] = field(repr=False)  # context files besides the Dockerfile
    labels: Mapping[str, str] = field(repr=False)
    inputs_hash: str = ""
    base_image: str = ""  # the FROM image; for jupyter, our runtime image
    trusts_ca_bundle: bool = False  # built with --ca-bundle
    secrets: Mapping[str, bytes] = field(default_factory=dict, repr=False)  # BuildKit secrets by id
    # Named build contexts (buildx's --build-context NAME=DIR): folders of `files` that no COPY
    # takes, each passed by its name; the CA bundle's (CA_CONTEXT) when ca_context.
    contexts: tuple[str, ...] = ()
    lock: Lock | None = field(default=None, repr=False)  # None: resolved at build time
    base_pin: BasePin | None = None  # how the FROM image is pinned (None for jupyter)
    notices: tuple[str, ...] = ()  # the spec's, and what is not pinned

    @property
    def refs(self) -> tuple[str, ...]:
        return tuple(image_ref(self.repository, t) for t in self.tags)

    @property
    def ref(self) -> str:
        return self.refs[0]

    @property
    def depends_on(self) -> str | None:
        """The image this one is built FROM when that image is one of ours (jupyter)."""
        return self.base_image if self.spec.parent is not None else None

    def write(self, directory: Path) -> None:
        """Write the build context into `directory` (empty, or written by imagebuilder)."""
        write_tree(directory, {**self.files, "Dockerfile": self.dockerfile.encode()})


@lru_cache(maxsize=4)
def _environment(template_root: str) -> Any:
    import jinja2  # here, not at the top: `imagebuilder --help` should not pay for it

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(template_root),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


@lru_cache(maxsize=1)
def _smoke_test_files() -> tuple[tuple[str, bytes], ...]:
    root = smoke_tests_dir()
    return tuple(
        (f"imagebuilder/smoke_tests/{p.relative_to(root).as_posix()}", p.read_bytes())
        for p in sorted(root.rglob("*.py"))
    )


def _hash(dockerfile: str, files: Mapping[str, bytes], *extra: str) -> str:
    digest = hashlib.sha256(dockerfile.encode())
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name] + b"\0")
    for value in extra:
        digest.update(value.encode() + b"\0")
    return digest.hexdigest()


def _hashed(name: str) -> bool:
    """The smoke tests are lent to the image at verify time (publish mounts the current ones),
    so editing them rebuilds nothing; the image's own copy is as of its build."""
    return not name.startswith("imagebuilder/smoke_tests/")


@dataclass(frozen=True)
class _Naming:
    """What names an image without changing its content: left out of the inputs hash."""

    tags: tuple[str, ...]
    generator: str
    matrix_name: str
    source: str


def _sbom_file() -> bytes:
    return (Path(__file__).parent / "sbom.py").read_bytes()


def render(spec: BuildSpec, matrix: Matrix, options: RenderOptions = RenderOptions()) -> RenderedImage:
    env = _environment(str(templates_dir()))
    repository = options.repository or matrix.defaults.repository
    tags = tags_for(spec, matrix)
    extras = parse_extras((*matrix.extras, *options.extras))
    lock = options.locks.lock_for(spec, matrix, extras)
    check_extras(spec, extras, lock)
    base_pin: BasePin | None = None
    parent_hash = ""
    if spec.parent is not None:
        # FROM our runtime image by tag: what defines that image is its own inputs hash.
        base_image = from_ref = image_ref(repository, primary_tag(spec.parent, matrix))
        parent_hash = render(spec.parent, matrix, options).inputs_hash
    else:
        base_pin = options.locks.base_for(spec.base_image)
        base_image, from_ref = spec.base_image, base_pin.from_ref
    notices = list(spec.notices)
    if lock is None:
        notices.append("no lock for this image in locks/: the build resolves its dependencies "
                       "(run `imagebuilder lock` to pin them)")
    if base_pin is not None and not base_pin.identity:
        notices.append(f"base image {base_image} has no digest in locks/base-images.json: FROM by tag")
    files: dict[str, bytes] = dict(_smoke_test_files())
    # /opt/imagebuilder on the venv's path makes `python -m smoke_tests` work; its second line
    # keeps the image's run contract where no entrypoint runs (pyxis, apptainer exec).
    files["imagebuilder.pth"] = f"/opt/imagebuilder\nimport {PYTHON_START}\n".encode()
    files[f"imagebuilder/{PYTHON_START}.py"] = env.get_template(PYTHON_START_TEMPLATE).render(
        compile_cache=COMPILE_CACHE).encode()
    files["imagebuilder/sbom.py"] = _sbom_file()
    lock_path = JUPYTER_LOCK_PATH if spec.parent is not None else LOCK_PATH
    if lock is not None:
        files[lock_path.replace("/opt/", "", 1)] = lock.text().encode()
    if spec.parent is None:
        files["imagebuilder/constraints.txt"] = constraints_for(spec, lock).encode()
    ca = options.ca_bundle
    two_stage = ca is not None and not options.buildkit
    venv = shared_venv(spec, matrix, options, lock, extras)
    if venv is not None:
        files.update({f"{LAYERS_DIR}/{group.filename}": group.lock.text().encode()
                      for group in wheel_groups(venv.lock)})
        if venv.added is not None:
            files[ADDED_LOCK_PATH.replace("/opt/", "", 1)] = venv.added.text().encode()
    credentials = index_netrc(options)
    if credentials and not options.buildkit:
        raise CredentialsNeedBuildKit()
    apt_mounts, install_mounts = run_mounts(options)
    native = native_install(spec, options, venv)
    native_apt_mounts = apt_mounts
    if native is not None:
        # apt's cache mount is locked while one apt runs: the image's apt, emulated, takes one of
        # its own machine type's, so that the native stage's apt does not wait minutes for it.
        apt_mounts = apt_mount(native.platform.rpartition("/")[2])
        notices.append(f"{native.platform} on a host of another platform: its wheels install natively "
                       f"(uv --python-platform {native.uv_platform}); apt, the SBOM and what runs the image's "
                       "own programs run under emulation")
    elif options.foreign_platform is not None:
        notices.append(f"{options.foreign_platform} on a host of another platform: every step runs under "
                       "emulation (the wheels install natively only with BuildKit, the shared venv and "
                       "the OS's Python)")

    def render_with(inputs_hash: str, naming: _Naming) -> tuple[str, dict[str, bytes]]:
        labels = labels_for(spec, base_image, inputs_hash, naming.source, base_pin.digest if base_pin else None)
        manifest = manifest_for(spec, matrix, inputs_hash, naming.tags, base_image, naming.matrix_name)
        context = {
            "generator": naming.generator,
            "matrix_name": naming.matrix_name,
            "spec": spec,
            "notices": notices,
            "tags": naming.tags,
            "base_image": from_ref,
            "base_pin": base_pin,
            "two_stage": two_stage,
            "nvcc_check": nvcc_check(spec),
            "shared_venv": venv is not None,
            "added_lock_path": ADDED_LOCK_PATH,
            "added": venv is not None and venv.added is not None,
            "torch_layers": [] if venv is None else torch_layers(spec, matrix, options, venv, install_mounts, native),
            "native": native,
            "native_uv": native_uv_run(matrix, options, install_mounts, native) if native else None,
            "native_apt_mounts": native_apt_mounts,
            "layer_epoch": LAYER_EPOCH,
            "added_commands": added_commands(spec, matrix, options) if venv and venv.added else [],
            "ca_path": CA_PATH,
            "buildkit": options.buildkit,
            "ca_secret": options.buildkit and ca is not None,
            "ca_context": options.buildkit and ca is not None and options.ca_context,
            "apt_mounts": apt_mounts,
            "apt_options": apt_options(options),
            "install_mounts": install_mounts,
            "lock_path": lock_path if lock is not None else None,
            "sbom_command": f"{VENV}/bin/python /opt/imagebuilder/sbom.py {VENV} {SBOM_PATH}",
            "install_commands": install_commands(spec, matrix, options, not two_stage, lock, extras),
            "jupyter_commands": jupyter_commands(spec, matrix, options, not two_stage, lock),
            "build_packages": apt_packages(spec, "wheels"),
            "final_packages": apt_packages(spec, "final"),
            "python": str(spec.python),
            "python_path": python_path(spec),
            "venv": VENV,
            "env": env_for(spec),
            "labels": [(k, json.dumps(v)) for k, v in labels.items()],
            "user": USER_NAME,
            "uid": USER_ID,
            "workspace": WORKSPACE,
            "home": HOME,
            "compile_caches": COMPILE_CACHES,
            "entrypoint": json.dumps(list(ENTRYPOINT)),
            "ssh": has_ssh(spec),
            "run_as_root": variant(spec.variant).root,
            "cmd": json.dumps(list(variant(spec.variant).cmd)),
            "session_env_file": SESSION_ENV,
            "shm_floor": NCCL_SHM_MIN_BYTES,
            "shm_advice": SHM_ADVICE,
            # bash reads bash.bashrc for `ssh HOST CMD` too; its first line runs before the
            # file returns for non-interactive shells.
            "session_env": f'[ -n "${{SSH_CONNECTION:-}}" ] && [ -r {SESSION_ENV} ] && . {SESSION_ENV}',
            "tensorboard_path": TENSORBOARD_PATH,
            "tensorboard_logdir": TENSORBOARD_LOGDIR,
            "tensorboard_start_timeout": TENSORBOARD_START_TIMEOUT_S,
        }
        template = env.get_template("jupyter.Dockerfile.j2" if spec.parent is not None else "Dockerfile.j2")
        out = dict(files)
        if spec.parent is None:
            rootfs = {**ROOTFS_TEMPLATES, **(SSH_ROOTFS_TEMPLATES if has_ssh(spec) else {})}
        else:  # a jupyter image has its parent's files, and adds Jupyter's settings
            rootfs = JUPYTER_ROOTFS_TEMPLATES
        out.update({f"rootfs/{path}": env.get_template(name).render(context).encode()
                    for path, name in rootfs.items()})
        out["imagebuilder/manifest.json"] = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
        return template.render(context), out

    # The hash covers what defines the image's content: the Dockerfile and the files copied
    # in, rendered without the names it goes by (tags move to other images when a release
    # is added; the tool's version and the matrix's file name change no byte installed),
    # the lock (a file copied in) and the base image's digest (in FROM, or its image id).
    # publish compares it with the registry's copy.
    draft, draft_files = render_with("", _Naming((), "imagebuilder", "matrix.yaml", DEFAULT_SOURCE))
    inputs_hash = _hash(draft, {k: v for k, v in draft_files.items() if _hashed(k)},
                        base_pin.identity if base_pin else "", parent_hash)
    naming = _Naming(tags, f"imagebuilder {__version__}", matrix.path.name, options.source)
    dockerfile, final_files = render_with(inputs_hash, naming)
    secrets: dict[str, bytes] = {}
    contexts: tuple[str, ...] = ()
    if ca is not None and two_stage:
        final_files["ca-bundle.pem"] = ca
    elif ca is not None and options.ca_context:
        final_files[f"{CA_CONTEXT}/{CA_CONTEXT_FILE}"] = ca
        contexts = (CA_CONTEXT,)
    elif ca is not None:
        secrets[CA_SECRET_ID] = ca
    if credentials:
        secrets[NETRC_SECRET_ID] = credentials
    return RenderedImage(
        spec=spec,
        repository=repository,
        tags=tags,
        dockerfile=dockerfile,
        files=final_files,
        labels=labels_for(spec, base_image, inputs_hash, options.source, base_pin.digest if base_pin else None),
        inputs_hash=inputs_hash,
        base_image=base_image,
        trusts_ca_bundle=ca is not None,
        secrets=secrets,
        contexts=contexts,
        lock=lock,
        base_pin=base_pin,
        notices=tuple(notices),
    )
