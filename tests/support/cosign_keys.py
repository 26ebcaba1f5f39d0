"""cosign key pairs, made by cosign itself."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def cosign_key_pair(directory: Path, password: str = "") -> tuple[Path, Path]:
    """A cosign key pair (cosign.key, cosign.pub) made by cosign itself."""
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cosign", "generate-key-pair"], cwd=directory, capture_output=True, check=True, timeout=60,
                   env={**os.environ, "COSIGN_PASSWORD": password})
    return directory / "cosign.key", directory / "cosign.pub"
