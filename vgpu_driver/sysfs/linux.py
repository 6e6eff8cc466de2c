"""Reads and writes a sysfs tree rooted at a directory: the production path.

The layout followed is the kernel's: parents are links under
``class/mdev_bus`` into ``devices/...``; mdevs are links under
``bus/mdev/devices`` to ``<parent device>/<uuid>``, whose ``mdev_type`` link
names the type.  Links are resolved lexically (the kernel writes relative
links), which is both exact for sysfs and cheap.
"""

import errno
import os
import re
import threading

from oslo_log import log as logging

from vgpu_driver import exception
from vgpu_driver import names
from vgpu_driver import privsep
from vgpu_driver.sysfs import base
from vgpu_driver.sysfs import paths as sysfs_paths

LOG = logging.getLogger(__name__)

_VIRTFN_RE = re.compile(r"^virtfn(\d+)$")
_CREATABLE_RE = re.compile(r"^\s*(\d+)\s*:?\s+(.*?)\s*$")
_CONSISTENT_READ_TRIES = 5


def read_attr(path):
    """The stripped text of a sysfs attribute, or None when it is absent."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return os.read(fd, 65536).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)


def resolve_link(path):
    """Where a sysfs link points, resolved lexically; None if not a link."""
    try:
        target = os.readlink(path)
    except (FileNotFoundError, OSError):
        return None
    return os.path.normpath(os.path.join(os.path.dirname(path), target))


def link_name(path):
    """The last component of a sysfs link's target (an mdev's type id, say);
    None if not a link.  One readlink and no path arithmetic: allocation
    reads one per mdev of the GPU."""
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


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


def _count(text):
    """A kernel-printed count: decimal digits only."""
    if not text.isdigit():
        raise ValueError("not a count")
    return int(text)


def _printable(text):
    if not text.isprintable():
        raise ValueError("holds control characters")
    return text


def read_parsed(path, parse, unreadable):
    """``parse`` of an attribute's text; None when absent.  Bytes that are not
    UTF-8, or text ``parse`` refuses, are never guessed at: None, and
    ``"<path>: <why>"`` is appended to ``unreadable`` (and logged)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        raw = os.read(fd, 65536)
    finally:
        os.close(fd)
    try:
        return parse(raw.decode("utf-8").strip())
    except ValueError as exc:
        reason = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else str(exc)
        problem = f"{path}: {raw[:40]!r} is unreadable ({reason})"
        LOG.warning("Unreadable sysfs value: %s", problem)
        unreadable.append(problem)
        return None


def _int_or_none(text):
    try:
        return int(text, 0) if text is not None else None
    except ValueError:
        return None


def parse_creatable_vgpu_types(text):
    """``creatable_vgpu_types``: a header, then ``ID : Name`` lines."""
    result = []
    for line in (text or "").splitlines():
        match = _CREATABLE_RE.match(line)
        if match:
            result.append((int(match[1]), match[2]))
    return tuple(result)


class LinuxSysfs(base.SysfsHost):
    """The sysfs backend for a real kernel (or any tree laid out like one)."""

    def __init__(self, root=sysfs_paths.DEFAULT_ROOT):
        self.paths = sysfs_paths.SysfsPaths(sysfs_paths.check_root(root))

    def __repr__(self):
        return f"{type(self).__name__}({self.paths.root!r})"

    # -- reads ---------------------------------------------------------------

    def _listdir(self, path):
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []

    def list_parents(self):
        parents = (self.read_parent(name) for name in self.parent_names())
        return [parent for parent in parents if parent is not None]

    def parent_names(self):
        """The valid names under ``class/mdev_bus``, sorted (no link read)."""
        found = []
        for entry in self._listdir(self.paths.parent_base()):
            try:
                found.append(names.check_parent_name(entry, "class/mdev_bus"))
            except exception.InvalidSysfsName as exc:
                LOG.warning("Skipping parent: %s", exc)
        return found

    def read_parent(self, name):
        """One parent's :class:`ParentInfo` (its types read now), or None
        when its link points to no device."""
        link = self.paths.parent(name)
        device_path = resolve_link(link) or link
        if not os.path.isdir(device_path):
            LOG.warning("Skipping parent %s: %s points to no device", name, link)
            return None
        types = tuple(self._read_types(device_path))
        address = physfn = None
        if names.is_pci_address(name):
            address = names.parse_pci_address(name)
            pf_path = resolve_link(os.path.join(device_path, "physfn"))
            if pf_path is not None:
                physfn = names.parse_pci_address(os.path.basename(pf_path),
                                                 f"{name}/physfn")
        return base.ParentInfo(name=name, device_path=device_path, types=types,
                               address=address, physfn=physfn)

    def _read_types(self, device_path):
        types_dir = os.path.join(device_path, "mdev_supported_types")
        for entry in self._listdir(types_dir):
            try:
                type_id = names.check_type_id(entry, types_dir)
            except exception.InvalidSysfsName as exc:
                LOG.warning("Skipping type: %s", exc)
                continue
            # Plain concatenation: this loop runs for every type of every parent.
            prefix = f"{types_dir}/{type_id}/"
            unreadable = []
            available = read_parsed(prefix + "available_instances", _count, unreadable)
            yield base.MdevTypeInfo(
                type_id=type_id,
                available_instances=available or 0,
                device_api=read_parsed(prefix + "device_api", _printable, unreadable) or "",
                name=read_parsed(prefix + "name", _printable, unreadable),
                description=read_parsed(prefix + "description", str, unreadable),
                unreadable=tuple(unreadable))

    def list_mdevs(self):
        mdevs = (self.read_mdev(uuid) for uuid in self.mdev_uuids())
        return [mdev for mdev in mdevs if mdev is not None]

    def mdev_uuids(self):
        """The valid names under ``bus/mdev/devices``, sorted (no link read)."""
        found = []
        for entry in self._listdir(self.paths.mdev_base()):
            try:
                found.append(names.check_mdev_uuid(entry, "bus/mdev/devices"))
            except exception.InvalidSysfsName as exc:
                LOG.warning("Skipping mdev: %s", exc)
        return found

    def read_mdev(self, uuid):
        """One mdev's :class:`MdevInfo`, or None once it is gone."""
        mdev_path = resolve_link(self.paths.mdev(uuid))
        type_id = link_name(os.path.join(mdev_path, "mdev_type")) if mdev_path else None
        if type_id is None:
            # Removed while we looked: the kernel drops both links at once.
            return None
        parent = os.path.basename(os.path.dirname(mdev_path))
        return base.MdevInfo(uuid=uuid, parent=parent, type_id=type_id)

    def parent_mdevs(self, parent):
        """``[(uuid, type_id)]`` of the mdevs on one parent; None if it is gone.

        Reads one directory, not the whole bus: allocations look at one GPU.
        """
        device_path = resolve_link(self.paths.parent(names.check_parent_name(parent)))
        try:
            entries = os.listdir(device_path) if device_path else None
        except FileNotFoundError:
            entries = None
        if entries is None:
            return None
        found = []
        for entry in sorted(entries):
            if names.is_mdev_uuid(entry):
                type_id = link_name(f"{device_path}/{entry}/mdev_type")
                if type_id:
                    found.append((entry, type_id))
        return found

    def parent_mdev_uuids(self, parent):
        """The UUIDs of the mdevs on one parent, sorted (no link reads)."""
        device_path = self.paths.parent(names.check_parent_name(parent))
        try:
            return sorted(e for e in os.listdir(device_path) if names.is_mdev_uuid(e))
        except FileNotFoundError:
            return None

    def available_instances(self, parent, type_id):
        """One type's ``available_instances`` on one parent (0 if absent)."""
        path = os.path.join(self.paths.parent_type(names.check_parent_name(parent),
                                                   names.check_type_id(type_id)),
                            "available_instances")
        return _int_or_none(read_attr(path)) or 0

    def mdev_created_at(self, uuid):
        """When an mdev appeared (its sysfs entry's change time), or None."""
        try:
            return os.lstat(self.paths.mdev(names.check_mdev_uuid(uuid))).st_ctime
        except FileNotFoundError:
            return None

    def pci_device(self, address):
        dev = self.paths.pci_device(names.parse_pci_address(str(address)))
        if not os.path.isdir(dev):
            return None
        virtfns = []
        for entry in os.listdir(dev):
            match = _VIRTFN_RE.match(entry)
            target = match and resolve_link(os.path.join(dev, entry))
            if target:
                virtfns.append((int(match[1]), names.parse_pci_address(
                    os.path.basename(target), f"{address}/{entry}")))
        return base.PciDeviceInfo(
            address=address,
            vendor=read_attr(os.path.join(dev, "vendor")),
            device=read_attr(os.path.join(dev, "device")),
            numa_node=_int_or_none(read_attr(os.path.join(dev, "numa_node"))),
            sriov_totalvfs=_int_or_none(read_attr(os.path.join(dev, "sriov_totalvfs"))),
            sriov_numvfs=_int_or_none(read_attr(os.path.join(dev, "sriov_numvfs"))),
            virtfns=tuple(vf for _, vf in sorted(virtfns)),
            pci_class=read_attr(os.path.join(dev, "class")))

    def list_sriov_pfs(self):
        found = []
        for entry in self._listdir(self.paths.pci_base()):
            # One failed open per function that is no SR-IOV PF (VFs included).
            if names.is_pci_address(entry) and read_attr(
                    f"{self.paths.pci_base()}/{entry}/sriov_totalvfs") is not None:
                info = self.pci_device(entry)
                if info is not None:
                    found.append(info)
        return found

    def list_vendor_vfio(self):
        found = []
        for entry in self._listdir(self.paths.pci_base()):
            if not names.is_pci_address(entry):
                continue
            vf = self.vendor_vf(entry)
            if vf is not None:
                found.append(vf)
        return found

    def vendor_vf(self, address):
        address = names.parse_pci_address(str(address))
        vfio_dir = self.paths.vendor_vfio_dir(address)
        current_path = os.path.join(vfio_dir, "current_vgpu_type")
        text = read_attr(current_path)
        if text is None:
            # Not a VF with NVIDIA's files: one failed open per PCI function.
            return None
        current = _int_or_none(text) or 0
        for _attempt in range(_CONSISTENT_READ_TRIES):
            creatable = read_attr(os.path.join(vfio_dir, "creatable_vgpu_types"))
            if creatable is None:
                return None
            # The list depends on the VF's own type: only keep a pair read
            # with no change of that type in between.
            again = _int_or_none(read_attr(current_path)) or 0
            if again == current:
                break
            current = again
        pf = link_name(os.path.join(self.paths.pci_device(address), "physfn"))
        return base.VendorVfioInfo(
            address=address,
            physfn=names.parse_pci_address(pf) if pf else None,
            creatable=parse_creatable_vgpu_types(creatable),
            current_type=current)

    def vendor_vgpu_set_at(self, address):
        path = os.path.join(self.paths.vendor_vfio_dir(names.parse_pci_address(str(address))),
                            "current_vgpu_type")
        try:
            return os.lstat(path).st_ctime
        except FileNotFoundError:
            return None

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

    def set_sriov_numvfs(self, address, count):
        address = names.parse_pci_address(str(address))
        self._write("sriov_numvfs", str(address), "set_sriov_numvfs", str(address), int(count))

    def set_vendor_vgpu_type(self, address, type_number, timeout=None):
        address = names.parse_pci_address(str(address))
        if isinstance(type_number, bool) or not isinstance(type_number, int) \
                or type_number < 0:
            raise exception.InvalidSysfsName("vGPU type number", type_number)
        self._write("current_vgpu_type", f"VF {address}", "set_vgpu_type", str(address),
                    type_number, timeout=timeout)
