"""What the registry holds under each image's tags: the reads plan() decides from.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date

from ..build.render import RenderedImage
from ..registry.api import Registry, RegistryUndelivered
from ..registry.reference import pinned
from ..trust.labels import INPUTS_HASH, SECURITY_FIXES
from ..trust.signing import has_signature
from .plan import Remote, dated_ref

# --------------------------------------------------------------------------- lookup (I/O)


def lookup(registry: Registry, images: Iterable[RenderedImage], day: date | None = None,
           signing: bool = False) -> dict[str, Remote]:
    """Ask the registry about every tag of every image, the day's dated one included (HEADs,
    and one config blob each); `signing`: also whether the primary tag's image is signed."""
    remotes: dict[str, Remote] = {}
    for image in images:
        refs = image.refs + ((dated_ref(image, day),) if day is not None else ())
        digests = {ref: registry.digest(ref) for ref in refs}
        primary = digests[image.ref]
        labels = signed = None
        if primary is not None:
            # By digest: the labels of exactly the image whose digest we compare.
            labels = registry.labels(pinned(image.ref, primary))
            if labels is None:  # the tag named it a moment ago: a registry that cannot deliver it is at fault
                raise RegistryUndelivered(digest=primary, what=f"what {image.ref} names", url=pinned(image.ref, primary),
                                          answer="no such manifest")
            if signing:
                signed = has_signature(registry, pinned(image.ref, primary))
        remotes[image.ref] = Remote(digests, (labels or {}).get(INPUTS_HASH), signed,
                                    (labels or {}).get(SECURITY_FIXES, "") if labels is not None else None)
    return remotes


