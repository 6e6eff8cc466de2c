"""The kernel's mdev ABI seen from user space.

:func:`open_host` returns the production backend for a sysfs root:
:class:`~vgpu_driver.sysfs.linux.LinuxSysfs`, which reads, or given a
``writer``, :class:`~vgpu_driver.sysfs.writes.WritableSysfs`, which also
writes through it (:mod:`vgpu_driver.hosts` gives it the privileged
entry points).  Tests and demos that want a fake kernel's write behaviour
build one from :mod:`vgpu_driver.fake` explicitly; production never
imports it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import overload

from vgpu_driver.sysfs import paths

if TYPE_CHECKING:
    from vgpu_driver.sysfs.linux import LinuxSysfs
    from vgpu_driver.sysfs.writes import WritableSysfs
    from vgpu_driver.sysfs.writes import Writer


@overload
def open_host(root: str = ..., writer: None = None) -> LinuxSysfs: ...


@overload
def open_host(root: str, writer: Writer) -> WritableSysfs: ...


def open_host(root: str = paths.DEFAULT_ROOT, writer: Writer | None = None) -> LinuxSysfs:
    if writer is None:
        from vgpu_driver.sysfs import linux

        return linux.LinuxSysfs(root)
    from vgpu_driver.sysfs import writes

    return writes.WritableSysfs(root, writer)
