"""Every label key imagebuilder writes or reads: the OCI image-spec annotations it sets, and
its own io.imagebuilder.* keys. Plain data, no imports: any module may name a label.

The render-time labels (tags.labels_for) depend only on the rendered inputs; the build-time
ones (CREATED, REVISION, MATRIX, LOCK, SBOM_DIGEST) are added by build/run.py, so rendering
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
"""The CUDA release of the block the image was built for: its base image's (12.1.1). Where the
wheels bring another CUDA runtime (cu124 wheels on the 12.1 image), CUDA_RUNTIME says which."""
CUDA_RUNTIME = f"{PREFIX}.cuda.runtime"
"""The CUDA runtime the torch wheels bring: cudart's own number as the lock pins it
(nvidia-cuda-runtime-cu12 12.4.127; nvidia-cuda-runtime 13.0.96 under 2.13's cuda-toolkit 13.0.3).
Its major.minor is torch.version.cuda and the tag's CUDA where the block and the wheels agree."""
CUDA_TOOLKIT = f"{PREFIX}.cuda.toolkit"
"""Devel images only: the CUDA toolkit release nvcc comes from (the base image's, or the PyPI
toolchain's of that update where the block installs nvcc from PyPI)."""
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
# The OS security fixes the image's apt step applied (name=version, space-separated): the plan
# names those new since the registry's image when it rebuilds one (publish/plan.py).
SECURITY_FIXES = f"{PREFIX}.security-fixes"
SBOM_DIGEST = f"{PREFIX}.sbom.digest"
MATRIX = f"{PREFIX}.matrix"
LOCK = f"{PREFIX}.lock"
PROBE = f"{PREFIX}.probe"
"""The one label of engine/select.py's probe build."""
