"""The one privileged entry point: a write to an mdev control file in sysfs.

nova-compute does not run as root; creating or removing an mdev, enabling
VFs or choosing a vendor vGPU type are writes to root-owned sysfs files.  They
all go through :func:`write_attr`, run by an oslo.privsep daemon holding only
``CAP_DAC_OVERRIDE``.  The daemon trusts nothing it is sent: it re-resolves
the path, checks that it lies under the sysfs root, that it names one of
the few attributes vgpu-driver ever writes, and that a vendor vGPU type is a
plain number written into a VF's ``nvidia`` directory.  A process that already runs as
root (``vgpu-manage``) runs it in-process; a fake kernel answers its own
writes and never comes here.
"""

import os
import re

from oslo_privsep import capabilities
from oslo_privsep import priv_context

from vgpu_driver import exception

sysfs_writer = priv_context.PrivContext(
    "vgpu_driver",
    cfg_section="vgpu_driver_sysfs_writer",
    pypath=__name__ + ".sysfs_writer",
    capabilities=[capabilities.CAP_DAC_OVERRIDE],
)

WRITABLE_ATTRIBUTES = frozenset({"create", "remove", "sriov_numvfs", "current_vgpu_type"})
_TYPE_NUMBER_RE = re.compile(r"^[0-9]{1,10}\n?$")


def checked_target(root, path):
    """The real path to write, if it is one we may write; else raise."""
    real_root = os.path.realpath(root)
    real = os.path.realpath(path)
    if not real.startswith(real_root + os.sep):
        raise exception.InvalidSysfsName("sysfs path", path, f"outside {root}")
    if os.path.basename(real) not in WRITABLE_ATTRIBUTES:
        raise exception.InvalidSysfsName("sysfs attribute", os.path.basename(real))
    return real


def checked_value(real, value):
    """Refuse a vGPU type that is not a plain number, or not in a VF's
    ``nvidia`` directory: NVIDIA's driver parses it, not the kernel core."""
    if os.path.basename(real) != "current_vgpu_type":
        return value
    if os.path.basename(os.path.dirname(real)) != "nvidia":
        raise exception.InvalidSysfsName("sysfs attribute", real, "not a VF's nvidia/")
    if not isinstance(value, str) or not _TYPE_NUMBER_RE.match(value):
        raise exception.InvalidSysfsName("vGPU type number", value)
    return value


@sysfs_writer.entrypoint
def write_attr(root, path, value):
    real = checked_target(root, path)
    checked_value(real, value)
    fd = os.open(real, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def run_in_process_when_root():
    """Skip the daemon when the caller already holds the privileges."""
    if os.geteuid() == 0:
        sysfs_writer.set_client_mode(False)
