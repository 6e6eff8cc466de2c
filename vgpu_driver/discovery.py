"""sysfs -> an immutable snapshot of the host's physical GPUs.

A physical GPU is what a provider stands for: a physical function with its
mdev parents (itself on time-sliced boards, its VFs on SR-IOV boards, VFs
with NVIDIA's vendor-specific VFIO files on the newest drivers), or a virtual
parent such as the kernel's mtty sample.  Everything the inventory needs is
read once, here, so the rest of the pipeline is pure.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Callable
from collections.abc import Container
from collections.abc import Iterable
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import TypeGuard

from vgpu_driver import names
from vgpu_driver.sysfs import base
from vgpu_driver.sysfs import host_reads

if TYPE_CHECKING:
    from vgpu_driver.sysfs.base import SysfsReader

MODE_MDEV = "mdev"
MODE_VENDOR_VFIO = "vendor-vfio"
MODE_VIRTUAL = "virtual"
# An SR-IOV GPU whose VFs are off (after a reboot, until someone enables
# them) or not registered yet: no parent, nothing offered, but configured.
MODE_VFS_PENDING = "vfs-pending"
NVIDIA_VENDOR = host_reads.NVIDIA_VENDOR


@dataclasses.dataclass(frozen=True)
class Parent:
    """One mdev parent (or vendor-VFIO VF) of a physical GPU."""

    name: str
    types: tuple[base.MdevTypeInfo, ...]
    mdevs: tuple[base.MdevInfo, ...] = ()
    current_vgpu_type: str | None = None
    # Types the parent lists whose attributes were not read (see discover).
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


def _gpu_key(host: SysfsReader, parent: base.ParentInfo) -> tuple[str, str]:
    if parent.physfn is not None:
        return str(parent.physfn), MODE_MDEV
    if parent.address is not None:
        return str(parent.address), MODE_MDEV
    # A virtual parent: named <class>_<device> after devices/virtual/<class>/<device>.
    rel = os.path.relpath(parent.device_path, host.paths.virtual_base())
    return rel.replace(os.sep, "_"), MODE_VIRTUAL


def _vendor_vfio_parents(vendor_vfs: Iterable[base.VendorVfioInfo]) -> dict[str, list[Parent]]:
    by_gpu: collections.defaultdict[str, list[Parent]] = collections.defaultdict(list)
    for vf in vendor_vfs:
        types = tuple(
            base.MdevTypeInfo(
                type_id=names.vendor_type_id(number),
                available_instances=1,
                device_api="vfio-pci",
                name=name,
            )
            for number, name in vf.creatable
        )
        current = names.vendor_type_id(vf.current_type) if vf.current_type else None
        by_gpu[str(vf.physfn or vf.address)].append(
            Parent(name=str(vf.address), types=types, current_vgpu_type=current)
        )
    return by_gpu


def is_sriov_gpu(pci: base.PciDeviceInfo | None) -> TypeGuard[base.PciDeviceInfo]:
    """An NVIDIA display or 3D controller that can have VFs (not a NIC)."""
    return bool(
        pci is not None
        and pci.sriov_totalvfs
        and pci.vendor == NVIDIA_VENDOR
        and (pci.pci_class or "").startswith(host_reads.DISPLAY_CLASS_PREFIX)
    )


def _pending_gpus(
    sriov_pfs: Mapping[str, base.PciDeviceInfo], found: Container[str]
) -> list[PhysicalGPU]:
    """SR-IOV GPUs none of whose VFs is a parent yet."""
    return [
        PhysicalGPU(address=address, mode=MODE_VFS_PENDING, parents=(), pci=pci)
        for address, pci in sriov_pfs.items()
        if is_sriov_gpu(pci) and address not in found
    ]


def gpu_key(host: SysfsReader, parent: base.ParentInfo) -> str:
    """The physical GPU a :class:`~vgpu_driver.sysfs.base.ParentInfo` belongs to."""
    return _gpu_key(host, parent)[0]


def discover(host: SysfsReader, wanted: Container[str] | None = None) -> HostSnapshot:
    """Read the host once and return a :class:`HostSnapshot`.

    ``wanted`` (type ids): read only those types' attributes (each parent's
    other types keep only their ids, :attr:`Parent.unread`), for a caller
    that looks at no other type: the inventory, whose types are the
    configured ones (:attr:`MdevConfig.enabled`).
    """
    mdevs = tuple(host.list_mdevs())
    parents = host.list_parents(wanted)
    vendor_vfs = host.list_vendor_vfio(parent_names(parents))
    return assemble(
        host,
        mdevs,
        parents,
        vendor_vfs,
        host.pci_device,
        host.list_sriov_pfs(known_vfs(parents, vendor_vfs)),
        host.vgpu_manager_version(),
    )


def parent_names(parent_infos: Iterable[base.ParentInfo]) -> frozenset[str]:
    """The names of this pass's mdev parents, which no vendor-VFIO probe
    needs to look at (:meth:`~vgpu_driver.sysfs.base.SysfsReader.list_vendor_vfio`)."""
    return frozenset(p.name for p in parent_infos)


def known_vfs(
    parent_infos: Iterable[base.ParentInfo], vendor_vfs: Iterable[base.VendorVfioInfo]
) -> frozenset[str]:
    """The addresses of this pass's parents and vendor-VFIO functions that
    are VFs (they have a ``physfn`` link): no SR-IOV PF is among them."""
    return frozenset(
        [
            *(p.name for p in parent_infos if p.physfn is not None),
            *(str(vf.address) for vf in vendor_vfs if vf.physfn is not None),
        ]
    )


def assemble(
    host: SysfsReader,
    mdevs: tuple[base.MdevInfo, ...],
    parent_infos: Iterable[base.ParentInfo],
    vendor_vfs: Iterable[base.VendorVfioInfo],
    pci_device: Callable[[str], base.PciDeviceInfo | None],
    sriov_pfs: Iterable[base.PciDeviceInfo],
    manager_version: str | None = None,
) -> HostSnapshot:
    """The snapshot made of what was read: ``parent_infos`` sorted by name,
    ``pci_device(address)`` the PCI facts of a GPU (read now or kept),
    ``sriov_pfs`` the host's SR-IOV physical functions (the same)."""
    by_parent: collections.defaultdict[str, list[base.MdevInfo]] = collections.defaultdict(list)
    for mdev in mdevs:
        by_parent[mdev.parent].append(mdev)
    grouped: collections.defaultdict[str, list[Parent]] = collections.defaultdict(list)
    modes: dict[str, str] = {}
    for info in parent_infos:
        key, mode = _gpu_key(host, info)
        modes[key] = mode
        grouped[key].append(
            Parent(
                name=info.name,
                types=info.types,
                mdevs=tuple(by_parent.get(info.name, ())),
                unread=info.unread,
            )
        )
    for key, parents in _vendor_vfio_parents(vendor_vfs).items():
        modes[key] = MODE_VENDOR_VFIO
        grouped[key].extend(parents)
    pfs = {str(pci.address): pci for pci in sriov_pfs}
    gpus: list[PhysicalGPU] = []
    for key in sorted(grouped):
        pci: base.PciDeviceInfo | None = None
        if modes[key] != MODE_VIRTUAL:
            pci = pfs.get(key) or pci_device(key)
        gpus.append(
            PhysicalGPU(
                address=key,
                mode=modes[key],
                pci=pci,
                parents=tuple(sorted(grouped[key], key=lambda p: p.name)),
            )
        )
    gpus += _pending_gpus(pfs, grouped)
    return HostSnapshot(
        gpus=tuple(sorted(gpus, key=lambda g: g.address)),
        mdevs=mdevs,
        vgpu_manager_version=manager_version,
    )
