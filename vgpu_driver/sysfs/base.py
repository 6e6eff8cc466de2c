"""The interface over the kernel's mdev ABI, and the records it returns.

Records are plain frozen values with names taken from sysfs.  Implementations:
:class:`~vgpu_driver.sysfs.linux.LinuxSysfs` (any directory that plays
``/sys``) and :class:`~vgpu_driver.fake.fakekernel.FakeKernel` (the same
reader, with the kernel's answers to writes emulated).
"""

from __future__ import annotations

import abc
import dataclasses
import re
from collections.abc import Container
from collections.abc import Iterable
from typing import TYPE_CHECKING

from vgpu_driver import names

if TYPE_CHECKING:
    from vgpu_driver.names import PciAddress
    from vgpu_driver.nvml import Placements
    from vgpu_driver.sysfs.paths import SysfsPaths

_FRAMEBUFFER_RE = re.compile(r"^(\d+)\s*([KMGT]?)i?B?$", re.IGNORECASE)
_UNIT_TO_MB = {"K": 1 / 1024, "": 1 / (1024 * 1024), "M": 1, "G": 1024, "T": 1024 * 1024}


def parse_description(text: str | None) -> dict[str, str]:
    """NVIDIA's ``key=value, key=value`` description as a dict (else empty)."""
    fields = {}
    for item in re.split(r"[,\n]", text or ""):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            fields[key.strip()] = value.strip()
    return fields


def framebuffer_mb(value: str | None) -> int | None:
    """``1024M`` -> 1024; None when absent or unreadable."""
    match = _FRAMEBUFFER_RE.match(value or "")
    if not match:
        return None
    return int(int(match[1]) * _UNIT_TO_MB[match[2].upper()])


@dataclasses.dataclass(frozen=True)
class MdevTypeInfo:
    """One ``mdev_supported_types/<type>`` directory of a parent."""

    type_id: str
    available_instances: int
    device_api: str
    name: str | None = None
    description: str | None = None
    # "<file>: <why>" for each attribute that could not be parsed: the GPU is
    # then reserved with that reason rather than served on a guess.
    unreadable: tuple[str, ...] = ()

    @property
    def attributes(self) -> dict[str, str]:
        return parse_description(self.description)

    @property
    def max_instance(self) -> int | None:
        """The per-GPU maximum the vendor declares, when it declares one."""
        value = self.attributes.get("max_instance")
        return int(value) if value and value.isdigit() else None

    @property
    def framebuffer_mb(self) -> int | None:
        return framebuffer_mb(self.attributes.get("framebuffer"))


@dataclasses.dataclass(frozen=True)
class ParentInfo:
    """A device registered as mdev parent (a link under ``class/mdev_bus``).

    ``address`` is None for virtual parents (kernel samples); ``physfn`` is
    set for SR-IOV virtual functions.
    """

    name: str
    device_path: str
    types: tuple[MdevTypeInfo, ...]
    address: object = None
    physfn: object = None
    # Types listed but not read (a read limited to the types asked for).
    unread: tuple[str, ...] = ()

    def type(self, type_id: str) -> MdevTypeInfo | None:
        for mdev_type in self.types:
            if mdev_type.type_id == type_id:
                return mdev_type
        return None


@dataclasses.dataclass(frozen=True)
class MdevInfo:
    """An existing mdev (a link under ``bus/mdev/devices``)."""

    uuid: str
    parent: str
    type_id: str


@dataclasses.dataclass(frozen=True)
class PciDeviceInfo:
    """The PCI facts discovery needs about a physical function."""

    address: object
    vendor: str | None = None
    device: str | None = None
    numa_node: int | None = None
    sriov_totalvfs: int | None = None
    sriov_numvfs: int | None = None
    virtfns: tuple[PciAddress, ...] = ()
    # The PCI class code as sysfs prints it (``0x030200``: 3D controller).
    pci_class: str | None = None
    # Where the VFs will be (routing IDs after the PF's), known with them off.
    sriov_offset: int | None = None
    sriov_stride: int | None = None

    def future_vf_addresses(self) -> tuple[str, ...]:
        """The addresses the VFs take once enabled, from ``sriov_offset``,
        ``sriov_stride`` and ``sriov_totalvfs``; none when not all known."""
        if not (self.sriov_totalvfs and self.sriov_offset and self.sriov_stride):
            return ()
        pf = names.parse_pci_address(str(self.address))
        return tuple(
            str(pf.offset(self.sriov_offset + i * self.sriov_stride))
            for i in range(self.sriov_totalvfs)
        )


@dataclasses.dataclass(frozen=True)
class VendorVfioInfo:
    """A VF driven through NVIDIA's vendor-specific VFIO files (no mdev).

    ``creatable`` maps numeric vGPU type ids to names, and only lists what
    can still be created on this VF; ``current_type`` is 0 when none is set.
    """

    address: object
    physfn: object
    creatable: tuple[tuple[int, str], ...]
    current_type: int


class SysfsReader(abc.ABC):
    """The kernel's mdev ABI: what is there."""

    # Where the tree is (each reader sets it).
    paths: SysfsPaths

    @abc.abstractmethod
    def list_parents(self, wanted: Container[str] | None = None) -> list[ParentInfo]:
        """All mdev parents with their types, sorted by name; with
        ``wanted`` (type ids), only those types' attributes are read, the
        others' ids kept in ``ParentInfo.unread``."""

    @abc.abstractmethod
    def list_mdevs(self) -> list[MdevInfo]:
        """All existing mdevs, sorted by UUID."""

    @abc.abstractmethod
    def pci_device(self, address: str | PciAddress) -> PciDeviceInfo | None:
        """A :class:`PciDeviceInfo` for an address, or None if absent."""

    @abc.abstractmethod
    def list_sriov_pfs(self, vfs: Container[str] = frozenset()) -> list[PciDeviceInfo]:
        """:class:`PciDeviceInfo` of every physical function that can have
        SR-IOV VFs (GPUs or not), by address: with its VFs off, a GPU is
        no mdev parent and only this tells it is there.  ``vfs``: addresses
        read as VFs in the same pass, which no PF can be, not probed."""

    @abc.abstractmethod
    def list_vendor_vfio(self, parents: Container[str] = frozenset()) -> list[VendorVfioInfo]:
        """VFs exposing NVIDIA's vendor-specific VFIO files, by address.
        ``parents``: names read as mdev parents in the same pass, not
        probed: a board serves mdevs or vendor-VFIO vGPUs, not both."""

    @abc.abstractmethod
    def vendor_vf(self, address: str | PciAddress) -> VendorVfioInfo | None:
        """One VF's :class:`VendorVfioInfo`, or None when it is gone.

        Reads only that VF (allocations look at one GPU), and never pairs a
        type list with the ``current_vgpu_type`` of another moment.
        """

    @abc.abstractmethod
    def vendor_vgpu_set_at(self, address: str | PciAddress) -> float | None:
        """When a VF's ``current_vgpu_type`` last changed, as far as sysfs
        tells (a lower bound of the vGPU's age), or None if it is gone."""

    @abc.abstractmethod
    def vgpu_manager_version(self) -> str | None:
        """The loaded NVIDIA vGPU manager's version (its kernel module's,
        ``550.127.06``), or None when no NVIDIA driver is loaded."""

    @abc.abstractmethod
    def mixed_sizes(self, pf_address: str | PciAddress) -> bool:
        """Whether a vendor-VFIO board is in mixed-size mode (NVML's, not a
        file); raises NvmlUnavailable or MixedSizeModeRefused."""

    @abc.abstractmethod
    def vgpu_placements(
        self, pf_address: str | PciAddress, type_numbers: Iterable[int]
    ) -> dict[int, Placements]:
        """``{type number: vgpu_driver.nvml.Placements}`` of a board in
        mixed-size mode, read together (NVML's, not files); raises as
        :meth:`mixed_sizes`."""

    @abc.abstractmethod
    def vgpu_max_instances(
        self, pf_address: str | PciAddress, type_numbers: Iterable[int]
    ) -> dict[int, int]:
        """``{type number: most vGPUs of it the board holds}`` (NVML's, not
        files: a vendor-VFIO VF lists a type, not how many more fit);
        raises as :meth:`mixed_sizes`."""

    @abc.abstractmethod
    def vgpu_equal_sizes(
        self, pf_address: str | PciAddress, type_numbers: Iterable[int]
    ) -> dict[int, tuple[int, int]]:
        """``{type number: (framebuffer MiB, most vGPUs of it)}`` of the
        types the board supports (NVML's, not files: a VF lists a type,
        not its size); raises as :meth:`mixed_sizes`."""

    @abc.abstractmethod
    def vgpu_locations(self, pf_address: str | PciAddress) -> tuple[tuple[int, int], ...]:
        """``((type number, placement ID), ...)`` of the vGPUs placed on a
        board, idle or running, for the operator's map: each VF's
        ``nvidia/placement_id``, NVML's where the driver has no such file;
        raises as :meth:`mixed_sizes` when NVML must be asked and cannot."""


class SysfsHost(SysfsReader):
    """The kernel's mdev ABI: what is there, and the writes that change it."""

    @abc.abstractmethod
    def create_mdev(self, parent: str, type_id: str, uuid: str) -> None:
        """Write ``uuid`` to the type's ``create``; raises MdevWriteError."""

    @abc.abstractmethod
    def remove_mdev(self, uuid: str, timeout: float | None = None) -> None:
        """Write ``1`` to the mdev's ``remove``; raises MdevWriteError.

        The kernel may block a remove while a guest holds the device; with
        ``timeout`` (seconds) that raises MdevBusy instead of waiting forever.
        """

    @abc.abstractmethod
    def set_vendor_vgpu_type(
        self, address: str | PciAddress, type_number: int, timeout: float | None = None
    ) -> None:
        """Write a vGPU type number (0 clears) to a VF's ``current_vgpu_type``.

        Raises MdevWriteError; clearing a VF a guest still holds may be
        refused or block, hence ``timeout`` (seconds, as for a remove).
        """

    @abc.abstractmethod
    def set_mixed_sizes(self, pf_address: str | PciAddress, enabled: bool) -> None:
        """Switch a vendor-VFIO board to mixed-size mode, or back to
        equal-size; NVML refuses while any vGPU exists on the board."""
