"""The privileged entry points: one per sysfs write nova-compute ever makes,
and one for the only NVML setting it changes.  SR-IOV VFs are not among
them: the ``nvidia`` driver refuses ``sriov_numvfs``, and only a root
``vgpu-manage`` changes them, through NVIDIA's ``sriov-manage``
(:mod:`vgpu_driver.sriov_manage`).

Each runs on the privileged side (the daemon, or a root ``vgpu-manage``).
It takes names and plain numbers only, validates them, opens the sysfs root
of its own configuration (a sysfs mount: :class:`.beneath.SysfsRoot`),
finds the device through the kernel's links read by hand, checks the device
is what the write is for (a display or 3D controller, an SR-IOV function of
the right role, an NVIDIA function) and that the configuration enables the
write (:class:`.policy.WritePolicy`), then writes the one attribute by fd.

Malformed names are :class:`~vgpu_driver.exception.InvalidSysfsName`; every
other refusal is :class:`~vgpu_driver.exception.PrivilegedWriteRefused`;
the kernel's errnos come back as ``OSError``.  Nothing is written before
every check passed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
from typing import TYPE_CHECKING

from vgpu_driver import exception
from vgpu_driver import names
from vgpu_driver import nvml
from vgpu_driver.privsep import beneath
from vgpu_driver.privsep import context
from vgpu_driver.privsep import policy

if TYPE_CHECKING:
    from collections.abc import Iterator

_DISPLAY_CLASS_PREFIX = "0x03"
_MAX_TYPE_NUMBER = 2**32 - 1
_LINK_REFUSALS = (errno.ELOOP, errno.EXDEV, errno.ENOTDIR)


def _policy() -> policy.WritePolicy:
    if "policy" not in context.state:
        context.state["policy"] = policy.WritePolicy(context.configuration())
    found: policy.WritePolicy = context.state["policy"]
    return found


def _root() -> tuple[str, bool]:
    """``(path, allow_fake)`` of the configured root, resolved once per
    configuration (as the policy is read once)."""
    if "root" not in context.state:
        conf = context.configuration()
        context.state["root"] = (
            os.path.realpath(conf.vgpu.sysfs_root),
            conf.vgpu.test_only_fake_sysfs_root,
        )
    found: tuple[str, bool] = context.state["root"]
    return found


@contextlib.contextmanager
def _sysfs() -> Iterator[beneath.SysfsRoot]:
    """The root held by fd; a link or mount met on the way is a refusal."""
    path, allow_fake = _root()
    try:
        with beneath.SysfsRoot(path, allow_fake=allow_fake) as root:
            yield root
    except OSError as exc:
        if exc.errno not in _LINK_REFUSALS:
            raise
        raise exception.PrivilegedWriteRefused(
            exc.filename or path,
            f"a link, another mount or a non-directory on the way ({os.strerror(exc.errno)})",
        ) from None


def _is_display_controller(root: beneath.SysfsRoot, device: str) -> bool:
    return root.read(posixpath.join(device, "class")).startswith(_DISPLAY_CLASS_PREFIX)


def _require_display_controller(root: beneath.SysfsRoot, device: str, name: str) -> None:
    if not _is_display_controller(root, device):
        raise exception.PrivilegedWriteRefused(name, "not a display or 3D controller")


def _parent_device(root: beneath.SysfsRoot, parent: str) -> str:
    """A registered mdev parent's device directory, relative to the root."""
    return root.follow(posixpath.join("class", "mdev_bus", parent), parent)


def _registered_as(root: beneath.SysfsRoot, parent: str, device: str) -> bool:
    """True when ``class/mdev_bus`` registers ``parent`` and leads to ``device``."""
    try:
        return _parent_device(root, names.check_parent_name(parent)) == device
    except exception.InvalidSysfsName:
        return False
    except OSError as exc:
        if exc.errno == errno.ENODEV:
            return False
        raise


def _pci_function(root: beneath.SysfsRoot, address: str) -> tuple[str, str]:
    """A GPU function's device directory, found by its address."""
    address = str(names.parse_pci_address(address))
    device = root.follow(posixpath.join("bus", "pci", "devices", address), address)
    if posixpath.basename(device) != address:
        raise exception.PrivilegedWriteRefused(address, "a link naming another device")
    _require_display_controller(root, device, address)
    return address, device


def _plain_number(value: object, kind: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_TYPE_NUMBER:
        raise exception.InvalidSysfsName(kind, value, "a value that is not a plain number")
    return value


@context.sysfs_writer.entrypoint
def create_mdev(parent: str, type_id: str, uuid: str) -> None:
    parent = names.check_parent_name(parent)
    type_id = names.check_type_id(type_id)
    uuid = names.check_mdev_uuid(uuid)
    with _sysfs() as root:
        device = _parent_device(root, parent)
        if names.is_pci_address(parent):
            _require_display_controller(root, device, parent)
        _policy().check_create(root, parent, device, type_id)
        root.write(posixpath.join(device, "mdev_supported_types", type_id, "create"), uuid)


@context.sysfs_writer.entrypoint
def remove_mdev(uuid: str) -> None:
    uuid = names.check_mdev_uuid(uuid)
    with _sysfs() as root:
        mdev = root.follow(posixpath.join("bus", "mdev", "devices", uuid), uuid)
        device, name = posixpath.split(mdev)
        parent = posixpath.basename(device)
        if name != uuid or not _registered_as(root, parent, device):
            raise exception.PrivilegedWriteRefused(
                uuid, "a link to something that is not an mdev of a registered parent"
            )
        if names.is_pci_address(parent):
            _require_display_controller(root, device, parent)
        else:
            _policy().check_free_parent(root, parent, device)
        root.write(posixpath.join(mdev, "remove"), "1")


def _sriov_function(
    root: beneath.SysfsRoot, address: str, marker: str, role: str
) -> tuple[str, str]:
    """An SR-IOV function of a GPU, whose ``role`` its ``marker`` proves."""
    address, device = _pci_function(root, address)
    if not root.exists(posixpath.join(device, marker)):
        raise exception.PrivilegedWriteRefused(address, f"not an SR-IOV {role} function")
    return address, device


def _require_nvidia(root: beneath.SysfsRoot, device: str, address: str) -> None:
    vendor = root.read(posixpath.join(device, "vendor"))
    if vendor != policy.NVIDIA_VENDOR:
        raise exception.PrivilegedWriteRefused(
            address, f"not an NVIDIA function (vendor {vendor or 'unknown'})"
        )


@context.sysfs_writer.entrypoint
def set_vgpu_type(vf_address: str, number: int) -> None:
    number = _plain_number(number, "vGPU type number")
    with _sysfs() as root:
        address, device = _sriov_function(root, vf_address, "physfn", "virtual")
        _require_nvidia(root, device, address)
        if number:  # 0 clears the type: it frees the VF, as a removal does
            _policy().check_vgpu_type(root, address, device, names.vendor_type_id(number))
        root.write(posixpath.join(device, "nvidia", "current_vgpu_type"), str(number))


@context.gpu_admin.entrypoint
def set_heterogeneous_mode(pf_address: str, enabled: bool) -> None:
    """Switch an NVIDIA board between equal-size and mixed-size vGPUs
    (through NVML, not a file); the board is checked through sysfs first."""
    if not isinstance(enabled, bool):
        raise exception.PrivilegedWriteRefused(
            f"the vGPU mode of {pf_address!r}", f"{enabled!r} is neither True nor False"
        )
    with _sysfs() as root:
        address, device = _sriov_function(root, pf_address, "sriov_totalvfs", "physical")
        _require_nvidia(root, device, address)
        _policy().check_vgpu_mode(root, address, device)
    nvml.set_heterogeneous_mode(address, enabled, nvml.bindings_for(context.configuration()))
