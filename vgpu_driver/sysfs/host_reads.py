"""What a host is made of below the mdev ABI: PCI functions, their drivers,
the IOMMU's groups and whether the kernel has an mdev bus.

Discovery sees only what offers vGPUs (mdev parents, vendor-VFIO VFs);
these reads see the GPUs that offer none, and why: the driver bound to a
function (its ``driver`` link, written by ``drivers/base/bus.c`` on bind),
its ``iommu_group`` link (``drivers/iommu/iommu.c``, only with the IOMMU
on), and the mdev core's traces (``drivers/vfio/mdev/mdev_core.c``:
``bus/mdev`` once the module is loaded, ``class/mdev_bus`` once a vendor
driver registered a parent).  Reads only,
all relative to a :class:`~vgpu_driver.sysfs.paths.SysfsPaths` root.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

from vgpu_driver import names
from vgpu_driver.sysfs import attrs

if TYPE_CHECKING:
    from vgpu_driver.sysfs.paths import SysfsPaths

NVIDIA_VENDOR = "0x10de"
# PCI base class 0x03: display controllers (VGA 0x0300, 3D 0x0302).
DISPLAY_CLASS_PREFIX = "0x03"


@dataclasses.dataclass(frozen=True)
class PciFunction:
    """One PCI function as the checks of a host need it."""

    address: str
    vendor: str | None = None
    device: str | None = None
    pci_class: str | None = None
    driver: str | None = None  # None: no driver bound
    iommu_group: str | None = None  # None: in no group (IOMMU off)
    physfn: str | None = None  # set for an SR-IOV virtual function
    sriov_totalvfs: int | None = None  # set for an SR-IOV physical function
    vendor_vfio: bool = False  # has NVIDIA's ``nvidia/`` directory

    @property
    def device_id(self) -> str | None:
        """``10de:2330``, or None when the IDs cannot be read."""
        if not (self.vendor and self.device):
            return None
        return f"{self.vendor.removeprefix('0x')}:{self.device.removeprefix('0x')}".lower()

    @property
    def is_nvidia_display(self) -> bool:
        return self.vendor == NVIDIA_VENDOR and bool(
            self.pci_class and self.pci_class.startswith(DISPLAY_CLASS_PREFIX)
        )


def pci_function(paths: SysfsPaths, address: object) -> PciFunction | None:
    """The :class:`PciFunction` at ``address``, or None when there is none."""
    address = str(names.parse_pci_address(str(address)))
    dev = paths.pci_device(address)
    if not os.path.isdir(dev):
        return None
    totalvfs = attrs.int_or_none(attrs.read_attr(os.path.join(dev, "sriov_totalvfs")))
    return PciFunction(
        address=address,
        vendor=attrs.read_attr(os.path.join(dev, "vendor")),
        device=attrs.read_attr(os.path.join(dev, "device")),
        pci_class=attrs.read_attr(os.path.join(dev, "class")),
        driver=attrs.link_name(paths.pci_driver(address)),
        iommu_group=attrs.link_name(os.path.join(dev, "iommu_group")),
        physfn=attrs.link_name(os.path.join(dev, "physfn")),
        sriov_totalvfs=totalvfs,
        vendor_vfio=os.path.isdir(paths.vendor_vfio_dir(address)),
    )


def nvidia_gpus(paths: SysfsPaths) -> list[PciFunction]:
    """NVIDIA's display functions that are no VF (the GPUs), by address."""
    found = []
    for entry in attrs.sorted_entries(paths.pci_base()):
        if not names.is_pci_address(entry):
            continue
        function = pci_function(paths, entry)
        if function is not None and function.is_nvidia_display and function.physfn is None:
            found.append(function)
    return found


def nvidia_vfs(paths: SysfsPaths, gpu: PciFunction) -> list[PciFunction]:
    """The VFs of ``gpu`` (a :class:`PciFunction`) that exist now."""
    dev = paths.pci_device(gpu.address)
    found = []
    for entry in attrs.sorted_entries(dev):
        if entry.startswith("virtfn") and entry[len("virtfn") :].isdigit():
            vf = attrs.link_name(os.path.join(dev, entry))
            function = vf and names.is_pci_address(vf) and pci_function(paths, vf)
            if function:
                found.append(function)
    return found


def iommu_groups(paths: SysfsPaths) -> tuple[str, ...] | None:
    """The names of the IOMMU's groups; None when the kernel has no
    ``kernel/iommu_groups`` at all."""
    if not os.path.isdir(paths.iommu_groups()):
        return None
    return tuple(attrs.sorted_entries(paths.iommu_groups()))


def has_mdev_core(paths: SysfsPaths) -> bool:
    """Whether the kernel's mdev core is loaded (``bus/mdev`` exists)."""
    return os.path.isdir(os.path.dirname(paths.mdev_base()))


def has_mdev_parents(paths: SysfsPaths) -> bool:
    """Whether a driver registered an mdev parent (a link under
    ``class/mdev_bus``, which the mdev core makes with the first one)."""
    return bool(attrs.sorted_entries(paths.parent_base()))
