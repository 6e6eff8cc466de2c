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
from vgpu_driver.fake import placements as placements_mod
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
        if gpu["model"] == nvml.DATACENTER_MODEL:   # no vGPU manager: no vGPU call
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
        ``nvmlVgpuInstanceGetPlacementId``); None in equal-size mode or
        without a vGPU."""
        recorded = linux.read_attr(self._state_path(f"placement-{names.check_vgpu_id(vf_address)}"))
        return None if recorded is None else int(recorded)

    def active_vgpus(self, pf_address):
        """``[(VF address, type number, placement ID or None)]`` of the GPU's
        vGPUs, as NVML's ``nvmlDeviceGetActiveVgpus``,
        ``nvmlVgpuInstanceGetType`` and ``nvmlVgpuInstanceGetPlacementId``
        answer.  NVML's reference calls them *active* vGPU instances and does
        not say whether a typed VF no guest has opened is one; the fake lists
        every typed VF, and the driver's map marks any vGPU NVML does not
        place as unlocated rather than guess."""
        gpu = self._vfio_gpu(pf_address)
        if gpu["model"] != "nvidia-vfio":     # the fake's mdev boards: not asked
            raise nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)
        with self._locked():
            found = []
            for dev, _uuid, type_id in self._gpu_mdev_types(gpu):
                vf = os.path.basename(dev)
                found.append((vf, names.vendor_type_number(type_id), self.placement_of(vf)))
        return found

    def vgpu_instance(self, vf_address):
        """``(type number, placement ID or None)`` of the VF's vGPU, as
        NVML answers for one of :meth:`active_vgpus`; None without one."""
        current = linux.read_attr(os.path.join(
            self.paths.vendor_vfio_dir(names.check_vgpu_id(vf_address)), "current_vgpu_type"))
        if not current or current == "0":
            return None
        return int(current), self.placement_of(vf_address)

    def placements(self, pf_address, type_number):
        """``(placement size, supported IDs, creatable IDs)`` of a vGPU type
        on the GPU in mixed-size mode (NVML's supported and creatable
        placement lists); creatable is empty in equal-size mode."""
        gpu = self._vfio_gpu(pf_address)
        spec = vendor.type_spec(gpu, names.vendor_type_id(type_number))
        if spec is None or not vendor.can_mix_sizes(gpu):
            raise nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)
        with self._locked():
            existing, placed = self._gpu_mdev_types(gpu), self._placed(gpu)
            creatable = (() if placed is None else
                         vendor.creatable_placements(gpu, spec, existing, placed))
        supported = placements_mod.supported(gpu["framebuffer_mb"], spec["framebuffer_mb"],
                                             gpu.get("architecture"))
        return placements_mod.slots(spec["framebuffer_mb"]), supported, creatable
