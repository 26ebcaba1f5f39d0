"""signing: `publish --sign-key` and `verify --key` with the real cosign against a real local registry.

One real image for the module: conftest's signed_publish, the runtime image tests/test_publish.py
publishes too (the same publish: torch 2.6 for CUDA 12.4 on the local Debian base), published
once with --sign-key and BuildKit (what the engine users run builds with) to a throwaway
registry (its smoke tests run once, CPU mode). The
later tests rebuild it from BuildKit's layer cache where they need another digest of the same
inputs (a new revision label), with the first run's verdict instead of running the smoke tests
again; every local tag, the build's cache records and the registry's storage are removed after
the last test that uses it.

The runner's decisions (what is signed, what a failed signing reports) are also pinned down over
canned engine and registry answers, without Docker.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from support.cosign_keys import cosign_key_pair
from support.real_images import SIGNED_CUDA, SIGNED_OS, SIGNED_TORCH, imagebuilder, installed_torch
from support.unavailable import _unavailable
from support.replay import verify_replaying
from support.canned_engine import CannedEngine
from support.canned_publish import images as canned_images
from support.canned_publish import verdict
from support.canned_registry import CannedRegistry, IndexingRegistry

from imagebuilder.build.image_contents import SBOM_PATH
from imagebuilder.build.render import RenderedImage
from imagebuilder.engine.buildkit import BuildKitBuilder
from imagebuilder.publish.indexes import UNCHANGED, WRITTEN, plan_indexes, write_indexes
from imagebuilder.publish.lookup import lookup
from imagebuilder.publish.plan import BUILD, FAILED, PUSHED, SKIP, Outcome, plan, Remote, RunOptions, Step
from imagebuilder.publish.report import format_summary, PublishFailed, raise_if_failed
from imagebuilder.publish.run import publish, Verifier
from imagebuilder.registry.client import HttpRegistry
from imagebuilder.resources import default_matrix_path
from imagebuilder.trust import cosign, signature_check, signing
from imagebuilder.trust.labels import SBOM_DIGEST

REPO_ROOT = Path(__file__).resolve().parent.parent
TORCH, CUDA, OS = SIGNED_TORCH, SIGNED_CUDA, SIGNED_OS  # conftest's signed_publish


key_pair = cosign_key_pair  # support.cosign_keys': conftest's session keys, made by it, sign signed_publish


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


# --------------------------------------------------------------------------- without Docker


@pytest.mark.parametrize(("which", "password", "code", "line"), [
    ("locked", None, 2, "--sign-key {key} cannot sign: "),  # no COSIGN_PASSWORD for an encrypted key
    ("locked", "wrong", 2, "cannot sign: decrypt: encrypted: decryption failed; give the private key"),
    ("locked_pub", "s3cret", 2, "cannot sign: "),  # the public key where the private one goes
    ("locked", "s3cret", 1, "could not reach the Docker daemon"),  # the key is good: on to the work
])
def test_publish_tries_the_sign_key_before_any_work(keys: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    which: str, password: str | None, code: int, line: str) -> None:
    from click.testing import CliRunner

    from imagebuilder.cli import cli

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")  # any daemon call: "could not reach"
    if password is None:
        monkeypatch.delenv("COSIGN_PASSWORD", raising=False)
    else:
        monkeypatch.setenv("COSIGN_PASSWORD", password)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["publish", "--registry", "127.0.0.1:5000/ns", "--torch", "2.6", "--cuda", "12.4",
                                      "--sign-key", str(keys[which])])
    assert result.exit_code == code, result.stderr
    (error,) = error_lines(result.stderr)
    assert line.format(key=keys[which]) in error
    assert list(tmp_path.iterdir()) == []


def test_an_attested_sbom_hashes_to_the_label_the_image_carries(tmp_path: Path) -> None:
    """The image's sbom.py writes the file whose sha256 is the io.imagebuilder.sbom.digest label;
    cosign hands back the parsed document: signing.sbom_bytes() must give those very bytes."""
    dist = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "torch-2.6.0+cu124.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.6.0+cu124\n")
    out = tmp_path / "sbom.cdx.json"
    sbom_py = REPO_ROOT / "imagebuilder" / "trust" / "sbom.py"
    subprocess.run([sys.executable, str(sbom_py), str(tmp_path / "venv"), str(out)], check=True, timeout=60)
    written = out.read_bytes()
    document = json.loads(written)
    assert signing.sbom_bytes(document) == written
    assert signing.torch_of(document) == "2.6.0+cu124"


def test_an_unchanged_but_unsigned_image_is_rebuilt_when_signing() -> None:
    (image,) = canned_images()
    digests = {ref: "sha256:" + "1" * 64 for ref in image.refs}
    unsigned = Remote(digests, image.inputs_hash, signed=False)
    (step,) = plan([image], {image.ref: unsigned})
    assert (step.action, step.reason) == (BUILD, "unchanged, but the registry's image is not signed")
    for signed in (True, None):  # signed, or not signing (not asked)
        assert plan([image], {image.ref: replace(unsigned, signed=signed)})[0].action == SKIP


@dataclass
class LabelledEngine(CannedEngine):
    """A canned engine whose images carry the SBOM label of the SBOM read_file() returns."""

    def image_labels(self, ref: str) -> dict[str, str]:
        return {SBOM_DIGEST: "sha256:" + hashlib.sha256(b'{"bomFormat": "CycloneDX"}\n').hexdigest()}


@dataclass
class RecordingSigner:
    fail: bool = False
    asked: list[tuple[str, bytes | None]] = field(default_factory=list)

    def sign(self, target: str, sbom: bytes | None) -> signing.Signed:
        self.asked.append((target, sbom))
        if self.fail:
            raise cosign.CosignFailed(action="sign", target=target, detail="KMS said no", hint="")
        return signing.Signed(target.partition("@")[2], signing.signature_tag(target),
                              signing.signature_tag(target, "att"))


def _run(signer: RecordingSigner, ok: bool = True) -> tuple[Outcome, CannedEngine]:
    engine = LabelledEngine()
    options = RunOptions(matrix_path=default_matrix_path(), push_retries=1, push_backoff=0, signer=signer)
    (outcome,) = publish(plan(canned_images(), {}), engine=engine, builder=engine,
                                 registry=CannedRegistry(engine=engine), options=options, verifier=verdict(ok))
    return outcome, engine


def test_the_runner_signs_each_pushed_digest_never_a_tag() -> None:
    """Every tag of an image names one digest (the canned engine answers as a registry does): it
    is signed once, by digest, however many tags name it."""
    signer = RecordingSigner()
    outcome, _ = _run(signer)
    assert outcome.status == PUSHED
    assert len(outcome.pushed) >= 3, outcome.pushed  # several tags ...
    (digest,) = set(outcome.pushed.values())  # ... and one image
    assert [target for target, _ in signer.asked] == [f"{outcome.step.image.repository}@{digest}"]
    assert all(sbom == b'{"bomFormat": "CycloneDX"}\n' for _, sbom in signer.asked)
    assert [s.digest for s in outcome.signed] == [digest]
    assert outcome.to_json()["signed"][0]["signature"].endswith(".sig")


def test_a_failed_signing_is_a_failed_publish_that_keeps_what_was_pushed() -> None:
    outcome, engine = _run(RecordingSigner(fail=True))
    assert outcome.status == FAILED and outcome.signed == ()
    assert outcome.reason.startswith("pushed, but not signed") and "KMS said no" in outcome.reason
    assert set(outcome.pushed) == set(outcome.step.image.refs) == set(engine.pushed)
    summary = format_summary([outcome], signing=True)
    assert "SIGNED" in summary.splitlines()[0] and " no " in summary.splitlines()[1]
    with pytest.raises(PublishFailed):
        raise_if_failed([outcome])


def test_a_failed_verification_signs_nothing_canned() -> None:
    signer = RecordingSigner()
    outcome, engine = _run(signer, ok=False)
    assert outcome.status == FAILED and signer.asked == [] and engine.pushed == []


def test_the_indexes_written_are_signed_by_their_digest() -> None:
    ref = "127.0.0.1:5999/ml/pytorch:2.11-runtime"
    wanted = {ref: ["linux/amd64", "linux/arm64"]}
    registry = IndexingRegistry(answers={f"{ref}-amd64": "sha256:" + "a" * 64, f"{ref}-arm64": "sha256:" + "b" * 64})
    signer = RecordingSigner()
    (index,) = write_indexes(registry, plan_indexes(registry, wanted), signer)
    # The index alone is signed here; each platform's image was signed, SBOM attested, when pushed.
    target = f"127.0.0.1:5999/ml/pytorch@{index.digest}"
    assert index.status == WRITTEN and signer.asked == [(target, None)]
    # A rerun finds the index there and signed: nothing is written or signed again ...
    registry.answers[signing.signature_tag(target)] = "sha256:" + "5" * 64
    (again,) = write_indexes(registry, plan_indexes(registry, wanted), signer)
    assert (again.status, again.digest, len(signer.asked)) == (UNCHANGED, index.digest, 1)
    # ... but an index there without a signature (its signing failed) is signed now.
    del registry.answers[signing.signature_tag(target)]
    (unsigned,) = write_indexes(registry, plan_indexes(registry, wanted), signer)
    assert unsigned.status == UNCHANGED and signer.asked == [(target, None)] * 2


@pytest.mark.parametrize("args", [
    ("publish", "--torch", "2.6", "--cuda", "12.4", "--registry", "127.0.0.1:1/ml", "--dry-run",
     "--sign-key", "/nonexistent/cosign.key"),
    ("verify", "127.0.0.1:1/ml/pytorch:2.6-runtime", "--key", "/nonexistent/cosign.pub"),
])
def test_a_missing_key_is_a_bad_request(args: tuple[str, ...]) -> None:
    done = imagebuilder(*args, timeout=120)
    assert done.returncode == 2, done.stderr
    expected = (f"error: {args[-2]} {args[-1]}: no such file; give a cosign key file, env://VAR or a KMS URI "
                "(awskms://, gcpkms://, azurekms://, hashivault://, k8s://)")
    assert error_lines(done.stderr) == [expected]
    assert "Traceback" not in done.stderr


# --------------------------------------------------------------------------- real cosign, real registry


@pytest.fixture(scope="module")
def keys(signing_keys: dict[str, Path]) -> dict[str, Path]:
    """conftest's session key pairs (ours signed conftest's signed_publish)."""
    return signing_keys


@pytest.fixture(scope="module")
def builder(docker_engine: Any) -> BuildKitBuilder:
    """The BuildKit builder the CLI picks on this engine (the rebuilds below are served from
    the cache of signed_run's build)."""
    from imagebuilder.engine.select import detect_buildkit

    cli, tried = detect_buildkit()
    if cli is None:
        _unavailable(f"no docker CLI here builds with BuildKit ({'; '.join(tried)})")
    assert cli is not None  # _unavailable does not return (mypy sees support's names untyped)
    return BuildKitBuilder(cli, docker_engine)


@pytest.fixture(scope="module")
def signed_run(signed_publish: dict[str, Any], builder: BuildKitBuilder) -> dict[str, Any]:
    """`imagebuilder publish --sign-key` of the real runtime image to an empty registry: conftest's
    signed_publish, which test_publish's first run is too (their modules run back to back; this
    module's last test moves the published tags, after test_publish's reruns)."""
    assert (TORCH, CUDA, OS) == (SIGNED_TORCH, SIGNED_CUDA, SIGNED_OS)
    return {**signed_publish, "pinned": signing.pinned(signed_publish["image"]["ref"], signed_publish["digest"])}


def _verify(ref: str, *args: str) -> subprocess.CompletedProcess[str]:
    return imagebuilder("verify", ref, *args, timeout=1800)


@pytest.mark.docker
@pytest.mark.registry
@pytest.mark.slow
def test_a_published_image_verifies_with_its_key(signed_run: dict[str, Any], keys: dict[str, Path],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    image = signed_run["image"]
    assert image["status"] == PUSHED
    assert [s["digest"] for s in image["signed"]] == [signed_run["digest"]] == list(set(image["pushed"].values()))
    assert "SIGNED" in signed_run["stdout"]
    for ref in image["pushed"]:  # every tag, the dated one included, names the signed digest
        done = _verify(ref, "--key", str(keys["pub"]), "--signature-only", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        check = json.loads(done.stdout)["signature"]
        assert (check["status"], check["digest"], check["ok"]) == (signature_check.VERIFIED, signed_run["digest"], True)
    # The operator's command: the signature first, then the smoke tests run that very digest. The
    # publish verified that digest (CPU mode) and kept its verdict: the command runs for real (the
    # CLI, cosign, the registry, preflight on the daemon) but for the smoke-test container, whose
    # output is that verdict (support.replay), and says which image it was asked to run.
    result, replayed = verify_replaying(monkeypatch, image["verify"], image["ref"], "--key", str(keys["pub"]),
                                        "--allow-no-gpu", "--json")
    assert result.exit_code == 0, result.output[-4000:]
    report = json.loads(result.stdout)
    assert report["target"] == signed_run["pinned"] and report["ok"] is True
    assert report["checks"] == image["verify"]["checks"] and report["checks"]
    assert (report["signature"]["status"], report["signature"]["digest"]) == (signature_check.VERIFIED,
                                                                             signed_run["digest"])
    assert replayed.asked == [(signed_run["pinned"], ["python3", "-m", "smoke_tests", "--json", "--allow-no-gpu"])]
    # Without a key, --signature-only would check nothing: refused before the registry is asked.
    done = _verify(image["ref"], "--signature-only")
    assert done.returncode == 2 and not done.stdout
    assert error_lines(done.stderr) == [
        "error: --signature-only checks the signature against --key: give --key PUB (without --signature-only, "
        "verify says whether the image is signed and runs its checks)"]


@pytest.mark.docker
@pytest.mark.registry
@pytest.mark.slow
def test_another_key_fails(signed_run: dict[str, Any], keys: dict[str, Path]) -> None:
    done = _verify(signed_run["pinned"], "--key", str(keys["other"]), "--signature-only")
    assert done.returncode == 1
    (line,) = error_lines(done.stderr)
    assert "signature: signed by another key:" in line and str(keys["other"]) in line


@pytest.mark.docker
@pytest.mark.registry
@pytest.mark.slow
def test_the_sbom_attestation_is_the_images_sbom_with_its_torch(docker_engine: Any, signed_run: dict[str, Any],
                                                                 keys: dict[str, Path]) -> None:
    image = signed_run["image"]
    attested = cosign.Cosign().verified_sbom(str(keys["pub"]), signed_run["pinned"])
    labels = HttpRegistry(config={}).labels(signed_run["pinned"])
    assert labels is not None
    # The distribution's version (the wheel's METADATA: 2.6.0), which is what `import torch` said
    # in the image without its local part (torch.__version__ is 2.6.0+cu124), and the label.
    assert signing.torch_of(attested) == image["verify"]["torch"].split("+")[0] == labels["io.imagebuilder.torch"]
    assert signing.sbom_bytes(attested) == docker_engine.read_file(image["ref"], SBOM_PATH)
    # BuildKit's provenance, where the builder adds one, is left in the index beside cosign's tags.
    manifest = HttpRegistry(config={}).manifest(signed_run["pinned"])
    assert manifest is not None
    check = json.loads(_verify(signed_run["pinned"], "--key", str(keys["pub"]), "--signature-only",
                               "--json").stdout)["signature"]
    assert check["provenance"] == signature_check.has_provenance(manifest)
    assert check["sbom_digest"] == labels[SBOM_DIGEST]


def _rebuild(signed_run: dict[str, Any], base_image: str, namespace: str | None = None) -> RenderedImage:
    """The published image rendered again, for its own registry namespace or another one."""
    from support.published_images import rendered_signed

    return rendered_signed(f"{signed_run['address']}/{namespace}" if namespace else signed_run["registry"], base_image,
                           buildkit=True)


def _recorded(signed_run: dict[str, Any], ok: bool = True) -> Verifier:
    from imagebuilder.verify.report import VerifyReport
    from smoke_tests.result import FAIL, Result

    checks = tuple(Result.from_dict(c) for c in signed_run["image"]["verify"]["checks"])
    if not ok:
        checks += (Result("compile", FAIL, "no C++ compiler on PATH"),)

    def verifier(engine: Any, registry: Any, ref: str, _: RunOptions) -> VerifyReport:
        # The same layers the first run smoke-tested: its verdict (or a failing one).
        return VerifyReport(ref, "docker", (), checks, require_gpu=False)

    return verifier


def _publish(docker_engine: Any, builder: BuildKitBuilder, image: RenderedImage, signed_run: dict[str, Any], *,
             ok: bool = True, signer: signing.Signer | None = None) -> Outcome:
    registry = HttpRegistry(config={})
    steps = plan([image], lookup(registry, [image], signing=signer is not None), force=False)
    options = RunOptions(matrix_path=default_matrix_path(), signer=signer)
    (outcome,) = publish(steps, engine=docker_engine, builder=builder,
                                 registry=registry, options=options, verifier=_recorded(signed_run, ok))
    return outcome


@pytest.mark.docker
@pytest.mark.registry
@pytest.mark.slow
def test_nothing_is_signed_when_verify_failed(docker_engine: Any, base_image: str, signed_run: dict[str, Any],
                                              builder: BuildKitBuilder, keys: dict[str, Path],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSIGN_PASSWORD", "")
    image = _rebuild(signed_run, base_image, f"imagebuilder-test/failed-{uuid.uuid4().hex[:8]}")
    outcome = _publish(docker_engine, builder, image, signed_run, ok=False, signer=signing.key_signer(str(keys["key"])))
    assert outcome.status == FAILED and "verification failed" in outcome.reason
    # Built from signed_publish's layers (the same lock, the session's CA): torch was not installed again.
    assert outcome.built is not None and outcome.built.result.log_path is not None
    assert not installed_torch(outcome.built.result.log_path), "the install steps ran again"
    assert outcome.pushed == {} and outcome.signed == ()
    assert HttpRegistry(config={}).tags(image.ref) == []  # no image, no .sig, no .att


@pytest.mark.docker
@pytest.mark.registry
@pytest.mark.slow
def test_a_failed_signing_fails_the_publish_and_the_next_run_signs(
        docker_engine: Any, base_image: str, signed_run: dict[str, Any], builder: BuildKitBuilder, keys: dict[str, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    image = _rebuild(signed_run, base_image, f"imagebuilder-test/half-{uuid.uuid4().hex[:8]}")
    monkeypatch.delenv("COSIGN_PASSWORD", raising=False)  # an encrypted key and no password: cosign fails
    outcome = _publish(docker_engine, builder, image, signed_run, signer=signing.key_signer(str(keys["locked"])))
    assert outcome.status == FAILED and outcome.signed == ()
    assert outcome.reason.startswith("pushed, but not signed") and "COSIGN_PASSWORD" in outcome.reason
    assert set(outcome.pushed) == set(image.refs)
    done = _verify(image.ref, "--key", str(keys["locked_pub"]), "--signature-only")
    assert done.returncode == 1
    (line,) = error_lines(done.stderr)
    assert f"signature: not signed: {image.ref} names {outcome.pushed[image.ref]}, which has no signature" in line

    # The next run: unchanged inputs, but unsigned in the registry: rebuilt, pushed and signed.
    monkeypatch.setenv("COSIGN_PASSWORD", "s3cret")
    again = _publish(docker_engine, builder, image, signed_run, signer=signing.key_signer(str(keys["locked"])))
    assert again.step.reason == "unchanged, but the registry's image is not signed"
    assert again.status == PUSHED and [s.digest for s in again.signed] == [again.pushed[image.ref]]
    assert _verify(image.ref, "--key", str(keys["locked_pub"]), "--signature-only").returncode == 0


@pytest.mark.docker
@pytest.mark.registry
@pytest.mark.slow
def test_the_same_image_retagged_from_an_unsigned_build_fails(
        docker_engine: Any, base_image: str, signed_run: dict[str, Any], builder: BuildKitBuilder, keys: dict[str, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Last: it moves the published tags. An unsigned build of the same inputs (another revision
    label, so another digest) pushed over the signed image's tags."""
    image = _rebuild(signed_run, base_image)
    assert image.inputs_hash == signed_run["image"]["inputs_hash"]
    monkeypatch.setenv("GITHUB_SHA", "1" * 40)
    registry = HttpRegistry(config={})
    options = RunOptions(matrix_path=default_matrix_path())
    (outcome,) = publish([Step(image, BUILD, "an unsigned rebuild")], engine=docker_engine,
                                 builder=builder, registry=registry, options=options,
                                 verifier=_recorded(signed_run))
    assert outcome.status == PUSHED and outcome.signed == ()
    unsigned = outcome.pushed[image.ref]
    assert unsigned != signed_run["digest"] and registry.digest(image.ref) == unsigned
    done = _verify(image.ref, "--key", str(keys["pub"]), "--signature-only")
    assert done.returncode == 1
    (line,) = error_lines(done.stderr)
    assert (f"signature: re-tagged: {image.ref} names {unsigned}, an unsigned build; the build of the same inputs "
            f"signed by {keys['pub']} is {signed_run['digest']}") in line
    # The signed digest itself still verifies: the signature follows the digest, not the tag.
    assert _verify(signed_run["pinned"], "--key", str(keys["pub"]), "--signature-only").returncode == 0

