"""Where the fake vendor driver puts each vGPU, and where it says so.

A mixin of :class:`~vgpu_driver.fake.fakekernel.FakeKernel`.  A vGPU gets
its placement when it is created (a VF's ``current_vgpu_type`` written, or
an mdev created: ``kvgpumgrCreateRequestVgpu`` calls
``kvgpumgrSetPlacementId`` then, not when the guest starts), the lowest
creatable one of its type (:mod:`vgpu_driver.fake.vendor`).  The placement
is NVML's (``nvmlVgpuInstanceGetPlacementId``) and sysfs's: the VF's
``nvidia/placement_id`` under vendor VFIO, the mdev's ``nvidia/placement_id``
over mdev (both files as listed on hosts; the value is the decimal ID, and
``Not Applicable`` where the vGPU has none, as other tools read it).
The vendor driver's record is kept beside the tree (``placement-<VF>``),
and goes with the VFs and the mode.
"""

import os

from vgpu_driver.fake import tree
from vgpu_driver.fake import vendor
from vgpu_driver.sysfs import linux

NOT_APPLICABLE = "Not Applicable"


class VgpuPlacements:
    """Placements of a board's vGPUs: chosen, recorded, forgotten."""

    def _mixed_size(self, gpu):
        return os.path.exists(self._state_path(f"mixed-size-{gpu.get('address')}"))

    def _recorded(self, gpu):
        """``{VF dir: placement ID}`` of the GPU's placed vGPUs, either mode."""
        placed = {}
        for vf in self._current_vfs(gpu) if gpu.get("sriov") else ():
            recorded = linux.read_attr(self._state_path(f"placement-{vf}"))
            if recorded is not None:
                placed[self._device_dir(gpu, vf)] = int(recorded)
        return placed

    def _placed(self, gpu):
        """None in equal-size mode; in mixed-size mode, ``{VF dir: placement
        ID}`` of the GPU's vGPUs."""
        return self._recorded(gpu) if self._mixed_size(gpu) else None

    def _manager_version(self):
        return linux.read_attr(self.paths.module_version("nvidia"))

    def _place(self, gpu, vf_dir, spec, mdev_dir=None):
        """Record the placement a new vGPU of ``spec`` on ``vf_dir`` takes
        (None where it takes none), and show it in sysfs."""
        mixed = self._mixed_size(gpu)
        chosen = None
        if mixed or vendor.homogeneous_placements(gpu, self._manager_version()):
            found = vendor.creatable_placements(
                gpu, spec, self._gpu_mdev_types(gpu), self._recorded(gpu), mixed=mixed
            )
            chosen = found[0] if found else None
        vf = os.path.basename(vf_dir)
        if chosen is not None:
            tree.write_file(self._state_path(f"placement-{vf}"), f"{chosen}\n", 0o600)
        self._show_placement(mdev_dir or vf_dir, chosen)
        return chosen

    def _unplace(self, vf_dir, mdev_dir=None):
        tree.remove_link(self._state_path(f"placement-{os.path.basename(vf_dir)}"))
        if mdev_dir is None:
            self._show_placement(vf_dir, None)

    @staticmethod
    def _show_placement(dev, placement):
        """The device's ``nvidia/placement_id`` (read-only in the fake)."""
        os.makedirs(os.path.join(dev, "nvidia"), exist_ok=True)
        tree.write_file(
            os.path.join(dev, "nvidia", "placement_id"),
            f"{NOT_APPLICABLE if placement is None else placement}\n",
            0o444,
        )

    def _forget_mixed_size(self, gpu):
        """The mode and the placements go with the VFs: the vendor driver
        rebinds, and the GPU is back in equal-size mode.  NVIDIA documents
        the reset on a host reboot, a driver reload and a GPU reset (user
        guide 17.0, 2.11); that disabling or enabling the VFs clears it too
        was measured by operators (an enablement set before the VFs read
        back enabled, then was gone), so the fake clears it both ways."""
        tree.remove_link(self._state_path(f"mixed-size-{gpu['address']}"))
        for vf in self._vf_addresses(gpu, gpu["sriov"]["totalvfs"]):
            tree.remove_link(self._state_path(f"placement-{vf}"))
