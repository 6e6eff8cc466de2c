"""What NVML answers of the fake kernel: the vendor driver's state that is
not in sysfs (mixed-size mode, the placements of vGPUs on a board).

A mixin of :class:`~vgpu_driver.fake.fakekernel.FakeKernel`, which holds the
lock, the host model and the state files beside the tree these methods use;
its mdev side (:mod:`vgpu_driver.fake.mdev_parents`) says which vGPUs a
board holds.  Each answer and refusal is NVML's (``nvml.h``), as cited.
"""

import os

from vgpu_driver import names
from vgpu_driver.fake import nvml
from vgpu_driver.fake import tree
from vgpu_driver.fake import vendor
from vgpu_driver.sysfs import linux


class NvmlState:
    """The GPU's vGPU state as NVML reports and changes it."""

    def _vfio_gpu(self, pf_address):
        gpu = self._gpus.get(pf_address)
        if gpu is None:
            raise nvml.NVMLError(nvml.NVML_ERROR_NOT_FOUND)
        return gpu

    def heterogeneous_mode(self, pf_address):
        """Whether the GPU is in mixed-size mode (NVML's
        ``nvmlDeviceGetVgpuHeterogeneousMode``)."""
        gpu = self._vfio_gpu(pf_address)
        if gpu["model"] == nvml.DATACENTER_MODEL:  # no vGPU manager: no vGPU call
            raise nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)
        return os.path.exists(self._state_path(f"mixed-size-{gpu['address']}"))

    def set_heterogeneous_mode(self, pf_address, enabled):
        """NVML's ``nvmlDeviceSetVgpuHeterogeneousMode``, with its refusals.

        ``NVML_ERROR_NOT_SUPPORTED`` on a GPU that cannot mix sizes;
        ``NVML_ERROR_IN_USE`` while any vGPU exists on the GPU ("will fail
        with error NVML_ERROR_IN_USE if any vGPU instance is active on the
        device", ``nvml.h``).  Set while the VFs are off, it reads back
        enabled and the next enablement of the VFs clears it.
        """
        gpu = self._vfio_gpu(pf_address)
        if not vendor.can_mix_sizes(gpu):
            raise nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)
        with self._locked():
            if self._gpu_mdev_types(gpu):
                raise nvml.NVMLError(nvml.NVML_ERROR_IN_USE)
            path = self._state_path(f"mixed-size-{gpu['address']}")
            if enabled:
                tree.write_file(path, "1\n", 0o600)
            else:
                tree.remove_link(path)
            self._refresh(gpu)

    def placement_of(self, vf_address):
        """The placement ID of the VF's vGPU (NVML's
        ``nvmlVgpuInstanceGetPlacementId``); None without one (equal-size
        mode before homogeneous placements, or no vGPU)."""
        recorded = linux.read_attr(self._state_path(f"placement-{names.check_vgpu_id(vf_address)}"))
        return None if recorded is None else int(recorded)

    def active_vgpus(self, pf_address):
        """``[(VF address, type number, placement ID or None)]`` of the GPU's
        *active* vGPUs, as NVML's ``nvmlDeviceGetActiveVgpus``,
        ``nvmlVgpuInstanceGetType`` and ``nvmlVgpuInstanceGetPlacementId``
        answer: in the vGPU manager a vGPU becomes active when its guest
        starts (``numActiveVgpu`` counts guests, ``numCreatedVgpu``
        vGPUs), so a vGPU no guest holds (:meth:`hold`) is not listed."""
        gpu = self._vfio_gpu(pf_address)
        if gpu["model"] not in vendor.SRIOV_MODELS:  # time-sliced boards: not asked
            raise nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)
        with self._locked():
            found = []
            for dev, uuid, type_id in self._gpu_mdev_types(gpu):
                vf = os.path.basename(dev)
                if os.path.exists(self._hold_path(uuid or vf)):
                    found.append((vf, names.vendor_type_number(type_id), self.placement_of(vf)))
        return found

    def vgpu_instance(self, vf_address):
        """``(type number, placement ID or None)`` of the VF's vGPU, as
        NVML answers for one of :meth:`active_vgpus`; None without one."""
        vf = names.check_vgpu_id(vf_address)
        try:
            gpu = self._gpu_of(os.path.realpath(self.paths.pci_device(vf)))
        except OSError:
            return None
        for dev, _uuid, type_id in self._gpu_mdev_types(gpu):
            if os.path.basename(dev) == vf:
                return names.vendor_type_number(type_id), self.placement_of(vf)
        return None

    def max_instances(self, pf_address, type_number):
        """The most vGPUs of a type the GPU holds (NVML's
        ``nvmlVgpuTypeGetMaxInstances``, whatever exists now): in
        equal-size mode the type's per-board maximum (the guide's tables,
        the profile's ``max``), in mixed-size mode its placements (the
        guide's mixed-size maxima); INVALID_ARGUMENT for a type the GPU
        does not support ("if vgpuTypeId is invalid, or is not supported
        on target device", nvml.h)."""
        gpu = self._vfio_gpu(pf_address)
        if gpu["model"] == nvml.DATACENTER_MODEL:  # no vGPU manager: no vGPU call
            raise nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)
        spec = vendor.type_spec(gpu, names.vendor_type_id(type_number))
        if spec is None:
            raise nvml.NVMLError(nvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._locked():
            mixed = self._mixed_size(gpu)
        if mixed:
            return len(vendor.placement_table(gpu, spec, mixed=True)[1])
        return int(spec.get("max") or 1)

    def framebuffer_size(self, type_number):
        """The framebuffer of a vGPU type, in bytes (NVML's
        ``nvmlVgpuTypeGetFramebufferSize``: "the framebuffer size in bytes",
        nvml.h; it takes the type alone, whose ID names one product's
        type): the profile's ``framebuffer_mb``; INVALID_ARGUMENT for a type
        no GPU of the host has (as for every type on a real H200 under the
        data-center driver 580.159.04, which has none)."""
        type_id = names.vendor_type_id(type_number)
        for gpu in self._gpus.values():
            spec = vendor.type_spec(gpu, type_id) if gpu["model"] != nvml.DATACENTER_MODEL else None
            if spec is not None and spec.get("framebuffer_mb"):
                return int(spec["framebuffer_mb"]) * 1024 * 1024
        raise nvml.NVMLError(nvml.NVML_ERROR_INVALID_ARGUMENT)

    def placements(self, pf_address, type_number, homogeneous=False):
        """``(placement size, supported IDs, creatable IDs)`` of a vGPU type
        on the GPU (NVML's supported and creatable placement lists): the
        mixed-size ones, or with ``homogeneous`` equal-size mode's (Ada and
        later from R565, NOT_SUPPORTED elsewhere).  Creatable are those of
        the GPU's mode: none in equal-size mode without homogeneous ones."""
        gpu = self._vfio_gpu(pf_address)
        spec = vendor.type_spec(gpu, names.vendor_type_id(type_number))
        if spec is None or not vendor.can_mix_sizes(gpu):
            raise nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)
        with self._locked():
            equal_placed = vendor.homogeneous_placements(gpu, self._manager_version())
            if homogeneous and not equal_placed:
                raise nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)
            mixed = self._mixed_size(gpu)
            creatable = ()
            if mixed or equal_placed:
                creatable = vendor.creatable_placements(
                    gpu, spec, self._gpu_mdev_types(gpu), self._recorded(gpu), mixed=mixed
                )
        size, supported = vendor.placement_table(gpu, spec, mixed=not homogeneous)
        return size, supported, creatable
