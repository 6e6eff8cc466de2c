"""Reads and writes a sysfs tree rooted at a directory: the production path.

:class:`LinuxSysfs` is the one class callers use.  Its reads live in two
mixins, one per side of the ABI (:mod:`vgpu_driver.sysfs.mdev_reads`:
parents, types, mdevs; :mod:`vgpu_driver.sysfs.pci_reads`: PCI functions,
SR-IOV, vendor-VFIO); attribute and link reading is in
:mod:`vgpu_driver.sysfs.attrs`.  The writes stay here: every one goes
through an entry point of :mod:`vgpu_driver.privsep`.  Links are resolved
lexically (the kernel writes relative links), which is both exact for
sysfs and cheap.
"""

import errno
import threading

from vgpu_driver import exception
from vgpu_driver import names
from vgpu_driver import nvml
from vgpu_driver import privsep
from vgpu_driver.sysfs import attrs
from vgpu_driver.sysfs import base
from vgpu_driver.sysfs import mdev_reads
from vgpu_driver.sysfs import paths as sysfs_paths
from vgpu_driver.sysfs import pci_reads

# Where callers (the fake kernel, udev, tests) have always found them.
read_attr = attrs.read_attr
resolve_link = attrs.resolve_link
link_name = attrs.link_name
read_parsed = attrs.read_parsed
parse_creatable_vgpu_types = pci_reads.parse_creatable_vgpu_types


def _call_with_timeout(func, timeout, *args):
    """Run ``func`` in a daemon thread; ETIMEDOUT if it is still blocked after."""
    outcome = {}

    def run():
        try:
            outcome["result"] = func(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="sysfs-write", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise OSError(errno.ETIMEDOUT, f"still blocked after {timeout:g}s", args[0])
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("result")


class LinuxSysfs(mdev_reads.MdevReads, pci_reads.PciReads, base.SysfsHost):
    """The sysfs backend for a real kernel (or any tree laid out like one)."""

    def __init__(self, root=sysfs_paths.DEFAULT_ROOT):
        self.paths = sysfs_paths.SysfsPaths(sysfs_paths.check_root(root))

    def __repr__(self):
        return f"{type(self).__name__}({self.paths.root!r})"

    # -- writes --------------------------------------------------------------

    def _privileged(self, entry_point, *args):
        """One write, by the privileged entry point of that name (it builds
        the path under its own root from these names)."""
        return privsep.call(entry_point, *args)

    def _write(self, action, target, entry_point, *args, timeout=None):
        """One write; kernel errnos become typed errors naming the target.

        With ``timeout``, the write runs in a worker thread: the kernel can
        block a ``remove`` for as long as a guest holds the device.
        """
        try:
            if timeout is None:
                self._privileged(entry_point, *args)
            else:
                _call_with_timeout(self._privileged, timeout, entry_point, *args)
        except OSError as exc:
            raise exception.MdevWriteError.from_os_error(action, target, exc) from exc

    def create_mdev(self, parent, type_id, uuid):
        parent = names.check_parent_name(parent)
        type_id = names.check_type_id(type_id)
        uuid = names.check_mdev_uuid(uuid)
        self._write("create", f"{type_id} on {parent}", "create_mdev", parent, type_id, uuid)

    def remove_mdev(self, uuid, timeout=None):
        uuid = names.check_mdev_uuid(uuid)
        self._write("remove", f"mdev {uuid}", "remove_mdev", uuid, timeout=timeout)

    # NVML's bindings: NVIDIA's (a fake host answers with its own).
    nvml_bindings = None

    def mixed_sizes(self, pf_address):
        return nvml.heterogeneous_mode(str(names.parse_pci_address(str(pf_address))),
                                       self.nvml_bindings)

    def vgpu_placements(self, pf_address, type_numbers):
        return nvml.placements(str(names.parse_pci_address(str(pf_address))),
                               type_numbers, self.nvml_bindings)

    def vgpu_locations(self, pf_address):
        return nvml.located_vgpus(str(names.parse_pci_address(str(pf_address))),
                                  self.nvml_bindings)

    def set_mixed_sizes(self, pf_address, enabled):
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be True or False, not {enabled!r}")
        self._privileged("set_heterogeneous_mode",
                         str(names.parse_pci_address(str(pf_address))), enabled)

    def set_vendor_vgpu_type(self, address, type_number, timeout=None):
        address = names.parse_pci_address(str(address))
        if isinstance(type_number, bool) or not isinstance(type_number, int) \
                or type_number < 0:
            raise exception.InvalidSysfsName("vGPU type number", type_number)
        self._write("current_vgpu_type", f"VF {address}", "set_vgpu_type", str(address),
                    type_number, timeout=timeout)
