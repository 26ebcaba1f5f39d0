"""The cuda check's per-GPU work, in a child process: `python -m smoke_tests.gpu_probe`.

Prints one RESULT_PREFIX line of JSON facts (driver, arch list, per device: capability,
kernel coverage, PCI bus id, compute mode, matmul error) for checks.cuda to judge. It
runs in a child so that the CUDA contexts it creates die with it (see child.py).
"""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List, Optional

import torch

from . import driver
from .archs import coverage, ptx_jit_impossible, sm_name
from .child import RESULT_PREFIX

MATMUL_SIZE = 512


def relative_error_on(device: "torch.device | str", size: int = MATMUL_SIZE, seed: int = 0) -> torch.Tensor:
    """max |device matmul - float64 CPU reference| / max |reference|, as a 0-d tensor on device.

    The inputs and the reference come from the CPU; the product (cuBLAS) and the error
    (cast, subtract, abs, max, divide: torch's own kernels) are computed on the device, so
    a GPU whose torch kernels cannot load fails here, not in a user's job. Only the final
    scalar travels back.
    """
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(size, size, generator=generator)
    b = torch.randn(size, size, generator=generator)
    reference = (a.double() @ b.double()).to(device)
    product = a.to(device) @ b.to(device)
    return (product.double() - reference).abs().amax() / reference.abs().amax()


def device_facts(index: int, arch_list: List[str], driver_cuda: Optional[str],
                 listed: Optional[driver.Device]) -> Dict[str, Any]:
    capability = tuple(torch.cuda.get_device_capability(index))
    covered = coverage(capability, arch_list)
    facts: Dict[str, Any] = {
        "index": index,
        "name": torch.cuda.get_device_name(index),
        "capability": list(capability),
        "arch": sm_name(capability),
        "covered": covered.covered,
        "jit": covered.jit,
        "via": covered.via,
        "kernels": covered.describe(capability),
        "pci_bus_id": listed.pci_bus_id if listed else None,
        "compute_mode": listed.compute_mode if listed else None,
        "matmul_rel_error": None,
        "matmul_error": None,
    }
    # Running a kernel there would only raise "no kernel image is available"; the judge
    # says why more clearly.
    if covered.covered and not ptx_jit_impossible(covered, driver_cuda, torch.version.cuda):
        try:
            facts["matmul_rel_error"] = float(relative_error_on(torch.device("cuda", index)).item())
        except Exception as e:  # noqa: BLE001 - the error is the finding
            facts["matmul_error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    return facts


def probe() -> Dict[str, Any]:
    arch_list = list(torch.cuda.get_arch_list())
    display, display_source = driver.display_driver_version()
    driver_cuda, driver_cuda_source = driver.cuda_driver_version()
    listed, listing_error = driver.devices()
    count = torch.cuda.device_count()
    return {
        "torch_cuda": torch.version.cuda,
        "arch_list": arch_list,
        "driver": display,
        "driver_source": display_source,
        "driver_cuda": driver_cuda,
        "driver_cuda_source": driver_cuda_source,
        "devices_error": listing_error,
        "mig": driver.mig_devices(listed),
        "devices": [
            device_facts(index, arch_list, driver_cuda, listed[index] if index < len(listed) else None)
            for index in range(count)
        ],
    }


def main() -> int:
    print(RESULT_PREFIX + json.dumps(probe()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
