"""``host check``'s findings on the operator's configuration against the
host: the boards nova.conf names (``[devices] enabled_mdev_types``, each
type's ``device_addresses`` and ``device_ids``) are there and offer vGPUs.

Apart from :mod:`vgpu_driver.host_check_gpus`: these judge nova.conf, not
the host's GPUs and drivers, and point back to those findings when a named
board offers nothing.  Pure, over :class:`vgpu_driver.host_check.HostFacts`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vgpu_driver import service_check
from vgpu_driver.conf import devices
from vgpu_driver.conf import fleet

if TYPE_CHECKING:
    from vgpu_driver.host_check import HostFacts

OK, WARNING, ERROR = service_check.OK, service_check.WARNING, service_check.ERROR
Finding = service_check.Finding


def check_config(facts: HostFacts) -> list[Finding]:
    """The boards nova.conf names are there and offer vGPUs."""
    found = [
        Finding(
            "configured-boards",
            ERROR,
            f"{p.option} = {p.value!r}: {p.reason}",
            "vgpu-manage config check lists every problem of the configuration",
        )
        for p in facts.config_problems
    ]
    if not facts.config.enabled:
        return found + [
            Finding(
                "configured-boards",
                WARNING,
                "no vGPU type is enabled",
                "set [devices] enabled_mdev_types",
            )
        ]
    for type_config in facts.config.types:
        group = devices.group_name(type_config.type_id)
        for address in type_config.device_addresses:
            found.append(_configured_address(facts, group, type_config.type_id, address))
        for device_id in type_config.device_ids:
            found.append(_configured_model(facts, group, type_config.type_id, device_id))
        if not (type_config.device_addresses or type_config.device_ids):
            offering = [g.address for g in facts.snapshot.gpus if g.offers(type_config.type_id)]
            found.append(
                Finding(
                    "configured-boards",
                    OK if offering else ERROR,
                    f"[devices] enabled_mdev_types {type_config.type_id}: offered by "
                    f"{len(offering)} GPU(s)",
                    ""
                    if offering
                    else "see the findings above; vgpu-manage types lists what is offered",
                )
            )
    return found


def _configured_address(facts: HostFacts, group: str, type_id: str, address: str) -> Finding:
    option = f"[{group}] device_addresses {address}"
    gpu = facts.snapshot.gpu(address)
    if gpu is not None:
        if gpu.vfs_off:
            return Finding(
                "configured-boards",
                WARNING,
                f"{option}: board {gpu.address} is there, its VFs are off",
                "vgpu-manage sriov enable --configured",
            )
        return Finding("configured-boards", OK, f"{option}: found (GPU {gpu.address})")
    function = facts.functions_at.get(address)
    if function is None:
        return Finding(
            "configured-boards",
            ERROR,
            f"{option}: no PCI device at this address",
            f"correct [{group}] device_addresses (lspci -D lists the addresses)",
        )
    return Finding(
        "configured-boards",
        ERROR,
        f"{option}: the device is there (driver {function.driver or 'none'}) but offers no vGPU",
        "see this check's vgpu-manager, iommu and vfio lines",
    )


def _configured_model(facts: HostFacts, group: str, type_id: str, device_id: str) -> Finding:
    option = f"[{group}] device_ids {device_id}"
    serving = [g for g in facts.snapshot.gpus if fleet.gpu_device_id(g) == device_id]
    if serving:
        return Finding("configured-boards", OK, f"{option}: {len(serving)} GPU(s) found")
    present = [g.address for g in facts.gpus if g.device_id == device_id]
    if present:
        return Finding(
            "configured-boards",
            ERROR,
            f"{option}: GPU(s) {', '.join(present)} are there but offer no vGPU",
            "see this check's vgpu-manager, iommu and vfio lines",
        )
    return Finding(
        "configured-boards",
        OK,
        f"{option}: no GPU of this model here (a fleet option: other hosts may have one)",
    )
