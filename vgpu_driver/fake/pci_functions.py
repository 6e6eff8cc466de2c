"""The PCI side of the fake kernel: functions, SR-IOV VFs, vendor-VFIO.

A mixin of :class:`~vgpu_driver.fake.fakekernel.FakeKernel`, which holds the
lock and the host model these methods use.  It plugs PCI functions with the
files a reader finds (``config``, ``uevent``, the driver and subsystem
links), enables and disables VFs by ``sriov_numvfs`` with the kernel's rules
(``sriov_numvfs_store``, ``drivers/pci/iov.c``: ``EINVAL`` for no number,
``ERANGE`` above ``sriov_totalvfs``, nothing to do for the current count,
``ENOENT`` unless the PF's driver configures SR-IOV, see
:mod:`vgpu_driver.fake.drivers`, ``EBUSY`` changing a non-zero count) and
answers writes to NVIDIA's vendor-VFIO ``current_vgpu_type``.
"""

import errno
import os
import shutil
import struct

from vgpu_driver import names
from vgpu_driver.fake import drivers
from vgpu_driver.fake import nvml
from vgpu_driver.fake import tree
from vgpu_driver.fake import vendor
from vgpu_driver.sysfs import linux


def _pci_config(vendor, device):
    """The first 256 bytes of a display controller's configuration space:
    IDs, class 0x0302 (3D controller), header type 0, no capability list."""
    config = bytearray(256)
    struct.pack_into("<HH", config, 0, vendor, device)
    config[0x0A], config[0x0B] = 0x02, 0x03
    struct.pack_into("<HH", config, 0x2C, vendor, device)
    return bytes(config)


class PciFunctions:
    """Plugging and unplugging PCI functions; the SR-IOV and vendor-VFIO stores."""

    def _device_dir(self, gpu, address=None):
        if gpu["model"] == "mtty":
            return self.paths.join("devices", "virtual", *gpu["virtual"].split("/"))
        pf = names.parse_pci_address(gpu["address"])
        return self.paths.join("devices", f"pci{pf.domain:04x}:{pf.bus:02x}", str(address or pf))

    def _plug_pci_function(self, gpu, address, physfn=None):
        dev = self._device_dir(gpu, address)
        os.makedirs(dev)
        tree.write_file(os.path.join(dev, "vendor"), f"{gpu['vendor']}\n")
        tree.write_file(os.path.join(dev, "device"), f"{gpu['device']}\n")
        tree.write_file(os.path.join(dev, "class"), "0x030200\n")
        tree.write_file(os.path.join(dev, "numa_node"), f"{gpu.get('numa_node', -1)}\n")
        vendor_id, device_id = int(gpu["vendor"], 16), int(gpu["device"], 16)
        tree.write_bytes(os.path.join(dev, "config"), _pci_config(vendor_id, device_id))
        ids = f"{vendor_id:04X}:{device_id:04X}"
        tree.write_file(
            os.path.join(dev, "uevent"),
            f"DRIVER=nvidia\nPCI_CLASS=30200\nPCI_ID={ids}\nPCI_SUBSYS_ID={ids}\n"
            f"PCI_SLOT_NAME={address}\n"
            f"MODALIAS=pci:v0000{vendor_id:04X}d0000{device_id:04X}"
            f"sv0000{vendor_id:04X}sd0000{device_id:04X}bc03sc02i00\n",
        )
        tree.link(self.paths.join("bus", "pci"), os.path.join(dev, "subsystem"))
        tree.write_file(os.path.join(dev, "driver_override"), "(null)\n", 0o644)
        tree.link(dev, self.paths.pci_device(address))
        self._attach(dev, drivers.NVIDIA)
        if self.model.get("iommu", True):
            self._join_iommu_group(dev)
        if physfn is not None:
            tree.link(self._device_dir(gpu), os.path.join(dev, "physfn"))
        self._announce_pci("add", dev)
        return dev

    def _plug_gpu(self, gpu):
        self._make_drivers()
        if gpu["model"] == "mtty":
            dev = self._device_dir(gpu)
            os.makedirs(dev)
            tree.write_file(os.path.join(dev, "uevent"), "")
            self._register_parent(gpu, dev, gpu["virtual"].split("/")[-1])
            return
        dev = self._plug_pci_function(gpu, gpu["address"])
        self._announce_pci("bind", dev, DRIVER="nvidia")
        if gpu["model"] == nvml.DATACENTER_MODEL:
            return  # no vGPU manager: the GPU is no mdev parent
        sriov = gpu.get("sriov")
        if sriov:
            tree.write_file(os.path.join(dev, "sriov_totalvfs"), f"{sriov['totalvfs']}\n")
            tree.write_file(os.path.join(dev, "sriov_numvfs"), "0\n", 0o644)
            tree.write_file(os.path.join(dev, "sriov_offset"), f"{sriov['offset']}\n")
            tree.write_file(os.path.join(dev, "sriov_stride"), f"{sriov['stride']}\n")
            self._enable_vfs(gpu, sriov["numvfs"])
        else:
            self._register_parent(gpu, dev, gpu["address"])

    def _join_iommu_group(self, dev):
        """The function in a group of its own, as the IOMMU puts each GPU
        and each VF (``drivers/iommu/iommu.c``: the device's
        ``iommu_group`` link and the group's ``devices/`` entry)."""
        group = self._new_iommu_group()
        tree.link(group, os.path.join(dev, "iommu_group"))
        tree.link(dev, os.path.join(group, "devices", os.path.basename(dev)))

    def _leave_iommu_group(self, dev):
        group = linux.resolve_link(os.path.join(dev, "iommu_group"))
        if group:
            shutil.rmtree(group, ignore_errors=True)

    def _vf_addresses(self, gpu, count):
        pf = names.parse_pci_address(gpu["address"])
        sriov = gpu["sriov"]
        return [str(pf.offset(sriov["offset"] + i * sriov["stride"])) for i in range(count)]

    def _enable_vfs(self, gpu, count):
        pf_dir = self._device_dir(gpu)
        for index, vf in enumerate(self._vf_addresses(gpu, count)):
            vf_dir = self._plug_pci_function(gpu, vf, physfn=gpu["address"])
            tree.link(vf_dir, os.path.join(pf_dir, f"virtfn{index}"))
            if gpu["model"] == "nvidia-vfio":
                os.makedirs(os.path.join(vf_dir, "nvidia"))
                tree.write_file(os.path.join(vf_dir, "nvidia", "current_vgpu_type"), "0\n", 0o644)
                self._show_placement(vf_dir, None)
            else:
                self._register_parent(gpu, vf_dir, vf)
            self._announce_pci("bind", vf_dir, DRIVER="nvidia")
        tree.write_file(os.path.join(pf_dir, "sriov_numvfs"), f"{count}\n", 0o644)
        self._forget_mixed_size(gpu)
        self._refresh(gpu)

    def _disable_vfs(self, gpu):
        pf_dir = self._device_dir(gpu)
        for index, vf in enumerate(self._current_vfs(gpu)):
            vf_dir = self._device_dir(gpu, vf)
            for uuid in self._mdevs_in(vf_dir):
                self._destroy_mdev(vf_dir, uuid)
            tree.remove_link(self.paths.parent(vf))
            tree.remove_link(self.paths.pci_device(vf))
            tree.remove_link(os.path.join(pf_dir, f"virtfn{index}"))
            tree.remove_link(os.path.join(self._driver_dir(drivers.NVIDIA), vf))
            self._leave_iommu_group(vf_dir)
            self._announce_pci("unbind", vf_dir)
            shutil.rmtree(vf_dir)
            self._announce_pci("remove", vf_dir)
        tree.write_file(os.path.join(pf_dir, "sriov_numvfs"), "0\n", 0o644)
        self._forget_mixed_size(gpu)

    def _current_vfs(self, gpu):
        pf_dir = self._device_dir(gpu)
        count = int(linux.read_attr(os.path.join(pf_dir, "sriov_numvfs")) or 0)
        return self._vf_addresses(gpu, count)

    def _store_numvfs(self, pf_dir, value):
        gpu = self._gpu_of(pf_dir)
        wanted = tree.parse_u16(value, "sriov_numvfs")
        current = len(self._current_vfs(gpu))
        if wanted > gpu["sriov"]["totalvfs"]:
            raise tree.os_error(errno.ERANGE, "sriov_numvfs")
        if wanted == current:
            return
        self._check_sriov_configure(pf_dir)
        if wanted and current:
            raise tree.os_error(errno.EBUSY, "sriov_numvfs")
        if wanted:
            self._enable_vfs(gpu, wanted)
        else:
            self._disable_vfs(gpu)

    def _store_vgpu_type(self, vf_dir, value):
        gpu = self._gpu_of(vf_dir)
        wanted = tree.parse_int(value, "current_vgpu_type")
        current_file = os.path.join(vf_dir, "nvidia", "current_vgpu_type")
        current = int(linux.read_attr(current_file) or 0)
        if wanted == 0:
            if current and os.path.exists(self._hold_path(os.path.basename(vf_dir))):
                # The guest still has the VF open: its vGPU cannot go yet.
                raise tree.os_error(errno.EBUSY, "current_vgpu_type")
            tree.write_file(current_file, "0\n", 0o644)
            self._unplace(vf_dir)
        elif current:
            raise tree.os_error(errno.EBUSY, "current_vgpu_type")
        else:
            spec = vendor.type_spec(gpu, names.vendor_type_id(wanted))
            existing, placed = self._gpu_mdev_types(gpu), self._placed(gpu)
            if spec is None or not vendor.available(gpu, vf_dir, spec, existing, placed):
                raise tree.os_error(errno.EINVAL, "current_vgpu_type")
            self._place(gpu, vf_dir, spec)  # the lowest creatable, if any
            tree.write_file(current_file, f"{wanted}\n", 0o644)
        self._refresh(gpu)
