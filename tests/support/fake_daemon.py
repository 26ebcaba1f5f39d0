"""The daemon verify runs its containers on, faked (FakeEngine: imagebuilder.engine.api's Runner),
and the registry verify reads, offline (OfflineRegistry: verify.facts' RegistryReader)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from imagebuilder.engine.api import NO_ACCESS, HostAccess, RunResult
from imagebuilder.engine.errors import ContainerFailed
from imagebuilder.registry.api import RegistryUnavailable
from imagebuilder.verify.lend import PROBE_PREFIX

if TYPE_CHECKING:
    from imagebuilder.engine.api import Runner
    from imagebuilder.verify.facts import RegistryReader


class OfflineRegistry:
    """A registry this test machine cannot reach: what verify's reads of it meet offline."""

    def blobs(self, ref: str) -> dict[str, tuple[int, str]]:
        raise RegistryUnavailable(url=f"https://{ref.partition('/')[0]}/v2/", detail="offline")

    def provenance(self, ref: str) -> dict[str, Any] | None:
        raise RegistryUnavailable(url=f"https://{ref.partition('/')[0]}/v2/", detail="offline")

    def image_config(self, ref: str, platform: str | None = None) -> tuple[dict[str, Any], tuple[str, ...]] | None:
        raise RegistryUnavailable(url=f"https://{ref.partition('/')[0]}/v2/", detail="offline")

    def digest(self, ref: str) -> str | None:
        raise RegistryUnavailable(url=f"https://{ref.partition('/')[0]}/v2/", detail="offline")


OFFLINE = OfflineRegistry()


def document(*statuses: str) -> dict[str, Any]:
    checks = [{"name": f"c{n}", "status": s, "reason": f"why {n}", "measurements": {"seconds": 0.1}}
              for n, s in enumerate(statuses)]
    return {"ok": "fail" not in statuses, "torch": "2.6.0+cu124", "gpu_count": 8, "checks": checks}


SMI_TWO_H100 = RunResult(0, "NVIDIA H100 80GB HBM3, 550.54.15\n" * 2, False, 0.5)
BUILT_BY_IMAGEBUILDER = {"io.imagebuilder.inputs-hash": "0" * 64}
TORCH_PROBE_OUTPUT = PROBE_PREFIX + json.dumps({"python": "3.11.2", "torch": "2.6.0+cu124", "torch_cuda": "12.4"})


@dataclass
class FakeEngine:
    """The Engine surface verify uses, recording every container it was asked to run: the GPU
    probe (nvidia-smi), the torch probe (python3 -c) and the smoke tests."""

    present: bool = True
    labels: dict[str, str] = field(default_factory=lambda: dict(BUILT_BY_IMAGEBUILDER))
    info_doc: dict[str, Any] = field(default_factory=lambda: {"Runtimes": {"runc": {}, "nvidia": {}}})
    smi: RunResult | Exception = SMI_TWO_H100
    probe: RunResult = RunResult(0, TORCH_PROBE_OUTPUT + "\n", False, 2.0)
    result: RunResult = RunResult(0, json.dumps(document("pass")), False, 1.0)
    run_error: Exception | None = None
    rdma: RunResult = RunResult(0, "rdma-probe end\n", False, 0.1)
    """What the RDMA probe lists: by default a host without RDMA devices."""
    refuses_access: bool = False
    """The daemon refuses to start a container with added devices, ulimits or capabilities (rootless)."""
    runs: list[dict[str, Any]] = field(default_factory=list)
    pulled: list[str] = field(default_factory=list)

    def ping(self) -> None:
        pass

    def info(self) -> dict[str, Any]:
        return self.info_doc

    def image_exists(self, ref: str) -> bool:
        return self.present

    def image_labels(self, ref: str) -> dict[str, str]:
        return self.labels

    def pull(self, ref: str) -> None:
        from imagebuilder.engine.errors import PullFailed

        self.pulled.append(ref)
        raise PullFailed(ref=ref, detail="manifest unknown")

    def run(self, image: str, command: Sequence[str] | str, *, timeout: float, gpus: bool = False,
            shm_size: str | None = None, environment: Mapping[str, str] | None = None,
            volumes: Mapping[str, str] | None = None, workdir: str | None = None,
            archives: Mapping[str, bytes] | None = None, on_output: Callable[[str], None] | None = None,
            access: HostAccess = NO_ACCESS) -> RunResult:
        self.runs.append({"image": image, "command": list(command), "timeout": timeout, "gpus": gpus,
                          "shm_size": shm_size, "environment": dict(environment or {}),
                          "volumes": dict(volumes or {}), "archives": dict(archives or {}), "access": access})
        if command[0] == "nvidia-smi":
            if isinstance(self.smi, Exception):
                raise self.smi
            return self.smi
        if list(command[:2]) == ["python3", "-c"]:
            return self.probe
        if command[0] == "sh" and "rdma-probe" in command[-1]:
            return self.rdma
        if access and self.refuses_access:
            raise ContainerFailed(image=image, detail="error setting rlimit type 8: operation not permitted")
        if self.run_error is not None:
            raise self.run_error
        if on_output is not None:
            for line in self.result.output.splitlines():
                on_output(line)  # as the container prints it
        return self.result

    @property
    def smoke_run(self) -> dict[str, Any]:
        (run,) = [run for run in self.runs if "smoke_tests" in run["command"]]
        return run


if TYPE_CHECKING:  # mypy's proof that each fake is what it stands in for
    _runner: Runner = FakeEngine()
    _registry: RegistryReader = OFFLINE
