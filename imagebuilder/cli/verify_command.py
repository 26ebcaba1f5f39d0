"""`imagebuilder verify` and its options: parse (every combination checked before any work), call
verify/, print the report."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from . import options
from .context import progress
from ..errors import BadRequest
from ..registry import RetryPolicy, parse_reference

F = TypeVar("F", bound=Callable[..., Any])


def _verifying(tag: str | None, local: bool, manifest: str | None, mount_smoke_tests: bool, key: str | None,
               signature_only: bool, **_: Any) -> None:
    if local:
        if tag is not None:
            raise BadRequest(f"--local checks this Python environment, not an image; give TAG ({tag}) or --local")
        if mount_smoke_tests:
            raise BadRequest("--mount-smoke-tests is for images; --local runs the shipped smoke tests")
        if key is not None or signature_only:
            raise BadRequest("--key and --signature-only check a published image; --local checks this environment")
        return
    if tag is None:
        raise BadRequest("give the image TAG to verify, or --local for this environment")
    parse_reference(tag, "verify")  # before the registry is asked for its signature
    if manifest is not None:
        raise BadRequest("--manifest is for --local; an image carries its own manifest")
    if signature_only and key is None:
        raise BadRequest("--signature-only checks the signature against --key: give --key PUB (without "
                         "--signature-only, verify says whether the image is signed and runs its checks)")


def verifying(f: F) -> F:
    """verify's own options: what to check, how long, how to report."""
    return options.stack(
        options.refuse_unless(_verifying),
        click.option("--local", is_flag=True,
                     help="Check this Python environment instead of an image (bare-metal hosts, pods)."),
        options.allow_no_gpu,
        click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of tables."),
        click.option("--timeout", type=options.SECONDS, default=1800, show_default=True, metavar="S",
                     help="Seconds the smoke tests may take in all; the container is killed and removed after."),
        click.option("--manifest", type=click.Path(exists=True, dir_okay=False), metavar="PATH",
                     help="With --local: the manifest.json whose versions to expect. Default: none."),
        click.option("--mount-smoke-tests", is_flag=True,
                     help="Run this imagebuilder's smoke tests in the image even when it has its own copy "
                          "(an image an older imagebuilder built). Images without imagebuilder's labels "
                          "get them anyway."),
        click.option("--key", metavar="PUB",
                     help="Before any container starts, check that the digest TAG names in its registry is "
                          "signed by this cosign public key (a file, env://VAR or a KMS URI), and that its SBOM "
                          "attestation verifies and is the image's own; the smoke tests then run that digest. "
                          "Offline: no transparency log. Without --key, verify says whether the image is signed."),
        click.option("--signature-only", is_flag=True, help="Check the signature (and SBOM attestation) and stop."),
        options.registry_timeout,
    )(f)


@click.command("verify")
@click.argument("tag", required=False)
@verifying
def verify(tag: str | None, local: bool, allow_no_gpu: bool, as_json: bool, timeout: float,
               manifest: str | None, mount_smoke_tests: bool, key: str | None, signature_only: bool,
               registry_policy: RetryPolicy) -> None:
    """Will PyTorch jobs in this image work on this machine? Preflight the host, run the smoke tests.

    Exit 0 only when every check passed.

    \b
    Examples:
      imagebuilder verify pytorch:2.6.0-cuda12.4-cudnn9-runtime
      imagebuilder verify pytorch:2.6.0-cuda12.4-cudnn9-runtime --allow-no-gpu --json
      imagebuilder verify --local --timeout 600
      imagebuilder verify ghcr.io/acme/pytorch:2.6.0-cuda12.4-cudnn9-runtime --key cosign.pub
    """
    from ..verify import Live, verify_local, verify_published

    live = None if as_json else Live(click.echo)  # the header and preflight at once, a line per check as it ends
    if local or tag is None:  # options checked the combinations
        report = verify_local(allow_no_gpu=allow_no_gpu, timeout=timeout, manifest=manifest, live=live)
    else:
        from ..engine.docker import DockerEngine
        from ..registry.client import HttpRegistry
        from ..trust import Cosign

        # cosign reads the same registry: under the same timeout, saying every 15 s that it still waits.
        cosign = Cosign(timeout=registry_policy.timeout_s, say=progress, timeout_option=registry_policy.timeout_option)
        report = verify_published(DockerEngine(), tag, registry=HttpRegistry(policy=registry_policy), key=key,
                                  cosign=cosign, signature_only=signature_only, live=live,
                                  allow_no_gpu=allow_no_gpu, timeout=timeout, mount_smoke_tests=mount_smoke_tests)
    for notice in report.notices:
        click.echo(notice, err=True)
    click.echo(json.dumps(report.to_json(), indent=2) if as_json else report.format(live))
    report.raise_if_failed()
