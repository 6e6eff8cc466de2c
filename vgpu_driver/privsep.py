"""The privileged entry points: one per sysfs write the driver ever makes.

nova-compute does not run as root; creating or removing an mdev, enabling
VFs or choosing a vendor vGPU type are writes to root-owned sysfs files, made
by an oslo.privsep daemon holding only ``CAP_DAC_OVERRIDE``.  The daemon is
sent names, never paths: it validates them, builds the path itself under the
sysfs root of *its own* configuration (``[vgpu] sysfs_root`` of the files it
was started with), resolves every link and writes only the exact attribute
of a registered mdev parent, of an mdev on one, or of an SR-IOV function of
a display or 3D controller (PCI class ``0x03xxxx``).  A process that already
runs as root (``vgpu-manage``) runs the entry points in-process, its own
configuration fixing the root.  Refusals are :class:`InvalidSysfsName`; the
kernel's errnos come back as ``OSError``.
"""

import errno
import os

from oslo_config import cfg
from oslo_privsep import capabilities
from oslo_privsep import daemon
from oslo_privsep import priv_context

from vgpu_driver import exception
from vgpu_driver import names
from vgpu_driver.conf import vgpu as vgpu_conf

sysfs_writer = priv_context.PrivContext(
    "vgpu_driver",
    cfg_section="vgpu_driver_sysfs_writer",
    pypath=__name__ + ".sysfs_writer",
    capabilities=[capabilities.CAP_DAC_OVERRIDE],
)

_DISPLAY_CLASS_PREFIX = "0x03"
_MAX_TYPE_NUMBER = 2 ** 32 - 1
_fixed = {}


# -- the caller's side ---------------------------------------------------------


def run_in_process_when_root(sysfs_root):
    """Skip the daemon when the caller already holds the privileges; the
    caller's own configuration then fixes the root."""
    if os.geteuid() == 0:
        run_in_process(sysfs_root)


def run_in_process(sysfs_root):
    sysfs_writer.set_client_mode(False)
    _fixed["root"] = os.path.realpath(sysfs_root)


def use_daemon():
    """Back to the default: every call goes to the privsep daemon."""
    sysfs_writer.set_client_mode(True)
    _fixed.pop("root", None)


def ensure_started():
    """Start the daemon now, so that failing to start is not a device error."""
    if not sysfs_writer.client_mode or sysfs_writer.channel is not None:
        return
    try:
        sysfs_writer.start()
    except (OSError, daemon.FailedToDropPrivileges) as exc:
        raise exception.PrivilegedHelperUnavailable(reason=str(exc)) from exc


def call(entry_point, *args):
    """Run one entry point of this module by name, starting the daemon first."""
    ensure_started()
    return _ENTRY_POINTS[entry_point](*args)


# -- the privileged side -------------------------------------------------------


def sysfs_root():
    """The root every path is built under, fixed once on this side."""
    if "root" not in _fixed:
        conf = cfg.CONF
        try:
            configured = conf.vgpu.sysfs_root
        except cfg.NoSuchOptError:
            vgpu_conf.register_opts(conf)
            configured = conf.vgpu.sysfs_root
        _fixed["root"] = os.path.realpath(configured)
    return _fixed["root"]


def _refuse(kind, name, why):
    raise exception.InvalidSysfsName(kind, name, why)


def _device_dir(root, link, name):
    """The device directory a sysfs link leads to; it must lie in ``devices/``."""
    if not os.path.lexists(link):
        raise OSError(errno.ENODEV, os.strerror(errno.ENODEV), name)
    real = os.path.realpath(link)
    if not real.startswith(os.path.join(root, "devices") + os.sep):
        _refuse("sysfs path", link, f"a link leading outside {root}/devices")
    return real


def _require_display_controller(device_dir, name):
    try:
        with open(os.path.join(device_dir, "class")) as f:
            pci_class = f.read().strip()
    except FileNotFoundError:
        pci_class = ""
    if not pci_class.startswith(_DISPLAY_CLASS_PREFIX):
        _refuse("PCI device", name, "a device that is not a display or 3D controller")


def _parent_dir(root, parent):
    """A registered mdev parent's directory (a GPU's, if it is a PCI device)."""
    parent = names.check_parent_name(parent)
    device_dir = _device_dir(root, os.path.join(root, "class", "mdev_bus", parent), parent)
    if names.is_pci_address(parent):
        _require_display_controller(device_dir, parent)
    return device_dir


def _gpu_function_dir(root, address):
    address = str(names.parse_pci_address(str(address)))
    device_dir = _device_dir(root, os.path.join(root, "bus", "pci", "devices", address),
                             address)
    if os.path.basename(device_dir) != address:
        _refuse("PCI device", address, "a link naming another device")
    _require_display_controller(device_dir, address)
    return device_dir


def _write(root, path, value):
    """Write where the checks led, following no link on the way."""
    if os.path.realpath(path) != path or not path.startswith(root + os.sep):
        _refuse("sysfs path", path, f"a path leaving {root} or following a link")
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _plain_count(value, kind):
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_TYPE_NUMBER:
        _refuse(kind, value, "a value that is not a plain number")
    return value


@sysfs_writer.entrypoint
def create_mdev(parent, type_id, uuid):
    root = sysfs_root()
    type_dir = os.path.join(_parent_dir(root, parent), "mdev_supported_types",
                            names.check_type_id(type_id))
    _write(root, os.path.join(type_dir, "create"), names.check_mdev_uuid(uuid))


@sysfs_writer.entrypoint
def remove_mdev(uuid):
    root = sysfs_root()
    uuid = names.check_mdev_uuid(uuid)
    mdev_dir = _device_dir(root, os.path.join(root, "bus", "mdev", "devices", uuid), uuid)
    device_dir = os.path.dirname(mdev_dir)
    parent = os.path.basename(device_dir)
    registered = os.path.join(root, "class", "mdev_bus", parent)
    if os.path.basename(mdev_dir) != uuid or not os.path.lexists(registered) \
            or _parent_dir(root, parent) != device_dir:
        _refuse("mdev", uuid, "a link to something that is not an mdev of a registered parent")
    _write(root, os.path.join(mdev_dir, "remove"), "1")


def _write_function_number(address, value, kind, role, marker, *attr):
    """Write a plain number into an attribute of an SR-IOV function of a GPU,
    the ``role`` of which its ``marker`` file or link proves."""
    root = sysfs_root()
    value = _plain_count(value, kind)
    device_dir = _gpu_function_dir(root, address)
    if not os.path.lexists(os.path.join(device_dir, marker)):
        _refuse("PCI device", str(address), f"a device that is not an SR-IOV {role} function")
    _write(root, os.path.join(device_dir, *attr), str(value))


@sysfs_writer.entrypoint
def set_sriov_numvfs(pf_address, count):
    _write_function_number(pf_address, count, "VF count", "physical", "sriov_totalvfs",
                           "sriov_numvfs")


@sysfs_writer.entrypoint
def set_vgpu_type(vf_address, number):
    _write_function_number(vf_address, number, "vGPU type number", "virtual", "physfn",
                           "nvidia", "current_vgpu_type")


_ENTRY_POINTS = {"create_mdev": create_mdev, "remove_mdev": remove_mdev,
                 "set_sriov_numvfs": set_sriov_numvfs, "set_vgpu_type": set_vgpu_type}
