"""`render`'s build contexts on disk: one image's context (and the `docker build` line that
builds it), or several, a folder each with an index.json in build order (`render --all`, and
`render -o` of a parent that comes along or of several platforms)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..matrix.model import Matrix
from ..matrix.selection import Note, Selection
from .context_folder import write_tree
from .install_steps import SECRET_SOURCES
from .per_platform import Reading, each_platform
from .platforms import arch, host_platform
from .render import RenderedImage
from .render_options import RenderOptions

Folder = tuple[str, str | None, RenderedImage]  # (folder, platform when several, image)


def index_document(entries: Sequence[Folder]) -> dict[str, Any]:
    """index.json beside several build contexts: each folder's image, in build order."""
    return {
        "images": [
            {"dir": folder, "ref": image.ref, "tags": list(image.tags), "depends_on": image.depends_on,
             "inputs_hash": image.inputs_hash, **({"platform": platform} if platform else {})}
            for folder, platform, image in entries
        ]
    }


def context_files(entries: Sequence[Folder]) -> dict[str, bytes]:
    """Several build contexts as one tree: a folder per image (Dockerfile and files) and index.json."""
    files: dict[str, bytes] = {}
    for folder, _, image in entries:
        files.update({f"{folder}/{name}": data for name, data in image.files.items()})
        files[f"{folder}/Dockerfile"] = image.dockerfile.encode()
    files["index.json"] = (json.dumps(index_document(entries), indent=2) + "\n").encode()
    return files


def render_tree(matrix: Matrix, selection: Selection, options: RenderOptions,
                note: Note) -> tuple[int, dict[str, bytes]]:
    """`render --all`: every selected image's build context in a folder named for it, and an
    index.json of them all; (the number of images, the files by relative name)."""
    (selected,) = each_platform(matrix, selection, options, [host_platform()], Reading(request=False, parents=False, builds=False),
                                read_os_release=None, note=note)
    images = selected.images
    return len(images), context_files([(image.spec.key, None, image) for image in images])


def plan_folders(plan: Sequence[tuple[str, RenderedImage]]) -> list[Folder]:
    """`render -o` of several images: a folder per planned image, named for it (and for its
    platform's arch when there are several platforms)."""
    several = len({platform for platform, _ in plan}) > 1
    return [(f"{image.spec.key}-{arch(platform)}" if several else image.spec.key, platform if several else None, image)
            for platform, image in plan]


def write_all(output: Path, count: int, files: Mapping[str, bytes]) -> list[str]:
    """`render --all -o`: every context into `output`; what was written and what went, a line
    each. A folder of an earlier render keeps only what this one asked for, and says so."""

    removed = {name.split("/", 1)[0] for name in write_tree(output, files) if "/" in name}
    return [f"wrote {count} images to {output}"] + (
        [f"removed the build contexts of {len(removed)} images an earlier render wrote there and this one did not "
         "ask for (filters choose the images: render --all without them writes every image)"] if removed else [])


def write_contexts(plan: Sequence[tuple[str, RenderedImage]], output: Path) -> list[str]:
    """`render -o`: one image's context into `output`, or several (a parent that comes along,
    several platforms) a folder each with index.json; what was written, a line each."""

    if len(plan) == 1:
        platform, image = plan[0]
        image.write(output)
        secrets = "".join(f" --secret id={name},src={SECRET_SOURCES.get(name, name.upper())}" for name in sorted(image.secrets))
        secrets += "".join(f" --build-context {name}={shlex.quote(str(output / name))}" for name in image.contexts)
        target = f" --platform {platform}" if platform != host_platform() else ""
        return [f"wrote {output}/Dockerfile for {image.ref}",
                f"build it: docker build{target} -t {image.ref}{secrets} {shlex.quote(str(output))}"]
    folders = plan_folders(plan)
    write_tree(output, context_files(folders))
    return [f"wrote {len(plan)} build contexts to {output}, in build order (index.json):",
            *(f"  {folder}/  {planned.ref}" for folder, _, planned in folders)]
