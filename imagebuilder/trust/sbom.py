"""A CycloneDX 1.5 SBOM of an image, written inside the image at build time.

Run by the image's own Python (`python sbom.py VENV OUT`), so it uses the standard library
only (a CycloneDX library would be one more dependency for a flat JSON document). It lists
what is really there: every distribution installed in the venv (name and version from its
metadata; the sha256 of the files the lock allowed for it, which the installer checked with
--require-hashes) and every OS package dpkg reports installed. No timestamp and a serial
number derived from the content: the same image contents give the same bytes, so the SBOM's
digest identifies them.
"""

from __future__ import annotations

import email.parser
import hashlib
import json
import re
import sys
import uuid
from pathlib import Path
from urllib.parse import quote

LOCKS = ("/opt/imagebuilder/requirements.lock", "/opt/imagebuilder/jupyter.lock")
DPKG_STATUS = "/var/lib/dpkg/status"
OS_RELEASE = "/etc/os-release"
MANIFEST = "/opt/imagebuilder/manifest.json"
DIGEST_LINE = "imagebuilder-sbom-digest"  # what the build prints: DIGEST_LINE sha256:HEX


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked_hashes(paths: tuple[str, ...] = LOCKS) -> dict[tuple[str, str], list[str]]:
    """(name, version) -> sha256 hex digests, from the lock files present."""
    out: dict[tuple[str, str], list[str]] = {}
    for path in paths:
        p = Path(path)
        if not p.is_file():
            continue
        for line in p.read_text().replace("\\\n", " ").splitlines():
            words = line.split()
            if not words or words[0].startswith("#") or "==" not in words[0]:
                continue
            name, version = words[0].split("==", 1)
            prefix = "--hash=sha256:"  # (str.removeprefix is 3.9+; images may run 3.8)
            out[(canonical(name), version)] = sorted(w[len(prefix):] for w in words[1:] if w.startswith(prefix))
    return out


def python_components(venv: Path, hashes: dict[tuple[str, str], list[str]]) -> list[dict]:
    components = []
    parser = email.parser.HeaderParser()
    for metadata in sorted(venv.glob("lib/python*/site-packages/*.dist-info/METADATA")):
        headers = parser.parsestr(metadata.read_text(encoding="utf-8", errors="replace"))
        name, version = canonical(headers["Name"]), headers["Version"]
        purl = f"pkg:pypi/{name}@{quote(version, safe='')}"
        component: dict = {"type": "library", "bom-ref": purl, "name": name, "version": version, "purl": purl}
        digests = hashes.get((name, version))
        if digests:
            component["hashes"] = [{"alg": "SHA-256", "content": d} for d in digests]
        component["properties"] = [{"name": "imagebuilder:locked", "value": "true" if digests else "false"}]
        components.append(component)
    return components


def os_release(path: str = OS_RELEASE) -> dict[str, str]:
    out = {}
    if Path(path).is_file():
        for line in Path(path).read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep:
                out[key] = value.strip().strip('"')
    return out


def deb_components(status: str = DPKG_STATUS, release: dict[str, str] | None = None) -> list[dict]:
    release = os_release() if release is None else release
    distro = release.get("ID", "debian")
    qualifier = f"&distro={distro}-{release['VERSION_ID']}" if release.get("VERSION_ID") else ""
    components: list[dict] = []
    if not Path(status).is_file():
        return components
    for paragraph in Path(status).read_text(encoding="utf-8", errors="replace").split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): ?(.*)$", paragraph, flags=re.M))
        if not fields.get("Package") or not fields.get("Status", "").endswith(" installed"):
            continue
        name, version, arch = fields["Package"], fields.get("Version", ""), fields.get("Architecture", "")
        purl = f"pkg:deb/{distro}/{name}@{quote(version, safe='')}?arch={arch}{qualifier}"
        components.append({"type": "library", "bom-ref": purl, "name": name, "version": version, "purl": purl})
    return sorted(components, key=lambda c: c["bom-ref"])


def sbom(venv: Path) -> dict:
    components = python_components(venv, locked_hashes()) + deb_components()
    manifest = json.loads(Path(MANIFEST).read_text()) if Path(MANIFEST).is_file() else {}
    name = f"pytorch {manifest.get('torch', '')} {manifest.get('variant', '')}".strip()
    content = json.dumps(components, sort_keys=True).encode()
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": f"urn:uuid:{uuid.UUID(hashlib.sha256(content).hexdigest()[:32])}",
        "version": 1,
        "metadata": {
            "tools": {"components": [{"type": "application", "name": "imagebuilder"}]},
            "component": {"type": "container", "bom-ref": "image", "name": name,
                          "version": str(manifest.get("inputs_hash", ""))},
        },
        "components": components,
    }


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: sbom.py VENV OUT", file=sys.stderr)
        return 2
    document = sbom(Path(argv[1]))
    data = (json.dumps(document, indent=1, sort_keys=True) + "\n").encode()
    Path(argv[2]).write_bytes(data)
    # In the build's log: the image's label is this digest, known without reading the image back
    # (for a foreign platform that would unpack the whole image into the store first).
    print(f"{DIGEST_LINE} sha256:{hashlib.sha256(data).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
