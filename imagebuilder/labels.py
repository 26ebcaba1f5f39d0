"""Every label key imagebuilder writes or reads: the OCI image-spec annotations it sets, and
its own io.imagebuilder.* keys. Plain data, no imports: any module may name a label.

The render-time labels (tags.labels_for) depend only on the rendered inputs; the build-time
ones (CREATED, REVISION, MATRIX, LOCK, SBOM_DIGEST) are added by build.py, so rendering
stays byte-for-byte deterministic.
"""

from __future__ import annotations

# --- OCI (github.com/opencontainers/image-spec, annotations.md)
OCI = "org.opencontainers.image"
TITLE = f"{OCI}.title"
DESCRIPTION = f"{OCI}.description"
VERSION = f"{OCI}.version"
SOURCE = f"{OCI}.source"
BASE_NAME = f"{OCI}.base.name"
BASE_DIGEST = f"{OCI}.base.digest"
CREATED = f"{OCI}.created"
REVISION = f"{OCI}.revision"

# --- imagebuilder's own
PREFIX = "io.imagebuilder"
TORCH = f"{PREFIX}.torch"
TORCH_CUDA = f"{PREFIX}.torch.cuda"
WHEEL = f"{PREFIX}.wheel"
CUDA = f"{PREFIX}.cuda"
CUDNN = f"{PREFIX}.cudnn"
NCCL = f"{PREFIX}.nccl"
PYTHON = f"{PREFIX}.python"
VARIANT = f"{PREFIX}.variant"
OS = f"{PREFIX}.os"
MIN_DRIVER = f"{PREFIX}.min-driver"
MIN_DRIVER_COMPAT = f"{PREFIX}.min-driver-compat"
"""The driver floor through CUDA minor-version compatibility (verify passes drivers between it
and MIN_DRIVER, with a note: no PTX JIT there)."""
INPUTS_HASH = f"{PREFIX}.inputs-hash"
"""The hash of the rendered inputs: every image imagebuilder builds carries it, and with it
smoke_tests and a manifest; publish skips an image whose registry copy has the same."""
SBOM_DIGEST = f"{PREFIX}.sbom.digest"
MATRIX = f"{PREFIX}.matrix"
LOCK = f"{PREFIX}.lock"
PROBE = f"{PREFIX}.probe"
"""The one label of engine/select.py's probe build."""
