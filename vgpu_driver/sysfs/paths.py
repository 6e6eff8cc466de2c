"""The one place that knows where things live in sysfs.

Everything is relative to a root directory that plays ``/sys``: the real one
on a host, or a tree written by the fake kernel.  Helpers are named after the
sysfs directories they return, and take only names that
:mod:`vgpu_driver.names` has validated.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from vgpu_driver import exception

if TYPE_CHECKING:
    from vgpu_driver.names import PciAddress

DEFAULT_ROOT = "/sys"
# Directories every sysfs has, GPUs or not: a root without them is a typo,
# not a host without GPUs.
_SYSFS_LANDMARKS = ("bus", "class")


def check_root(root: str) -> str:
    """Refuse a root that does not exist or does not look like sysfs."""
    if not os.path.exists(root):
        raise exception.InvalidSysfsRoot(root=root, reason="does not exist")
    if not os.path.isdir(root):
        raise exception.InvalidSysfsRoot(root=root, reason="is not a directory")
    missing = [d for d in _SYSFS_LANDMARKS if not os.path.isdir(os.path.join(root, d))]
    if missing:
        raise exception.InvalidSysfsRoot(
            root=root, reason=f"has no {' and no '.join(f'{d}/' for d in missing)}"
        )
    return root


class SysfsPaths:
    def __init__(self, root: str = DEFAULT_ROOT) -> None:
        self.root = os.path.abspath(root)
        # Joined once: a full read builds a path under them per function,
        # parent and mdev.
        self._parent_base = self.join("class", "mdev_bus")
        self._mdev_base = self.join("bus", "mdev", "devices")
        self._pci_base = self.join("bus", "pci", "devices")

    def join(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def parent_base(self) -> str:
        """``class/mdev_bus``: one link per registered mdev parent."""
        return self._parent_base

    def mdev_base(self) -> str:
        """``bus/mdev/devices``: one link per existing mdev."""
        return self._mdev_base

    def pci_base(self) -> str:
        """``bus/pci/devices``: one link per PCI function."""
        return self._pci_base

    def virtual_base(self) -> str:
        return self.join("devices", "virtual")

    def parent(self, name: str) -> str:
        return f"{self._parent_base}/{name}"

    def parent_types(self, name: str) -> str:
        return os.path.join(self.parent(name), "mdev_supported_types")

    def parent_type(self, name: str, type_id: str) -> str:
        return os.path.join(self.parent_types(name), type_id)

    def mdev(self, uuid: str) -> str:
        return f"{self._mdev_base}/{uuid}"

    def pci_device(self, address: str | PciAddress) -> str:
        return f"{self._pci_base}/{address}"

    def vendor_vfio_dir(self, address: str | PciAddress) -> str:
        """NVIDIA's vendor-specific VFIO directory of a VF."""
        return f"{self._pci_base}/{address}/nvidia"

    def pci_driver(self, address: str | PciAddress) -> str:
        """A PCI function's ``driver`` link (absent: no driver bound)."""
        return os.path.join(self.pci_device(address), "driver")

    def iommu_groups(self) -> str:
        """``kernel/iommu_groups``: one directory per group, none with the
        IOMMU off."""
        return self.join("kernel", "iommu_groups")

    def module_version(self, module: str) -> str:
        """``module/<module>/version``: a loaded kernel module's version."""
        return self.join("module", module, "version")

    def contains(self, path: str) -> bool:
        """True when ``path`` resolves to a place inside the root."""
        real = os.path.realpath(path)
        root = os.path.realpath(self.root)
        return real == root or real.startswith(root + os.sep)
