"""sysfs -> an immutable snapshot of the host's physical GPUs.

A physical GPU is what a provider stands for: a physical function with its
mdev parents (itself on time-sliced boards, its VFs on SR-IOV boards, VFs
with NVIDIA's vendor-specific VFIO files on the newest drivers), or a virtual
parent such as the kernel's mtty sample.  Everything the inventory needs is
read once, here, so the rest of the pipeline is pure.  Here is how sysfs is
read and grouped by physical GPU; what the snapshot holds is
:mod:`vgpu_driver.host_snapshot`.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Callable
from collections.abc import Container
from collections.abc import Iterable
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import TypeGuard

from vgpu_driver import host_snapshot
from vgpu_driver import names
from vgpu_driver.sysfs import base
from vgpu_driver.sysfs import host_reads

if TYPE_CHECKING:
    from vgpu_driver.sysfs.base import SysfsReader

NVIDIA_VENDOR = host_reads.NVIDIA_VENDOR


def _gpu_key(host: SysfsReader, parent: base.ParentInfo) -> tuple[str, str]:
    if parent.physfn is not None:
        return str(parent.physfn), host_snapshot.MODE_MDEV
    if parent.address is not None:
        return str(parent.address), host_snapshot.MODE_MDEV
    # A virtual parent: named <class>_<device> after devices/virtual/<class>/<device>.
    rel = os.path.relpath(parent.device_path, host.paths.virtual_base())
    return rel.replace(os.sep, "_"), host_snapshot.MODE_VIRTUAL


def _vendor_vfio_parents(
    vendor_vfs: Iterable[base.VendorVfioInfo],
) -> dict[str, list[host_snapshot.Parent]]:
    by_gpu: collections.defaultdict[str, list[host_snapshot.Parent]] = collections.defaultdict(list)
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
            host_snapshot.Parent(name=str(vf.address), types=types, current_vgpu_type=current)
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
) -> list[host_snapshot.PhysicalGPU]:
    """SR-IOV GPUs none of whose VFs is a parent yet."""
    return [
        host_snapshot.PhysicalGPU(
            address=address, mode=host_snapshot.MODE_VFS_PENDING, parents=(), pci=pci
        )
        for address, pci in sriov_pfs.items()
        if is_sriov_gpu(pci) and address not in found
    ]


def gpu_key(host: SysfsReader, parent: base.ParentInfo) -> str:
    """The physical GPU a :class:`~vgpu_driver.sysfs.base.ParentInfo` belongs to."""
    return _gpu_key(host, parent)[0]


def discover(host: SysfsReader, wanted: Container[str] | None = None) -> host_snapshot.HostSnapshot:
    """Read the host once and return a
    :class:`~vgpu_driver.host_snapshot.HostSnapshot`.

    ``wanted`` (type ids): read only those types' attributes (each parent's
    other types keep only their ids,
    :attr:`~vgpu_driver.host_snapshot.Parent.unread`), for a caller that
    looks at no other type: the inventory, whose types are the configured
    ones (:attr:`MdevConfig.enabled`).
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
) -> host_snapshot.HostSnapshot:
    """The snapshot made of what was read: ``parent_infos`` sorted by name,
    ``pci_device(address)`` the PCI facts of a GPU (read now or kept),
    ``sriov_pfs`` the host's SR-IOV physical functions (the same)."""
    by_parent: collections.defaultdict[str, list[base.MdevInfo]] = collections.defaultdict(list)
    for mdev in mdevs:
        by_parent[mdev.parent].append(mdev)
    grouped: collections.defaultdict[str, list[host_snapshot.Parent]] = collections.defaultdict(
        list
    )
    modes: dict[str, str] = {}
    for info in parent_infos:
        key, mode = _gpu_key(host, info)
        modes[key] = mode
        grouped[key].append(
            host_snapshot.Parent(
                name=info.name,
                types=info.types,
                mdevs=tuple(by_parent.get(info.name, ())),
                unread=info.unread,
            )
        )
    for key, parents in _vendor_vfio_parents(vendor_vfs).items():
        modes[key] = host_snapshot.MODE_VENDOR_VFIO
        grouped[key].extend(parents)
    pfs = {str(pci.address): pci for pci in sriov_pfs}
    gpus: list[host_snapshot.PhysicalGPU] = []
    for key in sorted(grouped):
        pci: base.PciDeviceInfo | None = None
        if modes[key] != host_snapshot.MODE_VIRTUAL:
            pci = pfs.get(key) or pci_device(key)
        gpus.append(
            host_snapshot.PhysicalGPU(
                address=key,
                mode=modes[key],
                pci=pci,
                parents=tuple(sorted(grouped[key], key=lambda p: p.name)),
            )
        )
    gpus += _pending_gpus(pfs, grouped)
    return host_snapshot.HostSnapshot(
        gpus=tuple(sorted(gpus, key=lambda g: g.address)),
        mdevs=mdevs,
        vgpu_manager_version=manager_version,
    )
