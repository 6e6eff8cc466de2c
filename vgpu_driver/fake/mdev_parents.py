"""The mdev side of the fake kernel: parents, their types, mdevs.

A mixin of :class:`~vgpu_driver.fake.fakekernel.FakeKernel`, which holds the
lock and the host model these methods use.  It registers parents with their
``mdev_supported_types``, answers ``create`` and ``remove`` with the kernel's
and NVIDIA's rules, and rewrites what the vendor driver reports
(``available_instances``, ``creatable_vgpu_types``) after every change.
"""

import errno
import os
import re
import shutil
import time

from vgpu_driver import names
from vgpu_driver.fake import tree
from vgpu_driver.fake import vendor
from vgpu_driver.sysfs import linux

_UUID_TEXT_RE = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
_HOLD_POLL_SECONDS = 0.05


class MdevParents:
    """Parents and mdevs in the tree, and the driver's view of their capacity."""

    def _parent_dir(self, name):
        return os.path.realpath(self.paths.parent(names.check_parent_name(name)))

    def _register_parent(self, gpu, dev, name):
        types_dir = os.path.join(dev, "mdev_supported_types")
        for mdev_type in gpu["types"]:
            type_dir = os.path.join(types_dir, mdev_type["id"])
            os.makedirs(os.path.join(type_dir, "devices"))
            tree.write_file(os.path.join(type_dir, "create"), "", 0o200)
            tree.write_file(
                os.path.join(type_dir, "device_api"), f"{mdev_type.get('device_api', 'vfio-pci')}\n"
            )
            tree.write_file(os.path.join(type_dir, "available_instances"), "0\n")
            if mdev_type.get("name") is not None:
                tree.write_file(os.path.join(type_dir, "name"), f"{mdev_type['name']}\n")
            if mdev_type.get("description") is not None:
                tree.write_file(
                    os.path.join(type_dir, "description"), f"{mdev_type['description']}\n"
                )
        tree.link(dev, self.paths.parent(name))
        self._refresh(gpu)

    # -- state read back from the tree ----------------------------------------------

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
            elif name == gpu["address"] or (gpu.get("sriov") and name in self._current_vfs(gpu)):
                return gpu
        raise tree.os_error(errno.ENODEV, dev)

    def _gpu_mdev_types(self, gpu):
        """``[(parent dir, uuid, type id)]`` of every mdev or vGPU on a GPU."""
        found = []
        for dev in self._parent_dirs(gpu):
            if gpu["model"] == "nvidia-vfio":
                current = int(
                    linux.read_attr(os.path.join(dev, "nvidia", "current_vgpu_type")) or 0
                )
                if current:
                    found.append((dev, None, names.vendor_type_id(current)))
                continue
            for uuid in self._mdevs_in(dev):
                found.append((dev, uuid, linux.link_name(os.path.join(dev, uuid, "mdev_type"))))
        return found

    def _refresh(self, gpu):
        """Rewrite what the driver reports after any change on ``gpu``."""
        existing = self._gpu_mdev_types(gpu)
        placed = self._placed(gpu) if gpu.get("sriov") else None
        for dev in self._parent_dirs(gpu):
            if gpu["model"] == "nvidia-vfio":
                lines = ["ID    : vGPU Name"]
                lines += [
                    f"{names.vendor_type_number(spec['id']):<6}: {spec['name']}"
                    for spec in gpu["types"]
                    if vendor.available(gpu, dev, spec, existing, placed)
                ]
                tree.write_file(
                    os.path.join(dev, "nvidia", "creatable_vgpu_types"), "\n".join(lines) + "\n"
                )
                continue
            for spec in gpu["types"]:
                tree.write_file(
                    os.path.join(dev, "mdev_supported_types", spec["id"], "available_instances"),
                    f"{vendor.available(gpu, dev, spec, existing, placed)}\n",
                )

    def _store_create(self, dev, type_id, value):
        # As mdev_sysfs.c: 36 characters, or 37 with the trailing newline.
        if len(value) not in (36, 37) or not _UUID_TEXT_RE.match(value[:36]):
            raise tree.os_error(errno.EINVAL, "create")
        self._create(dev, type_id, value[:36].lower())

    def _create(self, dev, type_id, uuid):
        if os.path.lexists(self.paths.mdev(uuid)):
            raise tree.os_error(errno.EEXIST, uuid)
        if not os.path.lexists(self.paths.parent(os.path.basename(dev))):
            raise tree.os_error(errno.ENODEV, dev)
        gpu = self._gpu_of(dev)
        spec = vendor.type_spec(gpu, type_id)
        if spec is None:
            raise tree.os_error(errno.EINVAL, type_id)
        placed = self._placed(gpu) if gpu.get("sriov") else None
        if vendor.available(gpu, dev, spec, self._gpu_mdev_types(gpu), placed) < 1:
            raise tree.os_error(errno.ENOSPC if gpu["model"] == "mtty" else errno.EUSERS, type_id)
        mdev_dir = os.path.join(dev, uuid)
        os.makedirs(os.path.join(mdev_dir, "power"))
        tree.write_file(os.path.join(mdev_dir, "remove"), "", 0o200)
        tree.write_file(os.path.join(mdev_dir, "uevent"), f"MDEV_TYPE={type_id}\n")
        tree.link(
            os.path.join(dev, "mdev_supported_types", type_id), os.path.join(mdev_dir, "mdev_type")
        )
        tree.link(self.paths.join("bus", "mdev"), os.path.join(mdev_dir, "subsystem"))
        tree.link(self._new_iommu_group(), os.path.join(mdev_dir, "iommu_group"))
        tree.link(mdev_dir, os.path.join(dev, "mdev_supported_types", type_id, "devices", uuid))
        tree.link(mdev_dir, self.paths.mdev(uuid))
        if gpu.get("sriov"):
            self._place(gpu, dev, spec, mdev_dir)
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
        self._unplace(dev, mdev_dir)
        group = linux.resolve_link(os.path.join(mdev_dir, "iommu_group"))
        if group:
            shutil.rmtree(group, ignore_errors=True)
        type_link = linux.resolve_link(os.path.join(mdev_dir, "mdev_type"))
        tree.remove_link(self.paths.mdev(uuid))
        if type_link:
            tree.remove_link(os.path.join(type_link, "devices", uuid))
        shutil.rmtree(mdev_dir)
        self._announce("remove", mdev_dir, "mdev")

    def _store_remove(self, mdev_dir, value):
        wanted = tree.parse_int(value, "remove")
        if not wanted:
            return
        uuid = os.path.basename(mdev_dir)
        # The kernel blocks the writer until the guest lets go of the device.
        while os.path.exists(self._hold_path(uuid)):
            time.sleep(_HOLD_POLL_SECONDS)
        with self._locked():
            if not os.path.isdir(mdev_dir):
                raise tree.os_error(errno.ENODEV, mdev_dir)
            dev = os.path.dirname(mdev_dir)
            gpu = self._gpu_of(dev)
            # The uevent first, the room after: device_del announces the
            # removal, mdev_device_release gives the instance back to the
            # type's count (drivers/vfio/mdev/mdev_core.c).
            self._destroy_mdev(dev, uuid)
            self._refresh(gpu)
