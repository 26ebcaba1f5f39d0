"""One image to the registry, through the declared Engine and Registry protocols: ask which of
its layer blobs the repository has (for the report: blobs.py), mount the layers its build cache
holds, push each tag and confirm it, keep a registry image that is this very image, point tags,
sign the pushed digests, each once the registry has it whole (its manifest, and every manifest an
index of it lists, answer a HEAD by digest).

A tag counts as pushed only once the registry itself answers with the digest the push
reported: a registry that goes away mid-run never leaves an image reported as published.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..build.image_contents import SBOM_PATH
from ..build.platforms import host_platform
from ..build.render import RenderedImage
from ..build.run import Built
from ..engine.api import Engine
from ..engine.export import Export, gzip_ref
from ..engine.export_decision import ExportDecision
from ..errors import ImageBuilderError
from ..registry.api import Registry
from ..registry.reference import pinned, repository_of
from ..trust.labels import SBOM_DIGEST
from ..trust.signing import SbomNotTheImages, Signed, Signer
from .blobs import Before, Layers, check_before, published_layers, pushed_layers
from .dual import dual_index
from .estargz import Converted, EstargzPublisher
from .plan import RunOptions, Step

class PushNotConfirmed(ImageBuilderError):
    template = ("the push of {ref} reported {pushed} but the registry answers {registry_has}; "
                "another job may push the same tag, or the registry lost the upload: rerun")


class PushedOtherContent(ImageBuilderError):
    template = ("the push of {ref} stored {pushed}, but the image verify ran is {verified}: the engine "
                "changed the image after the check (recompressed it?); nothing pushed counts as published: "
                "rerun on an engine with the containerd image store, or with --compression gzip")


class NotWhole(ImageBuilderError):
    template = "{target} is not whole in the registry ({why}); nothing was signed: rerun to push it again"


def put_tag(registry: Registry, ref: str, digest: str) -> str:
    """Point tag `ref` at `digest` (a manifest PUT) and confirm the registry took it."""
    now = registry.put_tag(ref, digest)
    if now != digest:
        raise PushNotConfirmed(ref=ref, pushed=digest, registry_has=now or "no such tag")
    return now


def export_for(image: RenderedImage, options: RunOptions, registry: Registry) -> Export | None:
    """The image's export: options.export with this image's registry cache, imported where
    the registry has it (BuildKit fails a build whose cache is not there) and exported."""
    decision = ExportDecision(options.export, cache=options.cache_registry, cache_to=True)
    return decision.for_image(image.spec.key, lambda ref: registry.digest(ref) is not None)


def _mount_from_cache(ref: str, engine: Engine, registry: Registry, cache: str,
                      had: Mapping[str, bool]) -> dict[str, str]:
    """Mount the image's layers from its build cache `cache` into its repository before the push;
    the blobs mounted, each with the repository it came from. The build's cache export (mode=min)
    uploaded the image's own blobs there, and `docker push` asks to mount a blob only from
    repositories it pulled or pushed it to itself, so without this the push uploads every layer a
    second time. Only the cache's layers this image has (by uncompressed digest) and its
    repository did not (`had`) are mounted; one the registry will not mount is left to the push,
    and a registry that cannot say fails nothing here (the push says what fails)."""
    mounted: dict[str, str] = {}
    try:
        found = registry.manifest(cache)
        ours = set((engine.inspect_image(ref).get("RootFS") or {}).get("Layers") or ())
        for layer in (found[0].get("layers") or []) if found else []:
            digest = str(layer["digest"])
            if ((layer.get("annotations") or {}).get("containerd.io/uncompressed") in ours and not had.get(digest)
                    and registry.mount(ref, digest, cache)):
                mounted[digest] = repository_of(cache)
    except ImageBuilderError:
        pass
    return mounted


# What makes two images the same image to a container: their layers' content and these settings.
_RUNTIME_CONFIG = ("Env", "Cmd", "Entrypoint", "User", "WorkingDir", "Labels", "ExposedPorts", "Volumes")


def _published_as_built(image: RenderedImage, engine: Engine, registry: Registry, options: RunOptions) -> str | None:
    """The digest `image.ref` names in the registry where that is the image just built and
    verified: the same layers (uncompressed digests), compressed as asked, and the same
    runtime settings and labels. None where it is not, or where the registry cannot tell."""
    compression = options.export.compression if options.export is not None else None
    if compression is None or options.gzip_too:  # gzip+zstd (its index holds two images): pushed again
        return None
    found = registry.image_config(image.ref, options.platform)
    if found is None or not all(m.endswith(compression.media_suffix) for m in found[1]):
        return None
    theirs, local = found[0], engine.inspect_image(image.ref)

    def settings(config: Mapping[str, Any] | None) -> dict[str, Any]:
        return {key: (config or {}).get(key) or None for key in _RUNTIME_CONFIG}

    if ((theirs.get("rootfs") or {}).get("diff_ids") != (local.get("RootFS") or {}).get("Layers")
            or settings(theirs.get("config")) != settings(local.get("Config"))):
        return None
    digest = registry.digest(image.ref)
    return str(digest) if digest else None


def incomplete(registry: Registry, target: str) -> str | None:
    """Why `target` (REPOSITORY@DIGEST) is not whole in the registry, or None: its manifest answers
    a HEAD by digest and, of an index, so does every manifest it lists (a registry takes an image
    manifest only once it has its blobs). Asked right before signing: a signature marks a whole image."""
    digest = target.partition("@")[2]
    if registry.digest(target) != digest:
        return f"the registry has no manifest {digest}"
    found = registry.manifest(target)
    entries = (found[0].get("manifests") or []) if found is not None else []
    missing = [str(e.get("digest")) for e in entries if registry.digest(pinned(target, str(e.get("digest")))) is None]
    return f"its index lists {', '.join(missing)}, which the registry does not have" if missing else None


def sign_pushed(engine: Engine, registry: Registry, image: RenderedImage, pushed: Mapping[str, str],
                signer: Signer, also: Sequence[str] = ()) -> tuple[Signed, ...]:
    """Sign each digest the registry confirmed (one, unless a tag's push went astray), and `also`
    (gzip+zstd: the image manifests its index lists), once each is whole there (incomplete()),
    with the SBOM the pushed image carries attested; that SBOM must be the one its label names."""
    targets = [pinned(image.ref, digest) for digest in dict.fromkeys([*pushed.values(), *also])]
    for target in targets:
        why = incomplete(registry, target)
        if why is not None:
            raise NotWhole(target=target, why=why)
    sbom = engine.read_file(image.ref, SBOM_PATH) or b""
    found, labelled = "sha256:" + hashlib.sha256(sbom).hexdigest(), engine.image_labels(image.ref).get(SBOM_DIGEST)
    if found != labelled:
        raise SbomNotTheImages(target=image.ref, path=SBOM_PATH, found=found if sbom else "missing",
                               label=SBOM_DIGEST, labelled=labelled or "missing")
    return tuple(signer.sign(target, sbom) for target in targets)


@dataclass
class Pushing:
    """What a push got done so far, also when it fails part way."""

    pushed: dict[str, str] = field(default_factory=dict)
    """Refs the registry confirmed, with their digests."""
    uploaded: int = 0
    """Blob bytes the pushes uploaded."""
    published: str | None = None
    """The digest the registry already had for this very image (nothing was uploaded); None: pushed."""
    before: Before = field(default_factory=Before)
    """What the image's repository held before anything was mounted or pushed into it."""
    mounted: dict[str, str] = field(default_factory=dict)
    """Blob digest -> the repository it was mounted from (the build cache's) before the push."""
    instances: tuple[str, ...] = ()
    """gzip+zstd: the gzip and the zstd image manifests the pushed index lists (signed too)."""
    estargz: Converted | None = None
    """--compression estargz: what the push wrote (its start profile, its layers)."""


def push_image(step: Step, built: Built, export: Export | None, engine: Engine, registry: Registry,
               options: RunOptions, done: Pushing) -> None:
    """Push every tag of the image just built and verified, each confirmed by the registry and
    recorded in `done` as it is, then the dated tag; ImageBuilderError when one fails."""
    image = step.image
    done.published = _published_as_built(image, engine, registry, options)
    if done.published is not None:
        # The registry has this very image (BuildKit's new index would differ only in its
        # provenance's timestamps): nothing goes up, and a tag that names another is moved.
        for ref in image.refs:
            done.pushed[ref] = (done.published if registry.digest(ref) == done.published
                                else put_tag(registry, ref, done.published))
    else:
        cache = export.cache_to if export is not None else None
        # Asked before the mount and the push write to the repository, for the report's layers.
        done.before = check_before(registry, image.ref, (cache, image.ref, image.depends_on))
        if cache is not None and options.estargz is None:  # (the cache's blobs are zstd)
            done.mounted = _mount_from_cache(image.ref, engine, registry, cache, done.before.had)
        if options.estargz is not None:
            push_estargz(image.refs, options.estargz, registry, options, done)
        elif built.gzip is not None:
            push_dual(image.refs, built.result.image_id, built.gzip.image_id, engine, registry, options, done)
        else:
            for ref in image.refs:
                done.pushed[ref] = _push_tag(ref, built.result.image_id, engine, registry, options, done)
    if step.dated and registry.digest(step.dated) is None:  # (asked again: --force plans blind)
        # A manifest PUT of the image just pushed: the dated tag needs no local tag.
        done.pushed[step.dated] = put_tag(registry, step.dated, done.pushed[image.ref])


def layers_of(image: RenderedImage, registry: Registry, done: Pushing) -> Layers:
    """The layers of the image push_image() published, with what its repository had before."""
    if done.published is not None:
        return published_layers(registry, pinned(image.ref, done.published))
    return pushed_layers(registry, pinned(image.ref, done.pushed[image.ref]), done.before, done.mounted)


def push_dual(refs: Sequence[str], zstd_id: str, gzip_id: str, engine: Engine, registry: Registry,
              options: RunOptions, done: Pushing) -> str:
    """gzip+zstd: the gzip image (`gzip_id`, tagged gzip_ref() of the first ref) and the zstd one
    (`zstd_id`, under the first ref) pushed, then the index over both (dual.py) under every ref;
    its digest. Each push and tag is confirmed and recorded in `done` as it is."""
    first, *others = refs
    gzip = done.pushed[gzip_ref(first)] = _push_tag(gzip_ref(first), gzip_id, engine, registry, options, done)
    zstd = _push_tag(first, zstd_id, engine, registry, options, done)
    body, done.instances = dual_index(registry, first, gzip, zstd, options.platform or host_platform())
    index = done.pushed[first] = registry.put_index(first, body)
    for ref in others:
        done.pushed[ref] = put_tag(registry, ref, index)
    return index


def push_estargz(refs: Sequence[str], publisher: EstargzPublisher, registry: Registry, options: RunOptions,
                 done: Pushing) -> str:
    """--compression estargz: the verified image written as ordered eStargz and put under every
    ref (estargz.py); each tag confirmed by the registry and recorded in `done`."""
    if options.platform not in (None, host_platform()) and publisher.start is not None:
        # The start would run under emulation (import torch hangs under QEMU): layers unordered.
        publisher.say(f"{refs[0]}: no start profile, {options.platform} is emulated here: its eStargz layers "
                      "go unordered (publish it on a native host to order them)")
        publisher = replace(publisher, start=None)
    converted = done.estargz = publisher.push(refs[0], refs, options.platform)
    done.uploaded += converted.uploaded
    for ref in refs:
        confirmed = registry.digest(ref)
        if confirmed != converted.digest:
            raise PushNotConfirmed(ref=ref, pushed=converted.digest, registry_has=confirmed or "no such tag")
        done.pushed[ref] = confirmed
    return converted.digest


def _push_tag(ref: str, verified: str, engine: Engine, registry: Registry, options: RunOptions, done: Pushing) -> str:
    """`docker push` one tag; the digest, once the registry answers with it. `verified`: the
    image id the engine built (with the containerd store, the digest the push must store)."""
    result = engine.push_counted(ref, retries=options.push_retries, backoff=options.push_backoff)
    digest = result.digest
    done.uploaded += result.uploaded_bytes(registry.blobs(f"{ref.rsplit(':', 1)[0]}@{digest}"))
    # With the containerd image store the image id is the digest of the index BuildKit
    # exported: the push must store exactly that, or it is not the image verify ran.
    same_bytes = options.export is not None and options.export.compression is not None
    if same_bytes and digest != verified:
        raise PushedOtherContent(ref=ref, pushed=digest, verified=verified)
    confirmed = registry.digest(ref)
    if confirmed != digest:
        raise PushNotConfirmed(ref=ref, pushed=digest, registry_has=confirmed or "no such tag")
    return digest
