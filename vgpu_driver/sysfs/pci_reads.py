"""The PCI side of :class:`~vgpu_driver.sysfs.linux.LinuxSysfs`: functions,
SR-IOV and NVIDIA's vendor-VFIO files.

A mixin rather than a module of functions so that ``LinuxSysfs`` stays the
one class callers use; it needs only ``self.paths``
(:class:`~vgpu_driver.sysfs.paths.SysfsPaths`), which ``LinuxSysfs`` sets.
Vendor-VFIO VFs have no mdev: each VF's ``nvidia/current_vgpu_type`` holds
its vGPU, and ``nvidia/creatable_vgpu_types`` what it could host.
"""

from __future__ import annotations

import os
import re
from collections.abc import Container
from typing import TYPE_CHECKING

from oslo_log import log as logging

from vgpu_driver import names
from vgpu_driver.sysfs import attrs
from vgpu_driver.sysfs import base
from vgpu_driver.sysfs.mdev_reads import pci_address

if TYPE_CHECKING:
    from vgpu_driver.names import PciAddress
    from vgpu_driver.sysfs.paths import SysfsPaths

_VIRTFN_RE = re.compile(r"^virtfn(\d+)$")
# A vendor type number: ASCII digits, no sign, no leading zero, at most nine
# of them (what names.vendor_type_id and the privileged side accept).
_CREATABLE_RE = re.compile(r"[ \t]*([1-9][0-9]{0,8})[ \t]*:?[ \t]+(.*?)\s*", re.ASCII)
_CURRENT_RE = re.compile(r"0|[1-9][0-9]{0,8}", re.ASCII)
_CONSISTENT_READ_TRIES = 5
# NVIDIA's placement ID of a vGPU without one (NVA081_PLACEMENT_ID_INVALID).
INVALID_PLACEMENT_ID = 0xFFFF
LOG = logging.getLogger(__name__)


def parse_creatable_vgpu_types(text: str | None) -> tuple[tuple[int, str], ...]:
    """``creatable_vgpu_types``: a header, then ``ID : Name`` lines."""
    result = []
    for line in (text or "").splitlines():
        match = _CREATABLE_RE.fullmatch(line)
        if match:
            result.append((int(match[1]), match[2]))
    return tuple(result)


def _current_type(text: str | None, path: str) -> int | None:
    """A VF's ``current_vgpu_type`` (0: none); None, logged, for garbage: a VF
    whose type cannot be read is neither free nor of any type."""
    if text is None:
        return None
    if _CURRENT_RE.fullmatch(text):
        return int(text)
    LOG.warning(
        "Unreadable sysfs value: %s: %r is not a vGPU type number; the VF is left out",
        path,
        text[:40],
    )
    return None


_VERSION_RE = re.compile(r"[0-9]{1,6}(\.[0-9]{1,6}){1,3}")
NVIDIA_MODULE = "nvidia"


def _module_version(text: str) -> str:
    if not _VERSION_RE.fullmatch(text):
        raise ValueError("not a dotted version")
    return text


class PciReads:
    """Reads of ``bus/pci/devices``: a function, SR-IOV PFs and vendor-VFIO VFs."""

    paths: SysfsPaths

    def pci_device(self, address: str | PciAddress) -> base.PciDeviceInfo | None:
        dev = self.paths.pci_device(pci_address(str(address)))
        try:
            # The listing is the first read: no stat before it.
            entries = os.listdir(dev)
        except (FileNotFoundError, NotADirectoryError):
            return None
        virtfns = []
        for entry in entries:
            match = _VIRTFN_RE.match(entry)
            # A VF's link names its address: its last component is enough.
            target = attrs.link_name(f"{dev}/{entry}") if match else None
            if match and target:
                virtfns.append((int(match[1]), pci_address(target, f"{address}/{entry}")))
        totalvfs = _read_int(dev, "sriov_totalvfs")
        numvfs = _read_int(dev, "sriov_numvfs")
        # Where the VFs will be matters only while they are off
        # (PhysicalGPU.addresses); with them on, their links say it.
        future = bool(totalvfs) and not numvfs
        return base.PciDeviceInfo(
            address=address,
            vendor=attrs.read_attr(f"{dev}/vendor"),
            device=attrs.read_attr(f"{dev}/device"),
            numa_node=_read_int(dev, "numa_node"),
            sriov_totalvfs=totalvfs,
            sriov_numvfs=numvfs,
            virtfns=tuple(vf for _, vf in sorted(virtfns)),
            pci_class=attrs.read_attr(f"{dev}/class"),
            sriov_offset=_read_int(dev, "sriov_offset") if future else None,
            sriov_stride=_read_int(dev, "sriov_stride") if future else None,
        )

    def vgpu_manager_version(self) -> str | None:
        """``module/nvidia/version``: the vGPU manager is NVIDIA's kernel
        module (the one driving the physical functions); a value that is no
        version is logged and read as unknown."""
        return attrs.read_parsed(self.paths.module_version(NVIDIA_MODULE), _module_version, [])

    def list_sriov_pfs(self, vfs: Container[str] = frozenset()) -> list[base.PciDeviceInfo]:
        found = []
        pci_base = self.paths.pci_base()
        for entry in attrs.sorted_entries(pci_base):
            # One failed open per function that is no SR-IOV PF, but none for
            # the VFs the caller knows: the kernel gives a VF no SR-IOV files
            # (drivers/pci/iov.c shows them only where dev_is_pf()).
            if entry in vfs:
                continue
            if (
                names.is_pci_address(entry)
                and attrs.read_attr(f"{pci_base}/{entry}/sriov_totalvfs") is not None
            ):
                info = self.pci_device(entry)
                if info is not None:
                    found.append(info)
        return found

    def list_vendor_vfio(self, parents: Container[str] = frozenset()) -> list[base.VendorVfioInfo]:
        found = []
        for entry in attrs.sorted_entries(self.paths.pci_base()):
            # NVIDIA's driver registers a function as an mdev parent or
            # gives it the vendor-VFIO files, never both (its mdev mode or
            # its vendor-specific VFIO mode, per board): a parent of this
            # pass costs no probe.
            if entry in parents or not names.is_pci_address(entry):
                continue
            vf = self.vendor_vf(entry)
            if vf is not None:
                found.append(vf)
        return found

    def vendor_vf(self, address: str | PciAddress) -> base.VendorVfioInfo | None:
        address = names.parse_pci_address(str(address))
        vfio_dir = self.paths.vendor_vfio_dir(address)
        current_path = f"{vfio_dir}/current_vgpu_type"
        text = attrs.read_attr(current_path)
        if text is None:
            # Not a VF with NVIDIA's files: one failed open per PCI function.
            return None
        current = _current_type(text, current_path)
        if current is None:
            return None
        for _attempt in range(_CONSISTENT_READ_TRIES):
            creatable = attrs.read_attr(os.path.join(vfio_dir, "creatable_vgpu_types"))
            if creatable is None:
                return None
            # The list depends on the VF's own type: only keep a pair read
            # with no change of that type in between.
            again = _current_type(attrs.read_attr(current_path), current_path)
            if again is None:
                return None
            if again == current:
                break
            current = again
        pf = attrs.link_name(os.path.join(self.paths.pci_device(address), "physfn"))
        return base.VendorVfioInfo(
            address=address,
            physfn=names.parse_pci_address(pf) if pf else None,
            creatable=parse_creatable_vgpu_types(creatable),
            current_type=current,
        )

    def vendor_placement_id(self, address: str | PciAddress) -> int | None:
        """The placement ID in a VF's ``nvidia/placement_id``: an int,
        ``INVALID_PLACEMENT_ID`` where the vGPU has none (``Not Applicable``
        or garbage, logged), None where the driver has no such file."""
        path = os.path.join(
            self.paths.vendor_vfio_dir(names.parse_pci_address(str(address))), "placement_id"
        )
        text = attrs.read_attr(path)
        if text is None:
            return None
        if _CURRENT_RE.fullmatch(text):
            return int(text)
        if text.lower() != "not applicable":
            LOG.warning(
                "Unreadable sysfs value: %s: %r is not a placement ID; the vGPU is left unplaced",
                path,
                text[:40],
            )
        return INVALID_PLACEMENT_ID

    def vendor_vgpu_set_at(self, address: str | PciAddress) -> float | None:
        path = os.path.join(
            self.paths.vendor_vfio_dir(names.parse_pci_address(str(address))), "current_vgpu_type"
        )
        try:
            return os.lstat(path).st_ctime
        except FileNotFoundError:
            return None


def _read_int(dev: str, name: str) -> int | None:
    """A numeric attribute of a PCI function; garbage is logged naming the
    file (and read as absent), not taken silently for "no SR-IOV"."""
    return attrs.read_parsed(f"{dev}/{name}", _parse_int, [])


def _parse_int(text: str) -> int:
    return int(text, 0)
