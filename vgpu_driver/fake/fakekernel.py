"""A fake kernel: a real directory tree in sysfs's layout that answers writes.

:meth:`FakeKernel.build` writes the tree for a host profile (see
:mod:`vgpu_driver.fake.profiles`); the tree then plays ``/sys`` for any
reader, :class:`~vgpu_driver.sysfs.linux.LinuxSysfs` and ``mdevctl``
included.  Reads are inherited unchanged from ``LinuxSysfs``; only the
kernel's store handlers are emulated, with the kernel's and NVIDIA's rules:

* ``create`` takes a 36 or 37 character UUID (``EINVAL``), refuses a UUID in
  use on any parent (``EEXIST``), a parent being unregistered (``ENODEV``)
  and a type with no capacity left (``EUSERS``, or ``ENOSPC`` for mtty).
* A time-sliced NVIDIA GPU hosts one type at a time; an SR-IOV VF hosts one
  vGPU, and once a GPU hosts one, its VFs only offer types of the same
  framebuffer size, up to the type's per-GPU maximum.
* ``remove`` blocks while a guest holds the device (:meth:`hold`).
* ``sriov_numvfs`` and NVIDIA's ``current_vgpu_type`` behave as on a host;
  clearing the type of a VF a guest holds is refused (``EBUSY``).
* Once :meth:`FakeKernel.enable_uevents` was called on a tree, devices
  added, bound, unbound and removed are announced as udev announces them
  (:mod:`vgpu_driver.fake.uevents`), by whichever process changes the tree.

What the vendor driver knows (per-type limits, ports; see
:mod:`vgpu_driver.fake.vendor`) is kept beside the tree in
``.vgpu-fake-kernel/host.json``; the tree itself is the state, a file lock
makes writes from several processes safe, and attributes are replaced
atomically so lock-free readers never see half a value.
"""

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import struct
import threading
import time
import uuid as uuid_mod

from vgpu_driver import exception
from vgpu_driver import names
from vgpu_driver.fake import uevents
from vgpu_driver.fake import vendor
from vgpu_driver.sysfs import linux

MARKER_DIR = ".vgpu-fake-kernel"
_UUID_TEXT_RE = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
_HOLD_POLL_SECONDS = 0.05


def _os_error(code, path):
    return OSError(code, os.strerror(code), path)


def _parse_int(value, attr):
    """What kstrtoul() accepts (any base), else EINVAL as the store handlers give."""
    try:
        return int(value.strip(), 0)
    except ValueError:
        raise _os_error(errno.EINVAL, attr) from None


def _write_file(path, text="", mode=0o444):
    """Replace an attribute's content at once, never rewriting it in place.

    Readers take no lock, and the kernel never shows a reader a half-written
    value: a reader sees the old content or the new one.
    """
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _write_bytes(path, data, mode=0o444):
    """A binary attribute (a PCI function's ``config``), replaced at once."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _pci_config(vendor, device):
    """The first 256 bytes of a display controller's configuration space:
    IDs, class 0x0302 (3D controller), header type 0, no capability list."""
    config = bytearray(256)
    struct.pack_into("<HH", config, 0, vendor, device)
    config[0x0A], config[0x0B] = 0x02, 0x03
    struct.pack_into("<HH", config, 0x2C, vendor, device)
    return bytes(config)


def _link(target_abs, link_path):
    """A relative symlink, as the kernel makes them."""
    os.makedirs(os.path.dirname(link_path), exist_ok=True)
    os.symlink(os.path.relpath(target_abs, os.path.dirname(link_path)), link_path)


def _remove_link(path):
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


class FakeKernel(linux.LinuxSysfs):
    """LinuxSysfs over a fake tree, with the kernel's write handlers."""

    # -- construction ----------------------------------------------------------

    @classmethod
    def owns(cls, root):
        return os.path.isfile(os.path.join(root, MARKER_DIR, "host.json"))

    @classmethod
    def build(cls, root, profile):
        """Write the tree of ``profile`` (a dict) under ``root``; returns it.

        ``root`` must be empty or absent.
        """
        if os.path.isdir(root) and os.listdir(root):
            raise exception.FakeHostExists(path=root)
        os.makedirs(os.path.join(root, MARKER_DIR), exist_ok=True)
        model = vendor.host_model(profile)
        with open(os.path.join(root, MARKER_DIR, "host.json"), "w") as f:
            json.dump(model, f, indent=1, sort_keys=True)
        for sub in ("class/mdev_bus", "bus/mdev/devices", "bus/pci/devices",
                    "bus/pci/drivers", "devices/virtual"):
            os.makedirs(os.path.join(root, sub), exist_ok=True)
        kernel = cls(root)
        with kernel._locked():
            for gpu in model["gpus"]:
                kernel._plug_gpu(gpu)
            for mdev in profile.get("mdevs", ()):
                kernel._create(kernel._parent_dir(mdev["parent"]), mdev["type"],
                               mdev.get("uuid") or str(uuid_mod.uuid4()))
        return kernel

    def __init__(self, root):
        super().__init__(root)
        with open(os.path.join(self.paths.root, MARKER_DIR, "host.json")) as f:
            self.model = json.load(f)
        self._gpus = {gpu["address"]: gpu for gpu in self.model["gpus"]}

    # -- uevents ----------------------------------------------------------------

    def _uevents_marker(self):
        return os.path.join(self.paths.root, MARKER_DIR, "uevents")

    def enable_uevents(self):
        """From now on, every process changing this tree broadcasts uevents."""
        _write_file(self._uevents_marker(), "", 0o644)

    def _announce(self, action, dev, subsystem, **properties):
        """A uevent for the device at ``dev``, if this tree announces them."""
        if os.path.exists(self._uevents_marker()):
            devpath = "/" + os.path.relpath(dev, self.paths.root)
            uevents.broadcast(action, devpath, subsystem, properties)

    def _announce_pci(self, action, dev, **properties):
        self._announce(action, dev, "pci", PCI_SLOT_NAME=os.path.basename(dev),
                       **properties)

    # -- the lock: one writer at a time, across processes ---------------------------

    @contextlib.contextmanager
    def _locked(self):
        fd = os.open(os.path.join(self.paths.root, MARKER_DIR, "lock"),
                     os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    # -- device layout ---------------------------------------------------------

    def _device_dir(self, gpu, address=None):
        if gpu["model"] == "mtty":
            return self.paths.join("devices", "virtual", *gpu["virtual"].split("/"))
        pf = names.parse_pci_address(gpu["address"])
        return self.paths.join("devices", f"pci{pf.domain:04x}:{pf.bus:02x}",
                               str(address or pf))

    def _parent_dir(self, name):
        return os.path.realpath(self.paths.parent(names.check_parent_name(name)))

    def _plug_pci_function(self, gpu, address, physfn=None):
        dev = self._device_dir(gpu, address)
        os.makedirs(dev)
        _write_file(os.path.join(dev, "vendor"), f"{gpu['vendor']}\n")
        _write_file(os.path.join(dev, "device"), f"{gpu['device']}\n")
        _write_file(os.path.join(dev, "class"), "0x030200\n")
        _write_file(os.path.join(dev, "numa_node"), f"{gpu.get('numa_node', -1)}\n")
        vendor_id, device_id = int(gpu["vendor"], 16), int(gpu["device"], 16)
        _write_bytes(os.path.join(dev, "config"), _pci_config(vendor_id, device_id))
        ids = f"{vendor_id:04X}:{device_id:04X}"
        _write_file(os.path.join(dev, "uevent"),
                    f"DRIVER=nvidia\nPCI_CLASS=30200\nPCI_ID={ids}\nPCI_SUBSYS_ID={ids}\n"
                    f"PCI_SLOT_NAME={address}\n"
                    f"MODALIAS=pci:v0000{vendor_id:04X}d0000{device_id:04X}"
                    f"sv0000{vendor_id:04X}sd0000{device_id:04X}bc03sc02i00\n")
        _link(self.paths.join("bus", "pci"), os.path.join(dev, "subsystem"))
        _link(self.paths.join("bus", "pci", "drivers", "nvidia"),
              os.path.join(dev, "driver"))
        _link(dev, self.paths.pci_device(address))
        if physfn is not None:
            _link(self._device_dir(gpu), os.path.join(dev, "physfn"))
        self._announce_pci("add", dev)
        return dev

    def _plug_gpu(self, gpu):
        os.makedirs(self.paths.join("bus", "pci", "drivers", "nvidia"), exist_ok=True)
        if gpu["model"] == "mtty":
            dev = self._device_dir(gpu)
            os.makedirs(dev)
            _write_file(os.path.join(dev, "uevent"), "")
            self._register_parent(gpu, dev, gpu["virtual"].split("/")[-1])
            return
        dev = self._plug_pci_function(gpu, gpu["address"])
        self._announce_pci("bind", dev, DRIVER="nvidia")
        sriov = gpu.get("sriov")
        if sriov:
            _write_file(os.path.join(dev, "sriov_totalvfs"), f"{sriov['totalvfs']}\n")
            _write_file(os.path.join(dev, "sriov_numvfs"), "0\n", 0o644)
            _write_file(os.path.join(dev, "sriov_offset"), f"{sriov['offset']}\n")
            _write_file(os.path.join(dev, "sriov_stride"), f"{sriov['stride']}\n")
            self._enable_vfs(gpu, sriov["numvfs"])
        else:
            self._register_parent(gpu, dev, gpu["address"])

    def _vf_addresses(self, gpu, count):
        pf = names.parse_pci_address(gpu["address"])
        sriov = gpu["sriov"]
        return [str(pf.offset(sriov["offset"] + i * sriov["stride"])) for i in range(count)]

    def _enable_vfs(self, gpu, count):
        pf_dir = self._device_dir(gpu)
        for index, vf in enumerate(self._vf_addresses(gpu, count)):
            vf_dir = self._plug_pci_function(gpu, vf, physfn=gpu["address"])
            _link(vf_dir, os.path.join(pf_dir, f"virtfn{index}"))
            if gpu["model"] == "nvidia-vfio":
                os.makedirs(os.path.join(vf_dir, "nvidia"))
                _write_file(os.path.join(vf_dir, "nvidia", "current_vgpu_type"), "0\n", 0o644)
            else:
                self._register_parent(gpu, vf_dir, vf)
            self._announce_pci("bind", vf_dir, DRIVER="nvidia")
        _write_file(os.path.join(pf_dir, "sriov_numvfs"), f"{count}\n", 0o644)
        self._refresh(gpu)

    def _disable_vfs(self, gpu):
        pf_dir = self._device_dir(gpu)
        for index, vf in enumerate(self._current_vfs(gpu)):
            vf_dir = self._device_dir(gpu, vf)
            for uuid in self._mdevs_in(vf_dir):
                self._destroy_mdev(vf_dir, uuid)
            _remove_link(self.paths.parent(vf))
            _remove_link(self.paths.pci_device(vf))
            _remove_link(os.path.join(pf_dir, f"virtfn{index}"))
            self._announce_pci("unbind", vf_dir)
            shutil.rmtree(vf_dir)
            self._announce_pci("remove", vf_dir)
        _write_file(os.path.join(pf_dir, "sriov_numvfs"), "0\n", 0o644)

    def _register_parent(self, gpu, dev, name):
        types_dir = os.path.join(dev, "mdev_supported_types")
        for mdev_type in gpu["types"]:
            type_dir = os.path.join(types_dir, mdev_type["id"])
            os.makedirs(os.path.join(type_dir, "devices"))
            _write_file(os.path.join(type_dir, "create"), "", 0o200)
            _write_file(os.path.join(type_dir, "device_api"),
                        f"{mdev_type.get('device_api', 'vfio-pci')}\n")
            _write_file(os.path.join(type_dir, "available_instances"), "0\n")
            if mdev_type.get("name") is not None:
                _write_file(os.path.join(type_dir, "name"), f"{mdev_type['name']}\n")
            if mdev_type.get("description") is not None:
                _write_file(os.path.join(type_dir, "description"),
                            f"{mdev_type['description']}\n")
        _link(dev, self.paths.parent(name))
        self._refresh(gpu)

    # -- state read back from the tree ----------------------------------------------

    def _current_vfs(self, gpu):
        pf_dir = self._device_dir(gpu)
        count = int(linux.read_attr(os.path.join(pf_dir, "sriov_numvfs")) or 0)
        return self._vf_addresses(gpu, count)

    def _parent_dirs(self, gpu):
        if gpu.get("sriov"):
            return [self._device_dir(gpu, vf) for vf in self._current_vfs(gpu)]
        return [self._device_dir(gpu)]

    @staticmethod
    def _mdevs_in(dev):
        return sorted(e for e in os.listdir(dev) if len(e) == 36 and e.count("-") == 4)

    def _gpu_of(self, dev):
        """The GPU model entry owning a parent device directory."""
        name = os.path.basename(dev)
        for gpu in self.model["gpus"]:
            if gpu["model"] == "mtty":
                if dev == self._device_dir(gpu):
                    return gpu
            elif name == gpu["address"] or (
                    gpu.get("sriov") and name in self._current_vfs(gpu)):
                return gpu
        raise _os_error(errno.ENODEV, dev)

    def _gpu_mdev_types(self, gpu):
        """``[(parent dir, uuid, type id)]`` of every mdev or vGPU on a GPU."""
        found = []
        for dev in self._parent_dirs(gpu):
            if gpu["model"] == "nvidia-vfio":
                current = int(linux.read_attr(
                    os.path.join(dev, "nvidia", "current_vgpu_type")) or 0)
                if current:
                    found.append((dev, None, names.vendor_type_id(current)))
                continue
            for uuid in self._mdevs_in(dev):
                found.append((dev, uuid, linux.link_name(os.path.join(dev, uuid, "mdev_type"))))
        return found

    def _refresh(self, gpu):
        """Rewrite what the driver reports after any change on ``gpu``."""
        existing = self._gpu_mdev_types(gpu)
        for dev in self._parent_dirs(gpu):
            if gpu["model"] == "nvidia-vfio":
                lines = ["ID    : vGPU Name"]
                lines += [f"{names.vendor_type_number(spec['id']):<6}: {spec['name']}"
                          for spec in gpu["types"]
                          if vendor.available(gpu, dev, spec, existing)]
                _write_file(os.path.join(dev, "nvidia", "creatable_vgpu_types"),
                            "\n".join(lines) + "\n")
                continue
            for spec in gpu["types"]:
                _write_file(os.path.join(dev, "mdev_supported_types", spec["id"],
                                         "available_instances"),
                            f"{vendor.available(gpu, dev, spec, existing)}\n")

    # -- store handlers ------------------------------------------------------------

    def _privileged(self, entry_point, *args):
        """The write the privileged entry point would make, answered here."""
        path, value = self._entry_point_write(entry_point, *args)
        return self.write_attr(path, value)

    def _entry_point_write(self, entry_point, *args):
        """``(path, value)`` that an entry point of :mod:`vgpu_driver.privsep`
        writes under this root."""
        if entry_point == "create_mdev":
            parent, type_id, uuid = args
            return os.path.join(self.paths.parent_type(parent, type_id), "create"), uuid
        if entry_point == "remove_mdev":
            return os.path.join(self.paths.mdev(args[0]), "remove"), "1"
        if entry_point == "set_sriov_numvfs":
            return os.path.join(self.paths.pci_device(args[0]), "sriov_numvfs"), str(args[1])
        if entry_point == "set_vgpu_type":
            return (os.path.join(self.paths.vendor_vfio_dir(args[0]), "current_vgpu_type"),
                    str(args[1]))
        raise ValueError(entry_point)

    def write_attr(self, path, value):
        """A write to ``path`` (under the root), as the kernel answers it."""
        if not self.paths.contains(path):
            raise exception.InvalidSysfsName("sysfs path", path)
        if not os.path.exists(path):
            raise _os_error(errno.ENOENT, path)
        real = os.path.realpath(path)
        attr, owner = os.path.basename(real), os.path.dirname(real)
        if attr == "remove":
            return self._store_remove(owner, value)
        with self._locked():
            if attr == "create":
                dev = os.path.dirname(os.path.dirname(owner))
                return self._store_create(dev, os.path.basename(owner), value)
            if attr == "sriov_numvfs":
                return self._store_numvfs(owner, value)
            if attr == "current_vgpu_type":
                return self._store_vgpu_type(os.path.dirname(owner), value)
        raise _os_error(errno.EIO, path)

    def _store_create(self, dev, type_id, value):
        # As mdev_sysfs.c: 36 characters, or 37 with the trailing newline.
        if len(value) not in (36, 37) or not _UUID_TEXT_RE.match(value[:36]):
            raise _os_error(errno.EINVAL, "create")
        self._create(dev, type_id, value[:36].lower())

    def _create(self, dev, type_id, uuid):
        if os.path.lexists(self.paths.mdev(uuid)):
            raise _os_error(errno.EEXIST, uuid)
        if not os.path.lexists(self.paths.parent(os.path.basename(dev))):
            raise _os_error(errno.ENODEV, dev)
        gpu = self._gpu_of(dev)
        spec = vendor.type_spec(gpu, type_id)
        if spec is None:
            raise _os_error(errno.EINVAL, type_id)
        if vendor.available(gpu, dev, spec, self._gpu_mdev_types(gpu)) < 1:
            raise _os_error(errno.ENOSPC if gpu["model"] == "mtty" else errno.EUSERS,
                            type_id)
        mdev_dir = os.path.join(dev, uuid)
        os.makedirs(os.path.join(mdev_dir, "power"))
        _write_file(os.path.join(mdev_dir, "remove"), "", 0o200)
        _write_file(os.path.join(mdev_dir, "uevent"), f"MDEV_TYPE={type_id}\n")
        _link(os.path.join(dev, "mdev_supported_types", type_id),
              os.path.join(mdev_dir, "mdev_type"))
        _link(self.paths.join("bus", "mdev"), os.path.join(mdev_dir, "subsystem"))
        _link(self._new_iommu_group(), os.path.join(mdev_dir, "iommu_group"))
        _link(mdev_dir, os.path.join(dev, "mdev_supported_types", type_id, "devices", uuid))
        _link(mdev_dir, self.paths.mdev(uuid))
        self._refresh(gpu)
        self._announce("add", mdev_dir, "mdev", MDEV_TYPE=type_id)

    def _new_iommu_group(self):
        """``kernel/iommu_groups/<n>``: each mdev gets a group of its own."""
        groups = self.paths.join("kernel", "iommu_groups")
        os.makedirs(groups, exist_ok=True)
        taken = [int(e) for e in os.listdir(groups) if e.isdigit()]
        group = os.path.join(groups, str(max(taken, default=99) + 1))
        os.makedirs(os.path.join(group, "devices"))
        return group

    def _destroy_mdev(self, dev, uuid):
        mdev_dir = os.path.join(dev, uuid)
        group = linux.resolve_link(os.path.join(mdev_dir, "iommu_group"))
        if group:
            shutil.rmtree(group, ignore_errors=True)
        type_link = linux.resolve_link(os.path.join(mdev_dir, "mdev_type"))
        _remove_link(self.paths.mdev(uuid))
        if type_link:
            _remove_link(os.path.join(type_link, "devices", uuid))
        shutil.rmtree(mdev_dir)
        self._announce("remove", mdev_dir, "mdev")

    def _hold_path(self, uuid):
        return os.path.join(self.paths.root, MARKER_DIR, f"held-{uuid}")

    def _store_remove(self, mdev_dir, value):
        wanted = _parse_int(value, "remove")
        if not wanted:
            return
        uuid = os.path.basename(mdev_dir)
        # The kernel blocks the writer until the guest lets go of the device.
        while os.path.exists(self._hold_path(uuid)):
            time.sleep(_HOLD_POLL_SECONDS)
        with self._locked():
            if not os.path.isdir(mdev_dir):
                raise _os_error(errno.ENODEV, mdev_dir)
            dev = os.path.dirname(mdev_dir)
            gpu = self._gpu_of(dev)
            self._destroy_mdev(dev, uuid)
            self._refresh(gpu)

    def _store_numvfs(self, pf_dir, value):
        gpu = self._gpu_of(pf_dir)
        wanted = _parse_int(value, "sriov_numvfs")
        current = len(self._current_vfs(gpu))
        if wanted > gpu["sriov"]["totalvfs"]:
            raise _os_error(errno.ERANGE, "sriov_numvfs")
        if wanted == current:
            return
        if wanted and current:
            raise _os_error(errno.EBUSY, "sriov_numvfs")
        if wanted:
            self._enable_vfs(gpu, wanted)
        else:
            self._disable_vfs(gpu)

    def _store_vgpu_type(self, vf_dir, value):
        gpu = self._gpu_of(vf_dir)
        wanted = _parse_int(value, "current_vgpu_type")
        current_file = os.path.join(vf_dir, "nvidia", "current_vgpu_type")
        current = int(linux.read_attr(current_file) or 0)
        if wanted == 0:
            if current and os.path.exists(self._hold_path(os.path.basename(vf_dir))):
                # The guest still has the VF open: its vGPU cannot go yet.
                raise _os_error(errno.EBUSY, "current_vgpu_type")
            _write_file(current_file, "0\n", 0o644)
        elif current:
            raise _os_error(errno.EBUSY, "current_vgpu_type")
        else:
            spec = vendor.type_spec(gpu, names.vendor_type_id(wanted))
            existing = self._gpu_mdev_types(gpu)
            if spec is None or not vendor.available(gpu, vf_dir, spec, existing):
                raise _os_error(errno.EINVAL, "current_vgpu_type")
            _write_file(current_file, f"{wanted}\n", 0o644)
        self._refresh(gpu)

    # -- what happens to a host, for tests and demos --------------------------------

    def hold(self, uuid):
        """A guest opens the mdev: ``remove`` now blocks until :meth:`release`.

        Given a VF's address (a vendor-VFIO vGPU), clearing its
        ``current_vgpu_type`` is refused with ``EBUSY`` meanwhile.
        """
        _write_file(self._hold_path(names.check_vgpu_id(uuid)), "", 0o600)

    def release(self, uuid):
        _remove_link(self._hold_path(names.check_vgpu_id(uuid)))

    def reboot(self):
        """What a host reboot leaves: no mdevs, and SR-IOV VFs disabled."""
        with self._locked():
            for gpu in self.model["gpus"]:
                if gpu.get("sriov"):
                    self._disable_vfs(gpu)
                    continue
                for dev in self._parent_dirs(gpu):
                    for uuid in self._mdevs_in(dev):
                        self._destroy_mdev(dev, uuid)
                self._refresh(gpu)
            for entry in os.listdir(os.path.join(self.paths.root, MARKER_DIR)):
                if entry.startswith("held-"):
                    os.unlink(os.path.join(self.paths.root, MARKER_DIR, entry))

    def unregister_parent(self, name):
        """The vendor driver unregisters a parent (unbind in progress)."""
        with self._locked():
            link = self.paths.parent(names.check_parent_name(name))
            dev = os.path.realpath(link)
            _remove_link(link)
            if names.is_pci_address(name):
                self._announce_pci("unbind", dev)
