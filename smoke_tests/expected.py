"""What the image's manifest says the checks should find."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional

DEFAULT_MANIFEST = "/opt/imagebuilder/manifest.json"
MANIFEST_ENV = "SMOKE_TESTS_MANIFEST"


class ManifestError(ValueError):
    """The manifest exists but cannot be read as the expected JSON object."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"manifest {path}: {problem}")
        self.path = path
        self.problem = problem


@dataclass(frozen=True)
class Expected:
    """Expected versions; None means no expectation (only report what is measured).

    The manifest writes a CPU build as "torch_cuda": null, which differs from a
    manifest that says nothing about CUDA, hence cpu_build.
    """

    torch: Optional[str] = None
    torch_cuda: Optional[str] = None
    cpu_build: bool = False
    cudnn: Optional[str] = None
    nccl: Optional[str] = None
    python: Optional[str] = None
    min_driver: Optional[str] = None
    # The driver floor through CUDA minor-version compatibility (12.x: 525.60.13).
    min_driver_compat: Optional[str] = None
    variant: Optional[str] = None
    image_cuda: Optional[str] = None

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> "Expected":
        def text(key: str) -> Optional[str]:
            value = manifest.get(key)
            return None if value is None else str(value)

        return cls(
            torch=text("torch"),
            torch_cuda=text("torch_cuda"),
            cpu_build="torch_cuda" in manifest and manifest["torch_cuda"] is None,
            cudnn=text("cudnn"),
            nccl=text("nccl"),
            python=text("python"),
            min_driver=text("min_driver"),
            min_driver_compat=text("min_driver_compat"),
            variant=text("variant"),
            image_cuda=text("image_cuda"),
        )


NOTHING_EXPECTED = Expected()


def manifest_path(explicit: Optional[str] = None) -> str:
    return explicit or os.environ.get(MANIFEST_ENV) or DEFAULT_MANIFEST


def load_expected(path: Optional[str] = None) -> Expected:
    """Expectations from the manifest; a missing file means none (e.g. a bare torch image)."""
    resolved = manifest_path(path)
    try:
        with open(resolved, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return NOTHING_EXPECTED
    except (OSError, ValueError) as e:
        raise ManifestError(resolved, str(e)) from e
    if not isinstance(data, dict):
        raise ManifestError(resolved, f"expected a JSON object, got {type(data).__name__}")
    return Expected.from_manifest(data)
