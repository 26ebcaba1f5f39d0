"""Pure: an ImagePlan -> Dockerfile text, build-context files and the inputs hash (Jinja2,
StrictUndefined).

image_plan.py decides; here the plan only fills the templates, which read its small frozen
values by attribute (plan.base, plan.ca, plan.mounts, plan.steps, ...). Same plan, same bytes:
nothing here reads the clock, the environment, the host or a file but the templates.
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

from .. import __version__
from ..lock.base_pin import BasePin
from ..lock.lockfile import Lock
from ..matrix.resolve import BuildSpec
from ..matrix.variants import variant
from ..resources import templates_dir
from .context_folder import write_tree
from .image_contents import (COMPILE_CACHE, COMPILE_CACHES, ENTRYPOINT, HOME, SESSION_ENV, TENSORBOARD_LOGDIR,
                             TENSORBOARD_PATH, TENSORBOARD_START_TIMEOUT_S, USER_ID, USER_NAME, VENV, WORKSPACE,
                             env_for, has_ssh, manifest_for, python_path)
from .image_plan import PYTHON_START as PYTHON_START
from .image_plan import ImagePlan
from .security_step import fixes_label
from .install_steps import LAYER_EPOCH
from .render_options import DEFAULT_SOURCE
from .tags import image_ref, labels_for

# Files the image carries at these paths (context folder rootfs/), rendered from templates/.
ROOTFS_TEMPLATES = {"usr/local/bin/imagebuilder-entrypoint": "entrypoint.sh.j2"}
SSH_ROOTFS_TEMPLATES = {"usr/local/bin/ssh-server": "ssh-server.sh.j2",
                        "etc/ssh/sshd_config.d/imagebuilder.conf": "sshd.conf.j2"}
# jupyter, devel-jupyter: Jupyter's settings, in its system-wide config folder (read before the
# user's ~/.jupyter, so a user's own file still wins).
JUPYTER_ROOTFS_TEMPLATES = {"etc/jupyter/jupyter_server_config.py": "jupyter_server_config.py.j2"}
PYTHON_START_TEMPLATE = "python_start.py.j2"


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
    security_fixes: str = ""  # the OS security fixes its apt step applies (labels.SECURITY_FIXES)

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
class Naming:
    """What names an image without changing its content: left out of the inputs hash."""

    tags: tuple[str, ...]
    generator: str
    matrix_name: str
    source: str


# The values the templates read by attribute, beside the plan's (image_plan.Base, CaMode, Mounts, ...).
@dataclass(frozen=True)
class Session:
    env_file: str  # the container's environment, for SSH sessions
    # bash reads bash.bashrc for `ssh HOST CMD` too; its first line runs before the file
    # returns for non-interactive shells.
    env: str = f'[ -n "${{SSH_CONNECTION:-}}" ] && [ -r {SESSION_ENV} ] && . {SESSION_ENV}'


@dataclass(frozen=True)
class Shm:
    floor: int
    advice: str


@dataclass(frozen=True)
class Tensorboard:
    path: str
    logdir: str
    start_timeout: int


SESSION, SHM = Session(SESSION_ENV), Shm(NCCL_SHM_MIN_BYTES, SHM_ADVICE)
TENSORBOARD = Tensorboard(TENSORBOARD_PATH, TENSORBOARD_LOGDIR, TENSORBOARD_START_TIMEOUT_S)
# The draft: the image rendered without the names it goes by, to hash.
DRAFT = Naming((), "imagebuilder", "matrix.yaml", DEFAULT_SOURCE)


def render(plan: ImagePlan) -> RenderedImage:
    """The plan as its Dockerfile and build context. The inputs hash covers what defines the
    image's content: the Dockerfile and the files copied in, rendered without the names it
    goes by (tags move to other images when a release is added; the tool's version and the
    matrix's file name change no byte installed), the lock (a file copied in), the base
    image's digest (in FROM, or its image id) and a jupyter image's parent's inputs hash.
    publish compares it with the registry's copy."""
    draft, draft_files = _fill(plan, DRAFT, "")
    inputs_hash = _hash(draft, {k: v for k, v in draft_files.items() if _hashed(k)},
                        plan.base.pin.identity if plan.base.pin else "", plan.parent_hash)
    naming = Naming(plan.tags, f"imagebuilder {__version__}", plan.matrix.path.name, plan.source)
    dockerfile, files = _fill(plan, naming, inputs_hash)
    return RenderedImage(
        spec=plan.spec,
        repository=plan.repository,
        tags=plan.tags,
        dockerfile=dockerfile,
        files={**files, **plan.ca_files},
        labels=_labels(plan, inputs_hash, plan.source),
        inputs_hash=inputs_hash,
        base_image=plan.base.image,
        trusts_ca_bundle=plan.trusts_ca_bundle,
        secrets=plan.secrets,
        contexts=plan.contexts,
        lock=plan.lock,
        base_pin=plan.base.pin,
        notices=plan.notices,
        security_fixes=fixes_label(plan.security.fixes.expected),
    )


def _labels(plan: ImagePlan, inputs_hash: str, source: str) -> dict[str, str]:
    pin = plan.base.pin
    return labels_for(plan.spec, plan.base.image, inputs_hash, source, pin.digest if pin else None,
                      fixes_label(plan.security.fixes.expected))


def _fill(plan: ImagePlan, naming: Naming, inputs_hash: str) -> tuple[str, dict[str, bytes]]:
    """The Dockerfile and the context's files under `naming`."""
    env, spec = _environment(str(templates_dir())), plan.spec
    context = _context(plan, naming, inputs_hash)
    files = dict(plan.files)
    files[f"imagebuilder/{PYTHON_START}.py"] = env.get_template(PYTHON_START_TEMPLATE).render(
        compile_cache=COMPILE_CACHE).encode()
    if spec.parent is None:
        rootfs = {**ROOTFS_TEMPLATES, **(SSH_ROOTFS_TEMPLATES if has_ssh(spec) else {})}
    else:  # a jupyter image has its parent's files, and adds Jupyter's settings
        rootfs = JUPYTER_ROOTFS_TEMPLATES
    files.update({f"rootfs/{path}": env.get_template(name).render(context).encode() for path, name in rootfs.items()})
    manifest = manifest_for(spec, plan.matrix, inputs_hash, naming.tags, plan.base.image, naming.matrix_name)
    files["imagebuilder/manifest.json"] = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    template = env.get_template("jupyter.Dockerfile.j2" if spec.parent is not None else "Dockerfile.j2")
    return template.render(context), files


def _context(plan: ImagePlan, naming: Naming, inputs_hash: str) -> dict[str, object]:
    """What the templates read: the plan's values, the image's paths, its labels."""
    spec = plan.spec
    return {
        "naming": naming, "spec": spec, "python": str(spec.python), "notices": plan.notices,
        "base": plan.base, "ca": plan.ca, "mounts": plan.mounts, "steps": plan.steps, "packages": plan.packages,
        "security": plan.security,
        "labels": [(k, json.dumps(v)) for k, v in _labels(plan, inputs_hash, naming.source).items()],
        "env": env_for(spec), "python_path": python_path(spec), "venv": VENV,
        "user": USER_NAME, "uid": USER_ID, "workspace": WORKSPACE, "home": HOME, "compile_caches": COMPILE_CACHES,
        "layer_epoch": LAYER_EPOCH, "entrypoint": json.dumps(list(ENTRYPOINT)), "ssh": has_ssh(spec),
        "run_as_root": variant(spec.variant).root, "cmd": json.dumps(list(variant(spec.variant).cmd)),
        "session": SESSION, "shm": SHM, "tensorboard": TENSORBOARD,
    }
