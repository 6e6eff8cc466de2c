"""The host nova-compute and ``vgpu-manage`` work on, assembled in one place.

A host is a sysfs reader (:class:`~vgpu_driver.sysfs.linux.LinuxSysfs`)
given a writer: here the privileged entry points
(:func:`vgpu_driver.privsep.call`), so that every write is made by the
daemon (or a root ``vgpu-manage``) beneath its own root.  NVML answers
through NVIDIA's bindings, or a test host's (:func:`vgpu_driver.nvml.bindings_for`).
Keeping the assembly here keeps the reader, the writer and NVML free of
each other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vgpu_driver import nvml
from vgpu_driver import privsep
from vgpu_driver import sysfs

if TYPE_CHECKING:
    from oslo_config import cfg

    from vgpu_driver.sysfs.writes import WritableSysfs


def writable(root: str) -> WritableSysfs:
    """The host at ``root``, writing through the privileged entry points."""
    return sysfs.open_host(root, writer=privsep.call)


def open_host(conf: cfg.ConfigOpts) -> WritableSysfs:
    """The host ``conf``'s ``[vgpu] sysfs_root`` names."""
    host = writable(conf.vgpu.sysfs_root)
    bindings = nvml.bindings_for(conf)
    if bindings is not None:
        host.nvml_bindings = bindings
    return host
