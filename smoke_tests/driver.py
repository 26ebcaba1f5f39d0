"""What the NVIDIA driver says, read the way the driver itself answers (standard library only).

torch has no public accessor for the driver (torch._C._cuda_getDriverVersion never existed
in torch 2.x), so the CUDA driver API (libcuda.so.1) and NVML (libnvidia-ml.so.1) are asked
through ctypes. None of these calls creates a CUDA context: cuInit and the device queries
do not, which matters on GPUs in exclusive-process compute mode, where a context held by
this process would lock the NCCL workers out.

Also the pure driver-floor judgement that `imagebuilder verify`'s preflight and the cuda
check share, so that both say the same thing about the same driver.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

from .versions import parse_release

CUDA_LIBRARY = "libcuda.so.1"
NVML_LIBRARY = "libnvidia-ml.so.1"
NVIDIA_SMI_TIMEOUT = 30.0

# cuDeviceGetAttribute's CU_DEVICE_ATTRIBUTE_COMPUTE_MODE and the CUcomputemode values.
COMPUTE_MODE_ATTRIBUTE = 20
COMPUTE_MODES = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}
EXCLUSIVE_PROCESS = "EXCLUSIVE_PROCESS"

def _load(library: str) -> Any:
    """The library (a name the dynamic linker finds, or a path: the tests' stand-ins), or None."""
    try:
        return ctypes.CDLL(library)
    except OSError:
        return None


def _call(library: Any, *names_and_args: Any) -> int:
    """library.NAME(*args) for the first NAME it exports (NVML's _v2 entry points before the
    old ones); -1 when it exports none (a stub or a very old driver)."""
    *names, args = names_and_args
    for name in names:
        function = getattr(library, name, None)  # ctypes raises AttributeError for a missing symbol
        if function is not None:
            return int(function(*args))
    return -1


def decode_cuda_version(code: int) -> str:
    """cuDriverGetVersion's integer -> 'major.minor' (12040 -> '12.4', 13000 -> '13.0')."""
    return f"{code // 1000}.{code % 1000 // 10}"


def cuda_driver_version(
    libcuda: str = CUDA_LIBRARY, nvml: str = NVML_LIBRARY
) -> Tuple[Optional[str], str]:
    """(the newest CUDA version the driver supports, e.g. '12.4', where it came from).

    This, not the toolkit's version, decides whether the driver can JIT-compile PTX.
    """
    cuda = _load(libcuda)
    code = ctypes.c_int(0)
    if cuda is not None and _call(cuda, "cuDriverGetVersion", (ctypes.byref(code),)) == 0 and code.value:
        return decode_cuda_version(code.value), "cuDriverGetVersion"
    library = _nvml(nvml)
    if library is not None:
        found = _call(library, "nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion",
                      (ctypes.byref(code),))
        _call(library, "nvmlShutdown", ())
        if found == 0 and code.value:
            return decode_cuda_version(code.value), "NVML"
    return None, f"neither {libcuda} nor {nvml} could be loaded and asked (no driver mounted?)"


def _nvml(path: str) -> Any:
    """NVML, initialised (the caller shuts it down), or None."""
    library = _load(path)
    if library is None:
        return None
    return library if _call(library, "nvmlInit_v2", "nvmlInit", ()) == 0 else None


def display_driver_version(nvml: str = NVML_LIBRARY) -> Tuple[Optional[str], str]:
    """(the driver's own version such as '550.54.15', where it came from)."""
    library = _nvml(nvml)
    if library is not None:
        buffer = ctypes.create_string_buffer(96)
        found = _call(library, "nvmlSystemGetDriverVersion", (buffer, ctypes.c_uint(len(buffer))))
        _call(library, "nvmlShutdown", ())
        if found == 0 and buffer.value:
            return buffer.value.decode(), "NVML"
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        try:
            done = subprocess.run(
                [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT, check=False,
            )
            lines = done.stdout.strip().splitlines()
            if done.returncode == 0 and lines:
                return lines[0].strip(), "nvidia-smi"
        except (OSError, subprocess.TimeoutExpired):
            pass
    return None, "unknown"


@dataclass(frozen=True)
class Device:
    """One CUDA device as the driver API enumerates it (the order torch uses too)."""

    index: int
    name: str
    pci_bus_id: str
    compute_mode: str


def devices(libcuda: str = CUDA_LIBRARY) -> Tuple[List[Device], Optional[str]]:
    """The visible CUDA devices, or why they cannot be listed."""
    cuda = _load(libcuda)
    if cuda is None:
        return [], f"{libcuda} could not be loaded"
    status = _call(cuda, "cuInit", (0,))
    if status != 0:
        return [], f"cuInit failed with CUresult {status}"
    count = ctypes.c_int(0)
    if _call(cuda, "cuDeviceGetCount", (ctypes.byref(count),)) != 0:
        return [], "cuDeviceGetCount failed"
    found: List[Device] = []
    for index in range(count.value):
        handle = ctypes.c_int(0)
        if _call(cuda, "cuDeviceGet", (ctypes.byref(handle), index)) != 0:
            return found, f"cuDeviceGet({index}) failed"
        name = ctypes.create_string_buffer(256)
        bus = ctypes.create_string_buffer(64)
        mode = ctypes.c_int(-1)
        _call(cuda, "cuDeviceGetName", (name, len(name), handle))
        _call(cuda, "cuDeviceGetPCIBusId", (bus, len(bus), handle))
        _call(cuda, "cuDeviceGetAttribute", (ctypes.byref(mode), COMPUTE_MODE_ATTRIBUTE, handle))
        found.append(Device(index, name.value.decode(errors="replace"), bus.value.decode(errors="replace"),
                            COMPUTE_MODES.get(mode.value, f"unknown ({mode.value})")))
    return found, None


def mig_devices(found: Sequence[Device], visible: Optional[str] = None) -> List[int]:
    """Indices of devices that are MIG slices: named '... MIG 1g.10gb', or sharing a PCI bus
    id with another device (slices of one GPU do; NCCL calls that "Duplicate GPU detected").
    CUDA_VISIBLE_DEVICES naming MIG-<uuid> marks every device when the names say nothing."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "") if visible is None else visible
    buses = [device.pci_bus_id.lower() for device in found]
    slices = [
        device.index for device in found
        if " MIG " in f" {device.name} " or (device.pci_bus_id and buses.count(device.pci_bus_id.lower()) > 1)
    ]
    if not slices and any(entry.strip().startswith("MIG-") for entry in visible.split(",")):
        return [device.index for device in found]
    return slices


# ---------------------------------------------------------------- the driver floor (pure)

PASS, FAIL = "pass", "fail"


@dataclass(frozen=True)
class DriverVerdict:
    status: str  # PASS or FAIL
    detail: str
    minor_version_compat: bool = False  # runs only through minor-version compatibility: no PTX JIT


def judge_driver(host: str, min_driver: str, min_driver_compat: Optional[str] = None,
                 cuda: Optional[str] = None) -> DriverVerdict:
    """Is the host driver new enough for an image whose toolkit needs min_driver?

    CUDA's minor-version compatibility runs a toolkit's binaries on any driver of the
    same major from min_driver_compat on (12.x: 525.60.13), but without PTX JIT. So a
    driver below the compatibility floor fails; between the floors it passes with that
    note (the cuda check fails the GPUs that need PTX JIT); above min_driver it passes.
    Raises ValueError when a version is not a dotted number.
    """
    needs = f"this image's CUDA {cuda}" if cuda else "this image"
    driver = parse_release(host)
    if min_driver_compat is not None and driver < parse_release(min_driver_compat):
        return DriverVerdict(FAIL, f"host driver {host} is older than {min_driver_compat}, the oldest that runs "
                                   f"{needs} even through minor-version compatibility: upgrade the driver or "
                                   "use an image for an older CUDA")
    if driver >= parse_release(min_driver):
        return DriverVerdict(PASS, f"host driver {host} >= {min_driver}")
    if min_driver_compat is None:
        return DriverVerdict(FAIL, f"host driver {host} is older than {min_driver}, which {needs} needs: "
                                   "upgrade the driver or use an image for an older CUDA")
    return DriverVerdict(PASS, f"host driver {host} runs {needs} through minor-version compatibility "
                               f"(>= {min_driver_compat}); below {min_driver} the driver cannot JIT-compile "
                               "the image's PTX, so a GPU that needs PTX JIT fails", minor_version_compat=True)
