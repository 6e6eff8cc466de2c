"""An A100 right after a reboot, in nova-compute: no provider, one warning
naming the fix (not one per periodic update), and the provider once the VFs
are enabled."""

from tests.functional_nova import test_vgpu

A100 = "0000:41:00.0"
WARNING = (
    f"GPU {A100} is configured but gets no provider: SR-IOV is off: run "
    f"vgpu-manage sriov enable {A100}"
)


class SriovOffTest(test_vgpu.VGPUDriverTestBase):
    def test_warned_once_then_served_when_the_vfs_are_enabled(self):
        self.flags(device_addresses=[A100], group="mdev_nvidia-468")
        self.start_vgpu_compute("host1", "a100-sriov-off")
        self._run_periodics(raise_on_error=True)
        self._run_periodics(raise_on_error=True)
        self.assertEqual({}, self.gpu_providers("host1"))
        self.assertEqual(1, self.stdlog.logger.output.count(WARNING))
        self.kernels["host1"].set_vfs(A100, 16)
        self._run_periodics(raise_on_error=True)
        self.assertEqual({"host1_pci_0000_41_00_0": (10, 0, 0)}, self.gpu_providers("host1"))
        self.assertEqual(1, self.stdlog.logger.output.count(WARNING))
