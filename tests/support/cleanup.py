"""Removing what a test made on the shared daemon: local tags, and the untagged step images under them."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from imagebuilder.engine.docker import DockerEngine


def local_tags(marker: str) -> list[str]:
    """Every local tag that contains `marker`, from one listing of the daemon's images. Not the
    SDK's images.list(), which inspects each image it listed: an image that another session
    removes in between fails the whole listing (404)."""
    import docker

    client = docker.from_env()
    try:
        return [tag for image in client.api.images() for tag in image.get("RepoTags") or () if marker in tag]
    finally:
        client.close()


def remove_local_tags(docker_engine: DockerEngine, marker: str) -> None:
    """Remove every local tag that contains `marker` (images are GBs; the disk is shared)."""
    remove_images(docker_engine, local_tags(marker))


def remove_images(docker_engine: DockerEngine, refs: list[str]) -> None:
    """Remove these tags, and the untagged step images the classic builder left under them.

    Its step images are its cache: on the containerd image store removing the last tag does
    not always take them along (measured: 9 GB left behind per torch image). Only an image
    that has no tag is removed, and Docker refuses one that another image is built on or a
    container uses: nothing another user still names goes."""
    import docker

    client = docker.from_env()
    try:
        parents: list[str] = []
        for ref in refs:
            with contextlib.suppress(docker.errors.NotFound):
                parents += [step["Id"] for step in client.images.get(ref).history() if step["Id"] != "<missing>"]
        for ref in refs:
            docker_engine.remove_image(ref)
        for image_id in dict.fromkeys(parents):  # newest first: a child before its parent
            try:
                if not client.images.get(image_id).tags:
                    client.images.remove(image_id)
            except docker.errors.APIError:  # gone, named, or built on: not ours to remove
                continue
    finally:
        client.close()
