"""Why a host offers no vGPU: checks over what :mod:`vgpu_driver.host_probe`
read, each a :class:`Finding` that says what to do.

A host with NVIDIA's data-center driver, the IOMMU off or no VFIO module
looks empty to discovery ("0 GPU(s)"), not wrong; these checks look below
it: the GPUs on the PCI bus and their drivers, what NVML says drives them,
the IOMMU, the kernel's mdev or vendor-specific VFIO support, NVIDIA's
``sriov-manage``, the configured boards, then what nova-compute needs
beside (libvirt, the sudo rule, the state directory, Placement).  Pure:
the facts are read elsewhere, so each check can be tried on plain values.

Here: the facts and the order of the findings; the checks are in
:mod:`vgpu_driver.host_check_gpus` (the GPUs and what drives them),
:mod:`vgpu_driver.host_check_config` (nova.conf against the host) and
:mod:`vgpu_driver.service_check`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from vgpu_driver import host_check_config
from vgpu_driver import host_check_gpus
from vgpu_driver import nvml
from vgpu_driver import service_check

if TYPE_CHECKING:
    from vgpu_driver.conf.mdev_settings import MdevConfig
    from vgpu_driver.exception import ConfigProblem
    from vgpu_driver.host_snapshot import HostSnapshot
    from vgpu_driver.sysfs.host_reads import PciFunction

OK, WARNING, ERROR = "ok", "warning", "error"


Finding = service_check.Finding


@dataclasses.dataclass(frozen=True)
class HostFacts:
    """What the checks look at, read once (:func:`vgpu_driver.host_probe.read`)."""

    gpus: tuple[PciFunction, ...]  # each NVIDIA GPU
    vfs: dict[str, tuple[PciFunction, ...]]  # {GPU address: its VFs}
    functions_at: dict[str, PciFunction | None]  # {configured address: its function}
    iommu_groups: tuple[str, ...] | None
    mdev_core: bool
    mdev_parents: bool
    nvidia_module: str | None  # module/nvidia/version
    nvml: dict[str, nvml.GpuFacts] | None  # by GPU address; None: NVML unavailable
    nvml_error: str | None
    snapshot: HostSnapshot
    sriov_manage: tuple[str, str]  # (path, "ok" | "missing" | "not executable")
    config: MdevConfig
    config_problems: tuple[ConfigProblem, ...]
    services: service_check.ServiceFacts


def check(facts: HostFacts) -> list[Finding]:
    """Every finding, the GPUs' first, in the order an operator fixes them."""
    return [
        *host_check_gpus.check_gpus(facts),
        *host_check_gpus.check_vgpu_manager(facts),
        *host_check_gpus.check_iommu(facts),
        *host_check_gpus.check_vfio(facts),
        *host_check_gpus.check_sriov_manage(facts),
        *host_check_config.check_config(facts),
        *service_check.check(facts.services),
    ]
