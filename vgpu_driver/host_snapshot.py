"""The host's physical GPUs as discovery read them: an immutable snapshot.

What every later stage looks at (the inventory, the allocator, the checks,
``status``): the physical GPUs, each with its mode and its mdev parents, and
the vGPUs that exist.  Apart from how sysfs is read into it
(:mod:`vgpu_driver.discovery`, and its cache
:mod:`vgpu_driver.discovery_cache`): most readers only look at it.
"""

from __future__ import annotations

import collections
import dataclasses

from vgpu_driver import names
from vgpu_driver.sysfs import base

MODE_MDEV = "mdev"
MODE_VENDOR_VFIO = "vendor-vfio"
MODE_VIRTUAL = "virtual"
# An SR-IOV GPU whose VFs are off (after a reboot, until someone enables
# them) or not registered yet: no parent, nothing offered, but configured.
MODE_VFS_PENDING = "vfs-pending"


@dataclasses.dataclass(frozen=True)
class Parent:
    """One mdev parent (or vendor-VFIO VF) of a physical GPU."""

    name: str
    types: tuple[base.MdevTypeInfo, ...]
    mdevs: tuple[base.MdevInfo, ...] = ()
    current_vgpu_type: str | None = None
    # Types the parent lists whose attributes were not read (see
    # discovery.discover).
    unread: tuple[str, ...] = ()

    @property
    def type_ids(self) -> tuple[str, ...]:
        """Every type the parent lists, read or not: as listed when all
        were read, else sorted (as sysfs lists them)."""
        if not self.unread:
            return tuple(t.type_id for t in self.types)
        return tuple(sorted({*(t.type_id for t in self.types), *self.unread}))

    def type(self, type_id: str) -> base.MdevTypeInfo | None:
        for mdev_type in self.types:
            if mdev_type.type_id == type_id:
                return mdev_type
        return None

    def lists(self, type_id: str) -> bool:
        """Whether the parent lists ``type_id``, its attributes read or not."""
        return type_id in self.unread or self.type(type_id) is not None

    @property
    def busy(self) -> bool:
        return bool(self.mdevs) or self.current_vgpu_type is not None


@dataclasses.dataclass(frozen=True)
class PhysicalGPU:
    address: str
    mode: str
    parents: tuple[Parent, ...]
    pci: base.PciDeviceInfo | None = None

    @property
    def sriov(self) -> bool:
        return bool(self.pci and self.pci.sriov_totalvfs)

    @property
    def vfs_off(self) -> bool:
        """An SR-IOV GPU with no VF enabled: it offers nothing until then."""
        return self.mode == MODE_VFS_PENDING and not (self.pci and self.pci.sriov_numvfs)

    @property
    def addresses(self) -> tuple[str, ...]:
        """The GPU's own address and those of its parents (its VFs); with its
        VFs off, those the VFs will take, so that a configuration naming a
        VF finds its board before the VFs are enabled."""
        if self.vfs_off and self.pci is not None:
            return (self.address, *self.pci.future_vf_addresses())
        return (self.address, *(p.name for p in self.parents if p.name != self.address))

    @property
    def mdevs(self) -> tuple[base.MdevInfo, ...]:
        return tuple(m for p in self.parents for m in p.mdevs)

    def vgpu_types_in_use(self) -> dict[str, int]:
        """``{type_id: count}`` of the mdevs (or vendor vGPUs) that exist."""
        counts = collections.Counter(m.type_id for m in self.mdevs)
        counts.update(p.current_vgpu_type for p in self.parents if p.current_vgpu_type)
        return dict(counts)

    def offers(self, type_id: str) -> list[tuple[Parent, base.MdevTypeInfo]]:
        """``[(parent, MdevTypeInfo)]`` for the parents that list ``type_id``."""
        return [(p, info) for p in self.parents if (info := p.type(type_id))]

    def type_info(self, type_id: str) -> base.MdevTypeInfo | None:
        """The richest description of a type any parent gives (name, limits)."""
        infos = [info for _, info in self.offers(type_id)]
        infos.sort(key=lambda i: (i.name is None, i.description is None))
        return infos[0] if infos else None


@dataclasses.dataclass(frozen=True)
class Vgpu:
    """A vGPU that exists: an mdev, or a vendor-VFIO VF set to a type.

    ``id`` is what claims and domains name it by (see
    :func:`vgpu_driver.names.check_vgpu_id`): the mdev's UUID, or the VF's
    PCI address, the VF then being its own parent.
    """

    id: str
    parent: str
    type_id: str

    @property
    def is_vf(self) -> bool:
        return names.is_vf_vgpu_id(self.id)


@dataclasses.dataclass(frozen=True)
class HostSnapshot:
    gpus: tuple[PhysicalGPU, ...]
    mdevs: tuple[base.MdevInfo, ...]
    # The NVIDIA vGPU manager's version, one per host (None: not loaded).
    vgpu_manager_version: str | None = None

    @property
    def vgpus(self) -> tuple[Vgpu, ...]:
        """Every vGPU of the host, mdevs first (by UUID), then VFs (by address)."""
        found = [Vgpu(m.uuid, m.parent, m.type_id) for m in self.mdevs]
        found += [
            Vgpu(p.name, p.name, p.current_vgpu_type)
            for gpu in self.gpus
            for p in gpu.parents
            if p.current_vgpu_type
        ]
        return tuple(found)

    def gpu(self, address: str) -> PhysicalGPU | None:
        for gpu in self.gpus:
            if address in gpu.addresses:
                return gpu
        return None

    def gpu_of_parent(self, parent_name: str) -> PhysicalGPU | None:
        for gpu in self.gpus:
            if any(p.name == parent_name for p in gpu.parents):
                return gpu
        return None
