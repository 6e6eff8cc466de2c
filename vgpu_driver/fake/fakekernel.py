"""A fake kernel: a real directory tree in sysfs's layout that answers writes.

:meth:`FakeKernel.build` writes the tree for a host profile (see
:mod:`vgpu_driver.fake.profiles`); the tree then plays ``/sys`` for any
reader, :class:`~vgpu_driver.sysfs.linux.LinuxSysfs` and ``mdevctl``
included.  Reads are inherited unchanged from ``LinuxSysfs``; the writer
(:class:`~vgpu_driver.sysfs.writes.WritableSysfs`) is the kernel's store
handlers, emulated, with the kernel's and NVIDIA's rules:

* ``create`` takes a 36 or 37 character UUID (``EINVAL``), refuses a UUID in
  use on any parent (``EEXIST``), a parent being unregistered (``ENODEV``)
  and a type with no capacity left (``EUSERS``, or ``ENOSPC`` for mtty).
* A time-sliced NVIDIA GPU hosts one type at a time; an SR-IOV VF hosts one
  vGPU, and once a GPU hosts one, its VFs only offer types of the same
  framebuffer size, up to the type's per-GPU maximum.
* ``remove`` blocks while a guest holds the device (:meth:`hold`).
* ``sriov_numvfs`` and NVIDIA's ``current_vgpu_type`` behave as on a host;
  clearing the type of a VF a guest holds is refused (``EBUSY``).
* Each PCI function is bound to a driver (``nvidia``, ``pci-pf-stub`` or
  none; :mod:`vgpu_driver.fake.drivers`): ``sriov_numvfs`` of a PF that
  ``nvidia`` holds is refused (``ENOENT``), as on a host, so VFs come
  through NVIDIA's ``sriov-manage`` (:mod:`vgpu_driver.fake.sriov_manage`
  stands in for it), and rebinding ``nvidia`` resets the board.
* A vendor-VFIO board that can mix sizes is put in mixed-size mode as NVML
  would (:meth:`FakeKernel.set_heterogeneous_mode`); its vGPUs then take
  placements on the board (:mod:`vgpu_driver.fake.placements`), and
  disabling or enabling its VFs puts it back in equal-size mode.
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
import shutil
import uuid as uuid_mod

from vgpu_driver import exception
from vgpu_driver import names
from vgpu_driver import nvml as driver_nvml
from vgpu_driver.fake import drivers
from vgpu_driver.fake import mdev_parents
from vgpu_driver.fake import nvml
from vgpu_driver.fake import nvml_state
from vgpu_driver.fake import pci_functions
from vgpu_driver.fake import tree
from vgpu_driver.fake import uevents
from vgpu_driver.fake import vendor
from vgpu_driver.fake import vgpu_placements
from vgpu_driver.sysfs import writes

MARKER_DIR = ".vgpu-fake-kernel"


class FakeKernel(
    pci_functions.PciFunctions,
    drivers.PciDrivers,
    mdev_parents.MdevParents,
    nvml_state.NvmlState,
    vgpu_placements.VgpuPlacements,
    writes.WritableSysfs,
):
    """LinuxSysfs over a fake tree, its writer the kernel's write handlers.

    The PCI side (:mod:`vgpu_driver.fake.pci_functions`), the drivers bound
    to it (:mod:`vgpu_driver.fake.drivers`) and the mdev side
    (:mod:`vgpu_driver.fake.mdev_parents`) and what NVML answers of them
    (:mod:`vgpu_driver.fake.nvml_state`) are mixins; this class builds the
    tree, holds the lock and dispatches each write to its store handler.
    """

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
        # kernel/iommu_groups is there, empty or not, on every kernel
        # (drivers/iommu/iommu.c, iommu_init); the mdev core's directories
        # only with its module (see vgpu_driver.sysfs.host_reads).
        subs = [
            "bus/pci/devices",
            "bus/pci/drivers",
            "class",
            "devices/virtual",
            "kernel/iommu_groups",
        ]
        if model["mdev"]:
            subs += ["class/mdev_bus", "bus/mdev/devices"]
        for sub in subs:
            os.makedirs(os.path.join(root, sub), exist_ok=True)
        kernel = cls(root)
        with kernel._locked():
            # The vGPU manager and the data-center driver are both NVIDIA's
            # module "nvidia", with the same version file.
            module = profile.get("nvidia_vgpu_manager") or profile.get("nvidia_driver")
            if module:
                kernel._load_vgpu_manager(module)
            for gpu in model["gpus"]:
                kernel._plug_gpu(gpu)
            for mdev in profile.get("mdevs", ()):
                kernel._create(
                    kernel._parent_dir(mdev["parent"]),
                    mdev["type"],
                    mdev.get("uuid") or str(uuid_mod.uuid4()),
                )
        return kernel

    def __init__(self, root):
        super().__init__(root, writer=self._store)
        with open(os.path.join(self.paths.root, MARKER_DIR, "host.json")) as f:
            self.model = json.load(f)
        self._gpus = {gpu["address"]: gpu for gpu in self.model["gpus"]}

    # -- the vGPU manager's module ----------------------------------------------

    def load_vgpu_manager(self, version):
        """NVIDIA's kernel module reloaded at ``version`` (an upgrade), or
        unloaded (None): ``module/nvidia/version`` as the kernel shows it."""
        with self._locked():
            self._load_vgpu_manager(version)

    def _load_vgpu_manager(self, version):
        path = self.paths.module_version("nvidia")
        if version is None:
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tree.write_file(path, f"{version}\n", 0o444)

    # -- uevents ----------------------------------------------------------------

    def _uevents_marker(self):
        return os.path.join(self.paths.root, MARKER_DIR, "uevents")

    def enable_uevents(self):
        """From now on, every process changing this tree broadcasts uevents."""
        tree.write_file(self._uevents_marker(), "", 0o644)

    def _announce(self, action, dev, subsystem, **properties):
        """A uevent for the device at ``dev``, if this tree announces them."""
        if os.path.exists(self._uevents_marker()):
            devpath = "/" + os.path.relpath(dev, self.paths.root)
            uevents.broadcast(action, devpath, subsystem, properties)

    def _announce_pci(self, action, dev, **properties):
        self._announce(action, dev, "pci", PCI_SLOT_NAME=os.path.basename(dev), **properties)

    # -- the lock: one writer at a time, across processes ---------------------------

    @contextlib.contextmanager
    def _locked(self):
        fd = os.open(
            os.path.join(self.paths.root, MARKER_DIR, "lock"), os.O_RDWR | os.O_CREAT, 0o600
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    # -- writes, each dispatched to its side's store handler ------------------------

    @property
    def nvml_bindings(self):
        return nvml.Bindings(self.paths.root)

    def _store(self, entry_point, *args):
        """The write the privileged entry point would make, answered here."""
        if entry_point == "set_heterogeneous_mode":  # NVML's, no file
            return driver_nvml.set_heterogeneous_mode(*args, self.nvml_bindings)
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
        if entry_point == "set_vgpu_type":
            return (
                os.path.join(self.paths.vendor_vfio_dir(args[0]), "current_vgpu_type"),
                str(args[1]),
            )
        raise ValueError(entry_point)

    def write_attr(self, path, value):
        """A write to ``path`` (under the root), as the kernel answers it."""
        if not self.paths.contains(path):
            raise exception.InvalidSysfsName("sysfs path", path)
        if not os.path.exists(path):
            raise tree.os_error(errno.ENOENT, path)
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
            if attr == "driver_override":
                return self._store_driver_override(owner, value)
            if attr in ("bind", "unbind") and os.path.dirname(owner) == self.paths.join(
                "bus", "pci", "drivers"
            ):
                store = self._store_bind if attr == "bind" else self._store_unbind
                return store(os.path.basename(owner), value)
            if attr == "current_vgpu_type":
                return self._store_vgpu_type(os.path.dirname(owner), value)
        raise tree.os_error(errno.EIO, path)

    def _state_path(self, name):
        """A file of the vendor driver's own state, beside the tree."""
        return os.path.join(self.paths.root, MARKER_DIR, name)

    def _hold_path(self, uuid):
        return self._state_path(f"held-{uuid}")

    # -- what happens to a host, for tests and demos --------------------------------

    def hold(self, uuid):
        """A guest opens the mdev: ``remove`` now blocks until :meth:`release`.

        Given a VF's address (a vendor-VFIO vGPU), clearing its
        ``current_vgpu_type`` is refused with ``EBUSY`` meanwhile.
        """
        tree.write_file(self._hold_path(names.check_vgpu_id(uuid)), "", 0o600)

    def release(self, uuid):
        tree.remove_link(self._hold_path(names.check_vgpu_id(uuid)))

    def reboot(self):
        """What a host reboot leaves: no mdevs, SR-IOV VFs disabled, every
        GPU bound to ``nvidia`` with no ``driver_override``."""
        with self._locked():
            for gpu in self.model["gpus"]:
                if gpu["model"] != "mtty":
                    self._boot_driver(self._device_dir(gpu))
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
            tree.remove_link(link)
            if names.is_pci_address(name):
                self._announce_pci("unbind", dev)
