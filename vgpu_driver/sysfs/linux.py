"""Reads a sysfs tree rooted at a directory: the production path.

:class:`LinuxSysfs` is the one class callers use.  Its reads live in two
mixins, one per side of the ABI (:mod:`vgpu_driver.sysfs.mdev_reads`:
parents, types, mdevs; :mod:`vgpu_driver.sysfs.pci_reads`: PCI functions,
SR-IOV, vendor-VFIO); attribute and link reading is in
:mod:`vgpu_driver.sysfs.attrs`.  It reads only: the writes are
:mod:`vgpu_driver.sysfs.writes`, through a writer it is given.  Links are resolved
lexically (the kernel writes relative links), which is both exact for
sysfs and cheap.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING
from typing import Any

from vgpu_driver import names
from vgpu_driver import nvml
from vgpu_driver.sysfs import attrs
from vgpu_driver.sysfs import base
from vgpu_driver.sysfs import mdev_reads
from vgpu_driver.sysfs import paths as sysfs_paths
from vgpu_driver.sysfs import pci_reads

if TYPE_CHECKING:
    from vgpu_driver.names import PciAddress

# Where callers (the fake kernel, udev, tests) have always found them.
read_attr = attrs.read_attr
resolve_link = attrs.resolve_link
link_name = attrs.link_name
read_parsed = attrs.read_parsed
parse_creatable_vgpu_types = pci_reads.parse_creatable_vgpu_types


class LinuxSysfs(mdev_reads.MdevReads, pci_reads.PciReads, base.SysfsReader):
    """The sysfs reader for a real kernel (or any tree laid out like one)."""

    def __init__(self, root: str = sysfs_paths.DEFAULT_ROOT) -> None:
        self.paths = sysfs_paths.SysfsPaths(sysfs_paths.check_root(root))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.paths.root!r})"

    # NVML's bindings: NVIDIA's (a fake host answers with its own).
    nvml_bindings: Any = None

    def mixed_sizes(self, pf_address: str | PciAddress) -> bool:
        return nvml.heterogeneous_mode(
            str(names.parse_pci_address(str(pf_address))), self.nvml_bindings
        )

    def vgpu_placements(
        self, pf_address: str | PciAddress, type_numbers: Iterable[int]
    ) -> dict[int, nvml.Placements]:
        return nvml.placements(
            str(names.parse_pci_address(str(pf_address))), type_numbers, self.nvml_bindings
        )

    def vgpu_max_instances(
        self, pf_address: str | PciAddress, type_numbers: Iterable[int]
    ) -> dict[int, int]:
        return nvml.max_instances(
            str(names.parse_pci_address(str(pf_address))), type_numbers, self.nvml_bindings
        )

    def vgpu_equal_sizes(
        self, pf_address: str | PciAddress, type_numbers: Iterable[int]
    ) -> dict[int, tuple[int, int]]:
        return nvml.equal_size_types(
            str(names.parse_pci_address(str(pf_address))), type_numbers, self.nvml_bindings
        )

    def vgpu_locations(self, pf_address: str | PciAddress) -> tuple[tuple[int, int], ...]:
        """Each typed VF's ``nvidia/placement_id``, idle or running; NVML's
        active vGPUs only where a VF has no such file (NVML lists only the
        vGPUs whose guest runs)."""
        pf = names.parse_pci_address(str(pf_address))
        found: list[tuple[int, int]] = []
        unread = False
        for vf in self.list_vendor_vfio():
            if vf.physfn != pf or not vf.current_type:
                continue
            placement = self.vendor_placement_id(str(vf.address))
            if placement is None:
                unread = True
            elif placement != pci_reads.INVALID_PLACEMENT_ID:
                found.append((vf.current_type, placement))
        if unread:
            taken = {placement for _number, placement in found}
            found += [
                located
                for located in nvml.located_vgpus(str(pf), self.nvml_bindings)
                if located[1] not in taken
            ]
        return tuple(sorted(found, key=lambda located: located[1]))
