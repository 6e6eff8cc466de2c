"""NVIDIA SR-IOV GPUs (A100 and later) as they are now: the model.

A physical function, its VFs and what each VF offers, read from a
discovery snapshot, plus the lookup of one GPU an operator names, refused
(:class:`~vgpu_driver.exception.SriovRefused`) before any write where the
address is no NVIDIA display or 3D controller with SR-IOV.  Reading only:
planning (:mod:`vgpu_driver.sriov_plan`), running NVIDIA's script
(:mod:`vgpu_driver.sriov_apply`) and waiting for the VFs
(:mod:`vgpu_driver.sriov_wait`) all build on this view.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import names

if TYPE_CHECKING:
    from vgpu_driver.host_snapshot import HostSnapshot
    from vgpu_driver.host_snapshot import Parent
    from vgpu_driver.host_snapshot import PhysicalGPU
    from vgpu_driver.sysfs.base import PciDeviceInfo
    from vgpu_driver.sysfs.base import SysfsReader

STATE_OFF = "off"
STATE_ENABLED = "enabled"
STATE_PARTIAL = "partial"


@dataclasses.dataclass(frozen=True)
class VirtualFunction:
    address: str
    # The mdev types it offers (vendor-VFIO: the types it can still take).
    mdev_types: tuple[str, ...]
    # Whether it is an mdev parent or has NVIDIA's vendor-VFIO files yet.
    ready: bool
    # mdev UUIDs on it, and the vendor-VFIO vGPU type set on it (if any).
    mdevs: tuple[str, ...] = ()
    vgpu_type: str | None = None

    @property
    def busy(self) -> bool:
        return bool(self.mdevs) or self.vgpu_type is not None


@dataclasses.dataclass(frozen=True)
class PhysicalFunction:
    """An NVIDIA GPU that can have VFs, and what its VFs offer now."""

    address: str
    vendor: str | None
    device: str | None
    pci_class: str | None
    totalvfs: int
    numvfs: int
    vfs: tuple[VirtualFunction, ...]

    @property
    def state(self) -> str:
        """``off`` (no VF), ``enabled`` (every VF ready), ``partial`` (VFs
        enabled, some not registered by the vendor driver yet)."""
        if not self.numvfs:
            return STATE_OFF
        ready = sum(1 for vf in self.vfs if vf.ready)
        return STATE_ENABLED if ready == self.numvfs else STATE_PARTIAL

    @property
    def mdev_types(self) -> tuple[str, ...]:
        return tuple(sorted({t for vf in self.vfs for t in vf.mdev_types}))

    @property
    def ready_vfs(self) -> int:
        return sum(1 for vf in self.vfs if vf.ready)


def _vf(address: object, parent: Parent | None) -> VirtualFunction:
    if parent is None:
        return VirtualFunction(str(address), (), False)
    return VirtualFunction(
        str(address),
        parent.type_ids,
        True,
        tuple(m.uuid for m in parent.mdevs),
        parent.current_vgpu_type,
    )


def _function(pci: PciDeviceInfo, gpu: PhysicalGPU | None) -> PhysicalFunction:
    parents = {p.name: p for p in gpu.parents} if gpu else {}
    return PhysicalFunction(
        address=str(pci.address),
        vendor=pci.vendor,
        device=pci.device,
        pci_class=pci.pci_class,
        totalvfs=pci.sriov_totalvfs or 0,
        numvfs=pci.sriov_numvfs or 0,
        vfs=tuple(_vf(vf, parents.get(str(vf))) for vf in pci.virtfns),
    )


def list_functions(host: SysfsReader) -> list[PhysicalFunction]:
    """Every NVIDIA SR-IOV GPU of the host, by address."""
    return functions_in(discovery.discover(host))


def functions_in(snapshot: HostSnapshot) -> list[PhysicalFunction]:
    """Every NVIDIA SR-IOV GPU of an already read snapshot, by address.

    Discovery keeps each such GPU (with its VFs off too) and its PCI facts,
    so a view that has a snapshot need not read sysfs again.
    """
    found = [_function(gpu.pci, gpu) for gpu in snapshot.gpus if discovery.is_sriov_gpu(gpu.pci)]
    return sorted(found, key=lambda f: f.address)


def function(host: SysfsReader, address: object, action: str) -> PhysicalFunction:
    """The GPU at ``address``, or SriovRefused naming why it is not one.

    ``address`` is typed by an operator: blanks around it are dropped here,
    the check itself refuses them."""
    try:
        address = str(names.parse_pci_address(str(address).strip()))
    except exception.InvalidSysfsName:
        raise exception.SriovRefused(
            action=action, address=address, reason="not a PCI address (dddd:bb:ss.f)"
        ) from None
    pci = host.pci_device(address)

    def refuse(why: str) -> exception.SriovRefused:
        return exception.SriovRefused(action=action, address=address, reason=why)

    if pci is None:
        raise refuse("no PCI device at this address on this host (see vgpu-manage sriov status)")
    if pci.vendor != discovery.NVIDIA_VENDOR:
        raise refuse(
            f"vendor {pci.vendor} is not NVIDIA ({discovery.NVIDIA_VENDOR}); only "
            "NVIDIA GPUs are managed"
        )
    if not discovery.is_sriov_gpu(pci):
        if not pci.sriov_totalvfs:
            raise refuse("it is not an SR-IOV physical function (no sriov_totalvfs)")
        raise refuse(f"PCI class {pci.pci_class} is not a display or 3D controller (0x03...)")
    snapshot = discovery.discover(host)
    return _function(pci, snapshot.gpu(address))
