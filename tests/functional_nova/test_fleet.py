"""One address-free nova.conf inside nova-compute: GPUs chosen by model.

The same ``[mdev_<type>]`` groups (``device_ids``, ``gpu_count``) on a host
with an A100 board and eight T4: the compute reports one provider per GPU
with the type the resolution gives it, and a guest asking for a type by its
trait gets an mdev of that type on one of the GPUs serving it.
"""

import nova.conf

from tests.functional_nova import test_vgpu
from vgpu_driver.conf import mdev_types

T4 = [
    "0000:18:00.0",
    "0000:19:00.0",
    "0000:35:00.0",
    "0000:36:00.0",
    "0000:e7:00.0",
    "0000:e8:00.0",
    "0000:f4:00.0",
    "0000:f5:00.0",
]


class FleetTests(test_vgpu.VGPUDriverTestBase):
    ENABLED_TYPES = "nvidia-319,nvidia-320,nvidia-468"

    def setUp(self):
        super().setUp()
        # Adds our options (device_ids, gpu_count) to nova's [mdev_<type>] groups.
        mdev_types.load(nova.conf.CONF)
        self.flags(device_ids=["10de:1eb8"], gpu_count=4, group="mdev_nvidia-319")
        self.flags(device_ids=["10de:1eb8"], group="mdev_nvidia-320")
        self.flags(device_ids=["10de:20f1"], group="mdev_nvidia-468")

    def test_one_file_serves_a100_and_t4_by_model(self):
        self.start_vgpu_compute("host1", "a100-sriov", "t4x8")
        expected = {"host1_pci_0000_41_00_0": (10, 0, 0)}
        for index, gpu in enumerate(T4):
            name = "host1_pci_" + gpu.replace(":", "_").replace(".", "_")
            expected[name] = (4, 0, 0) if index < 4 else (2, 0, 0)
        self.assertEqual(expected, self.gpu_providers("host1"))
        flavor = self._create_flavor(
            extra_spec={"resources:VGPU": "1", "trait:CUSTOM_VGPU_GRID_T4_8C": "required"}
        )
        self._create_server(flavor_id=flavor, networks="none", host="host1")
        (mdev,) = self.kernels["host1"].list_mdevs()
        self.assertIn(mdev.parent, T4[4:])
        self.assertEqual("nvidia-320", mdev.type_id)
        self.used_mdevs_match_placement("host1")
