"""What `imagebuilder publish` was asked, as one frozen value: the CLI parses its options into a
`PublishRequest` and hands it to publish_command() whole."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from pathlib import Path

from ..build.render_options import RenderRequest
from ..engine.export import Compression
from ..matrix.selection import Selection
from ..registry.reference import RegistryTarget
from ..registry.retry import RetryPolicy
from ..verify.run import DEFAULT_TIMEOUT


@dataclass(frozen=True)
class PublishRequest:
    selection: Selection
    rendering: RenderRequest
    target: RegistryTarget
    """--registry: where the images, their indexes and the registry cache go."""
    registry_policy: RetryPolicy
    push: bool = True
    dry_run: bool = False
    keep_going: bool = False
    force: bool = False
    allow_no_gpu: bool = False
    verify_timeout: float = DEFAULT_TIMEOUT
    day: date | None = None
    """--date; None: today (UTC)."""
    quiet: bool = False
    no_cache: bool = False
    pull: bool = False
    report: Path | None = None
    registry_ca: Path | None = None
    builder_choice: str = "auto"
    buildx_builder: str | None = None
    platforms: str | None = None
    """--platform as given; None: the host's, under the plain tags."""
    merge: bool = True
    merge_only: bool = False
    compression: Compression | None = None
    sign_key: str | None = None
    squashfs: bool = False
    start_command: str | None = None
    start_timeout: float = 600.0
    """--start-timeout: the seconds the start profile may take."""

    @property
    def multi(self) -> bool:
        """--platform given: each platform's images under their own tags (TAG-arm64), then an index per TAG."""
        return self.platforms is not None
