"""The one GPU a privileged write is on, read beneath the root by fd.

The policy needs of a GPU only its address, its mode and the addresses the
configuration may name it by (its own and its parents'), as discovery
groups them (:func:`vgpu_driver.discovery.assemble`): a VF belongs to the
GPU its ``physfn`` leads to; a registered mdev parent or a VF with NVIDIA's
vendor files is a parent; NVIDIA's files make the board vendor-VFIO; an
SR-IOV NVIDIA board with no parent yet is pending, and with its VFs off it
is also named by the addresses they will take.  Only that GPU's functions
are read: the PF, its ``virtfn`` links and theirs, and the names under
``class/mdev_bus`` (one directory read).  A VF registered as an mdev parent
is not also read for NVIDIA's vendor-VFIO files: a board serves one or the
other.

A write needs even less: the configuration names GPUs by a few addresses,
so the policy asks only which of those are this GPU's
(:func:`gpu_of_parent` with ``among``).  A VF's address follows from its
PF's by the routing-ID rule the kernel itself numbers VFs by (First VF
Offset and VF Stride, ``pci_iov_virtfn_bus``/``_devfn`` in
``drivers/pci/iov.c``), so only a named address that rule puts on this PF
is read, through its ``virtfn<N>`` link; the others, and the
``class/mdev_bus`` listing, are not.
"""

from __future__ import annotations

import errno
import posixpath
import re
from typing import TYPE_CHECKING
from typing import NamedTuple

from vgpu_driver import names

if TYPE_CHECKING:
    from collections.abc import Collection

    from vgpu_driver.privsep.beneath import SysfsRoot

MODE_MDEV = "mdev"  # the values of vgpu_driver.host_snapshot
MODE_VENDOR_VFIO = "vendor-vfio"
MODE_VIRTUAL = "virtual"
MODE_VFS_PENDING = "vfs-pending"
NVIDIA_VENDOR = "0x10de"
_DISPLAY_CLASS_PREFIX = "0x03"
_CURRENT_RE = re.compile(r"0|[1-9][0-9]{0,8}", re.ASCII)  # as PciReads reads it


class Gpu(NamedTuple):
    """One GPU as the policy sees it; ``mode`` None when it was not read
    (a read of only the addresses the configuration names)."""

    address: str
    mode: str | None
    addresses: tuple[str, ...]


def _number(root: SysfsRoot, relpath: str) -> int:
    text = root.read(relpath)
    return int(text) if text.isdigit() else 0


def _is_parent(root: SysfsRoot, name: str) -> bool:
    return root.exists(posixpath.join("class", "mdev_bus", name))


def _registered(root: SysfsRoot) -> frozenset[str]:
    """The names under ``class/mdev_bus`` (none without the mdev core)."""
    try:
        return frozenset(root.listdir(posixpath.join("class", "mdev_bus")))
    except FileNotFoundError:
        return frozenset()


def _is_vendor_vf(root: SysfsRoot, device: str) -> bool:
    """A VF with NVIDIA's vendor files, as :meth:`PciReads.vendor_vf` reads it."""
    vfio = posixpath.join(device, "nvidia")
    return bool(
        _CURRENT_RE.fullmatch(root.read(posixpath.join(vfio, "current_vgpu_type")))
    ) and root.exists(posixpath.join(vfio, "creatable_vgpu_types"))


def _vfs(root: SysfsRoot, pf_device: str) -> list[tuple[str, str]]:
    """``[(VF address, VF device)]`` of a PF, by its ``virtfn<N>`` links."""
    return sorted(
        (posixpath.basename(vf), vf)
        for entry, vf in root.links(pf_device, "virtfn").items()
        if entry[6:].isdigit()
    )


def _future_vfs(root: SysfsRoot, address: str, device: str) -> tuple[str, ...]:
    offset = _number(root, posixpath.join(device, "sriov_offset"))
    stride = _number(root, posixpath.join(device, "sriov_stride"))
    total = _number(root, posixpath.join(device, "sriov_totalvfs"))
    if not (total and offset and stride):
        return ()
    pf = names.parse_pci_address(address)
    return tuple(str(pf.offset(offset + i * stride)) for i in range(total))


def _is_sriov_gpu(root: SysfsRoot, device: str) -> bool:
    return (
        _number(root, posixpath.join(device, "sriov_totalvfs")) > 0
        and root.read(posixpath.join(device, "vendor")) == NVIDIA_VENDOR
        and root.read(posixpath.join(device, "class")).startswith(_DISPLAY_CLASS_PREFIX)
    )


def physical_gpu(root: SysfsRoot, pf_address: str, pf_device: str) -> Gpu | None:
    """The GPU whose physical function is at ``pf_device``, or None when
    discovery would see no GPU there."""
    parents: list[str] = []
    mode: str | None = None
    vfs = _vfs(root, pf_device)
    registered = _registered(root) if vfs else frozenset()
    if pf_address in registered or (not vfs and _is_parent(root, pf_address)):
        parents.append(pf_address)
        mode = MODE_MDEV
    for vf, vf_device in vfs:
        if vf in registered:  # an mdev parent: NVIDIA's VF files are not there
            parents.append(vf)
            mode = mode or MODE_MDEV
        elif _is_vendor_vf(root, vf_device):
            parents.append(vf)
            mode = MODE_VENDOR_VFIO
    if mode is not None:
        return Gpu(pf_address, mode, (pf_address, *sorted(p for p in parents if p != pf_address)))
    if not _is_sriov_gpu(root, pf_device):
        return None
    addresses: tuple[str, ...] = (pf_address,)
    if not _number(root, posixpath.join(pf_device, "sriov_numvfs")):
        addresses += _future_vfs(root, pf_address, pf_device)
    return Gpu(pf_address, MODE_VFS_PENDING, addresses)


def _routing_id(address: names.PciAddress) -> int:
    return address.bus << 8 | address.slot << 3 | address.function


def _vfs_among(
    root: SysfsRoot, pf_address: str, pf_device: str, among: Collection[str]
) -> list[tuple[str, str]]:
    """``[(VF address, VF device)]`` of the PF's VFs whose address is in
    ``among``: the kernel's routing-ID rule says which VF each could be,
    and that ``virtfn<N>`` link must lead to it.  Without the offset and
    stride attributes, the PF's links are listed."""
    numvfs = _number(root, posixpath.join(pf_device, "sriov_numvfs")) if among else 0
    if not numvfs:
        return []
    offset = _number(root, posixpath.join(pf_device, "sriov_offset"))
    stride = _number(root, posixpath.join(pf_device, "sriov_stride"))
    if not (offset and stride):
        return [vf for vf in _vfs(root, pf_device) if vf[0] in among]
    pf = names.parse_pci_address(pf_address)
    found = []
    for address in among:
        if not names.is_pci_address(address):
            continue
        vf = names.parse_pci_address(address)
        index, rest = divmod(_routing_id(vf) - _routing_id(pf) - offset, stride)
        if vf.domain != pf.domain or rest or not 0 <= index < numvfs:
            continue
        try:
            vf_device = root.follow(posixpath.join(pf_device, f"virtfn{index}"), address)
        except OSError as exc:
            if exc.errno != errno.ENODEV:
                raise
            continue
        if posixpath.basename(vf_device) == str(vf):
            found.append((str(vf), vf_device))
    return sorted(found)


def _pf_of(root: SysfsRoot, parent: str, device: str) -> tuple[str, str]:
    """``(address, device)`` of the PF of a PCI function (itself for a PF)."""
    try:
        pf_device = root.follow(posixpath.join(device, "physfn"), parent)
    except OSError as exc:
        if exc.errno != errno.ENODEV:
            raise
        return parent, device
    return posixpath.basename(pf_device), pf_device


def _gpu_among(root: SysfsRoot, parent: str, device: str, among: Collection[str]) -> Gpu:
    """The GPU of the parent ``parent``, named only by its PF, ``parent``
    and those of its parents ``among`` holds; its mode is not read."""
    pf_address, pf_device = _pf_of(root, parent, device)
    parents = {parent}
    for vf, vf_device in _vfs_among(
        root, pf_address, pf_device, [a for a in among if a not in (pf_address, parent)]
    ):
        if _is_parent(root, vf) or _is_vendor_vf(root, vf_device):
            parents.add(vf)
    parents.discard(pf_address)
    return Gpu(pf_address, None, (pf_address, *sorted(parents)))


def gpu_of_parent(
    root: SysfsRoot, parent: str, device: str, among: Collection[str] | None = None
) -> Gpu | None:
    """The GPU of a parent (a registered mdev parent, or a vendor-VFIO VF)
    at ``device``, or None when ``parent`` is neither.

    With ``among`` (the addresses a configuration names), the GPU's
    addresses are only those of them that are its own (its PF's and
    ``parent``'s always), and its mode is None: enough to look a
    configuration up, and the cheapest read."""
    if not names.is_pci_address(parent):
        if not _is_parent(root, parent):
            return None
        key = posixpath.relpath(device, posixpath.join("devices", "virtual"))
        return Gpu(
            key.replace("/", "_"),
            MODE_VIRTUAL,
            tuple(dict.fromkeys((key.replace("/", "_"), parent))),
        )
    if not (_is_parent(root, parent) or _is_vendor_vf(root, device)):
        return None
    if among is not None:
        return _gpu_among(root, parent, device, among)
    pf_address, pf_device = _pf_of(root, parent, device)
    return physical_gpu(root, pf_address, pf_device)
