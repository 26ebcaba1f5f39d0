"""`imagebuilder squashfs` and `squashfs-release`: the squashfs `publish --squashfs` pushed, fetched
(or served lazily) for pyxis/enroot, and a lazy one released. Parse, call squashfs/, print."""

from __future__ import annotations

from pathlib import Path

import click

from . import options
from .context import progress
from ..platforms import DEFAULT_PLATFORM
from ..registry import RetryPolicy


@click.command("squashfs")
@click.argument("image")
@click.option("-o", "--output", required=True, type=click.Path(path_type=Path), metavar="FILE",
              help="Where to write the squashfs (atomically: a temp file beside it, renamed).")
@click.option("--key", metavar="PUB", default=None,
              help="Check the artifact's cosign signature with this public key before downloading it.")
@click.option("--platform", default=DEFAULT_PLATFORM, show_default=True, metavar="OS/ARCH",
              help="The image of a multi-platform tag whose squashfs to fetch.")
@click.option("--lazy", is_flag=True,
              help="Serve FILE at once and fetch its bytes as they are read (nbdkit and nbdfuse; each 1 MiB "
                   "checked against the signed chunk table); the mount stays until `imagebuilder squashfs-release "
                   "FILE`.")
@options.registry_timeout
def squashfs(image: str, output: Path, key: str | None, platform: str, lazy: bool,
             registry_policy: RetryPolicy) -> None:
    """Fetch the squashfs `publish --squashfs` pushed beside IMAGE into FILE, for pyxis/enroot.

    Exit 1 when the registry has none for the image's digest.

    \b
    Examples:
      imagebuilder squashfs registry.example.com/ml/pytorch:2.6.0-cuda12.4-cudnn9-runtime -o /tmp/torch.sqfs
      imagebuilder squashfs 127.0.0.1:5000/ml/pytorch:TAG -o torch.sqfs --key cosign.pub
      imagebuilder squashfs 127.0.0.1:5000/ml/pytorch:TAG -o torch.sqfs --lazy
    """
    from ..build import parse_platforms
    from ..registry.client import HttpRegistry
    from ..registry import parse_reference
    from ..squashfs.fetch import check_output, fetch_squashfs
    from ..trust import key_reference

    parse_reference(image)
    (platform,) = parse_platforms(platform)
    check_output(output)
    pub = key_reference(key, "--key") if key is not None else None
    if pub is not None and Path(pub).is_file():  # (a KMS key is asked for where it is used)
        from ..trust.cosign import Cosign

        Cosign().require().try_public_key(pub, "--key")
    if lazy:
        from ..squashfs.lazy import Mounted, mount_lazy

        served = mount_lazy(HttpRegistry(policy=registry_policy), image, output, key=pub, platform=platform,
                            timeout_s=registry_policy.timeout_s, say=progress)
        if isinstance(served, Mounted):
            return
        fetched = served  # published before the chunk table: downloaded whole
    else:
        fetched = fetch_squashfs(HttpRegistry(policy=registry_policy), image, output, key=pub, platform=platform,
                                 say=progress)
    progress(f"wrote {fetched.path} ({fetched.size} bytes, the squashfs of {fetched.image}) in {fetched.seconds:.1f} s")


@click.command("squashfs-release")
@click.argument("file", type=click.Path(path_type=Path))
def squashfs_release(file: Path) -> None:
    """Unmount FILE served by `imagebuilder squashfs --lazy`, and remove it and its cache. Anything
    else at FILE is left alone. Safe to repeat.

    \b
    Example:
      imagebuilder squashfs-release /tmp/torch.sqfs
    """
    from ..squashfs.lazy import release

    progress(f"{file}: released" if release(file) else
             f"{file}: nothing to release (not served by `imagebuilder squashfs --lazy`)")
