"""A sysfs host's writes, through the writer it is given.

:class:`WritableSysfs` is :class:`~vgpu_driver.sysfs.linux.LinuxSysfs`
plus the four writes nova-compute and ``vgpu-manage`` make.  It checks the
names, then hands each write, by the name of the privileged entry point that
makes it and that entry point's arguments, to its *writer*: in production
:func:`vgpu_driver.privsep.call` (:mod:`vgpu_driver.hosts` assembles that
host), in tests the fake kernel's own store handlers.  This module imports
neither: the seam is the writer.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

from vgpu_driver import exception
from vgpu_driver import names
from vgpu_driver.sysfs import base
from vgpu_driver.sysfs import linux

if TYPE_CHECKING:
    from vgpu_driver.names import PciAddress

# ``writer(entry_point, *args)``: makes one write, raises the kernel's OSError.
Writer = Callable[..., object]

# The writes, by the privileged entry point that makes each one.
ENTRY_POINTS = ("create_mdev", "remove_mdev", "set_vgpu_type", "set_heterogeneous_mode")


def _call_with_timeout(func: Callable[..., object], timeout: float, *args: object) -> object:
    """Run ``func`` in a daemon thread; ETIMEDOUT if it is still blocked after."""
    outcome: dict[str, Any] = {}

    def run() -> None:
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


class WritableSysfs(linux.LinuxSysfs, base.SysfsHost):
    """A sysfs host that writes: ``writer(entry_point, *args)`` makes each
    write (see :data:`ENTRY_POINTS`) and raises the kernel's ``OSError``."""

    def __init__(self, root: str, writer: Writer) -> None:
        super().__init__(root)
        self.writer = writer

    def _privileged(self, entry_point: str, *args: object) -> object:
        """One write, by the privileged entry point of that name (it builds
        the path under its own root from these names)."""
        return self.writer(entry_point, *args)

    def _write(
        self,
        action: str,
        target: str,
        entry_point: str,
        *args: object,
        timeout: float | None = None,
    ) -> None:
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

    def create_mdev(self, parent: str, type_id: str, uuid: str) -> None:
        parent = names.check_parent_name(parent)
        type_id = names.check_type_id(type_id)
        uuid = names.check_mdev_uuid(uuid)
        self._write("create", f"{type_id} on {parent}", "create_mdev", parent, type_id, uuid)

    def remove_mdev(self, uuid: str, timeout: float | None = None) -> None:
        uuid = names.check_mdev_uuid(uuid)
        self._write("remove", f"mdev {uuid}", "remove_mdev", uuid, timeout=timeout)

    def set_mixed_sizes(self, pf_address: str | PciAddress, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise TypeError(f"enabled must be True or False, not {enabled!r}")
        self._privileged(
            "set_heterogeneous_mode", str(names.parse_pci_address(str(pf_address))), enabled
        )

    def set_vendor_vgpu_type(
        self, address: str | PciAddress, type_number: int, timeout: float | None = None
    ) -> None:
        address = names.parse_pci_address(str(address))
        if isinstance(type_number, bool) or not isinstance(type_number, int) or type_number < 0:
            raise exception.InvalidSysfsName("vGPU type number", type_number)
        self._write(
            "current_vgpu_type",
            f"VF {address}",
            "set_vgpu_type",
            str(address),
            type_number,
            timeout=timeout,
        )
