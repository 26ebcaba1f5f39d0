"""`publish --squashfs`: beside each published image, its root as a squashfs artifact.

After an image is pushed (and signed), or when the run finds it published already (skipped or
re-pointed), its platform image's digest gets the squashfs artifact (squashfs/artifact.py),
unless the registry lists one for that digest already: an image published before the option
was turned on gets its squashfs from the next run, and a run again costs a lookup. The squashfs
is made from the registry's own blobs (squashfs/make.py), so it is what was verified and
pushed, in a temp folder that is removed afterwards, with its chunk table (the sha256 of each
1 MiB, squashfs/chunks.py) as a second blob for nodes that read it lazily; with a signer, the artifact is signed as
the image is. A squashfs that fails fails its image, which stays pushed.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from ..errors import ImageBuilderError
from ..registry.reference import pinned
from ..squashfs.artifact import (BLOCK_SIZE, COMPRESSION, ENROOT_CONFIG, FLATTENED_BY, ArtifactRegistry, Pushed,
                                 find_artifact, push_artifact)
from ..squashfs.chunks import digest_and_table
from ..squashfs.fetch import image_digest
from ..squashfs.make import BLOCK_SIZE as BLOCK_BYTES
from ..squashfs.make import COMPRESSION as ZSTD
from ..squashfs.make import LEVEL, LayerRegistry, make_squashfs
from ..trust.signing import Signed, Signer
from .plan import FAILED, PUSHED, RETAGGED, SKIPPED, Outcome


class SquashfsRegistry(ArtifactRegistry, LayerRegistry, Protocol):
    """What publishing a squashfs needs of a registry (registry.client.HttpRegistry)."""


@dataclass(frozen=True)
class SquashfsOutcome:
    image: str
    """REPOSITORY@DIGEST of the platform image the squashfs is of."""
    artifact: str
    blob: str
    size: int
    """The squashfs's bytes: what the registry stores, and a node downloads, in addition to the image."""
    created: bool
    """False: the registry had it for this digest already."""
    seconds: float = 0.0
    unpacked_bytes: int | None = None
    referrers_tag: str | None = None
    signed: Signed | None = None

    def to_json(self) -> dict[str, Any]:
        return {"image": self.image, "artifact": self.artifact, "blob": self.blob, "size": self.size,
                "created": self.created, "seconds": round(self.seconds, 2), "unpacked_bytes": self.unpacked_bytes,
                "referrers_tag": self.referrers_tag, "signed": self.signed.to_json() if self.signed else None}


@dataclass(frozen=True)
class SquashfsPublisher:
    """Made at the edge (cli), handed to the run in RunOptions.squashfs."""

    registry: SquashfsRegistry
    signer: Signer | None = None
    level: int = LEVEL
    workdir: Path | None = None
    """Where the temp folder goes (the unpacked root: 2-3x the image's compressed size); None: $TMPDIR."""
    say: Callable[[str], None] = print

    def ensure(self, ref: str, platform: str) -> SquashfsOutcome:
        """The squashfs artifact of image `ref` (a tag or REPOSITORY@DIGEST) for `platform`."""
        image = image_digest(self.registry, ref, platform)
        found = find_artifact(self.registry, image)
        if found is not None:
            artifact, layer = found
            return SquashfsOutcome(image, artifact, str(layer["digest"]), int(layer.get("size") or 0), created=False)
        started = time.monotonic()
        folder = Path(tempfile.mkdtemp(prefix=".imagebuilder-squashfs-out-", dir=self.workdir))
        try:
            made = make_squashfs(self.registry, image, folder / "image.sqfs", level=self.level, say=self.say)
            blob, table = digest_and_table(made.path)
            self.say(f"{image.partition('@')[0]}: pushing its squashfs ({made.size} bytes)")
            with open(made.path, "rb") as squashfs:
                pushed = push_artifact(self.registry, image, squashfs, blob, made.size, {
                    COMPRESSION: f"{ZSTD}:{self.level}", BLOCK_SIZE: str(BLOCK_BYTES),
                    FLATTENED_BY: f"imagebuilder ({made.tool} {' '.join(made.options)})", ENROOT_CONFIG: "true"},
                    chunk_table=table)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        signed = self.signer.sign(pushed.ref, None) if self.signer is not None else None
        return _outcome(image, pushed, made.unpacked_bytes, time.monotonic() - started, signed)


def _outcome(image: str, pushed: Pushed, unpacked: int, seconds: float, signed: Signed | None) -> SquashfsOutcome:
    return SquashfsOutcome(image, pushed.ref, pushed.blob, pushed.size, created=True, seconds=seconds,
                           unpacked_bytes=unpacked, referrers_tag=pushed.fallback, signed=signed)


def with_squashfs(publisher: SquashfsPublisher, outcome: Outcome, platform: str) -> Outcome:
    """The run's hook: `outcome` of a published image, with its squashfs (or failed for it)."""
    if outcome.status not in (PUSHED, SKIPPED, RETAGGED):
        return outcome
    digest = outcome.pushed.get(outcome.step.image.ref) or outcome.step.digest
    if digest is None:
        return outcome
    try:
        done = publisher.ensure(pinned(outcome.step.image.ref, digest), platform)
    except (ImageBuilderError, LookupError, OSError) as e:
        return replace(outcome, status=FAILED, reason=f"{outcome.reason}; published, but its squashfs failed: {e}")
    return replace(outcome, squashfs=done.to_json())

