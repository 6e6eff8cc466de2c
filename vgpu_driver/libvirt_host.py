"""A libvirt connection of vgpu-manage's own, and the versions of this host.

nova-compute's index over its domains is :class:`~vgpu_driver.domain_index.DomainIndex`,
fed by nova's events on nova's connection.  A command of ``vgpu-manage``
runs no event loop and asks once: :class:`LibvirtHost` opens its own
connection and is that same index without events, so each lookup reads
every defined domain (one XML read each).
"""

import os
import re

from oslo_log import log as logging

from vgpu_driver import domain_index
from vgpu_driver.exception import LibvirtUnavailable

LOG = logging.getLogger(__name__)


def _libvirt(uri):
    try:
        import libvirt
    except ImportError as exc:
        raise LibvirtUnavailable(
            uri=uri, reason="libvirt-python is not installed (pip install vgpu-driver[libvirt])"
        ) from exc
    return libvirt


def version_tuple(number):
    """libvirt's packed version (major * 1e6 + minor * 1e3 + micro)."""
    return number // 1_000_000, number // 1_000 % 1_000, number % 1_000


def kernel_version(release=None):
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", release or os.uname().release)
    return tuple(int(x or 0) for x in match.groups()) if match else (0, 0, 0)


class LibvirtHost(domain_index.DomainIndex):
    """A connection of its own, and the domain index over it (no events:
    every lookup reads the domains again)."""

    def __init__(self, uri):
        self.uri = uri
        libvirt = _libvirt(uri)
        # Errors are raised as exceptions; libvirt need not also print them.
        libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
        try:
            self.conn = libvirt.open(uri)
        except libvirt.libvirtError as exc:
            raise LibvirtUnavailable(uri=uri, reason=str(exc)) from exc
        super().__init__(lambda: self.conn, libvirt)

    def close(self):
        """Close the connection: a process that reads once per request
        (``vgpu-manage metrics serve``) leaves no socket behind."""
        try:
            self.conn.close()
        except self._libvirt.libvirtError as exc:
            LOG.debug("Closing the connection to %s: %s", self.uri, exc)

    disconnect = close

    def versions(self):
        """``{"libvirt": (x, y, z), "qemu": ..., "kernel": ...}`` of this host."""
        try:
            hypervisor = version_tuple(self.conn.getVersion())
        except self._libvirt.libvirtError:
            hypervisor = (0, 0, 0)
        return {
            "libvirt": version_tuple(self.conn.getLibVersion()),
            "qemu": hypervisor,
            "kernel": kernel_version(),
        }
