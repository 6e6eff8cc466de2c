"""Providers of GPUs that left the host.

nova keeps reporting a provider for a GPU its driver no longer sees only
until it tries to delete it; with guests' allocations on it, Placement
refuses and nova logs the failure on every periodic update.  Here an
unused GPU's provider goes at the next update, and one that guests still
hold stays, fully reserved, until they are gone.
"""

from tests.functional_nova import test_vgpu

GPUS = ("0000:18:00.0", "0000:19:00.0")


def provider_name(address):
    return "host1_pci_" + address.replace(":", "_").replace(".", "_")


class VanishedGpuTests(test_vgpu.VGPUDriverTestBase):
    ENABLED_TYPES = "nvidia-231"

    def setUp(self):
        super().setUp()
        self.flags(device_addresses=list(GPUS), group="mdev_nvidia-231")
        self.start_vgpu_compute("host1", "t4x8")
        self.flavor = self._create_flavor(
            memory_mb=512, vcpu=1, disk=1, ephemeral=0, extra_spec={"resources:VGPU": "1"}
        )

    def test_unused_provider_goes_and_a_held_one_stays_reserved(self):
        server = self._create_server(flavor_id=self.flavor, networks="none", host="host1")
        (mdev,) = self.domain_mdevs("host1")
        (claim,) = self.computes["host1"].driver.vgpu.journal.claims()
        used, unused = sorted(GPUS, key=lambda gpu: gpu != claim.gpu)
        self.assertEqual(1, self.gpu_providers("host1")[provider_name(used)][2])
        kernel = self.kernels["host1"]
        kernel.unregister_parent(unused)
        kernel.unregister_parent(used)
        self._run_periodics()
        providers = self.gpu_providers("host1")
        self.assertNotIn(provider_name(unused), providers)
        self.assertEqual((8, 8, 1), providers[provider_name(used)])
        self.assertEqual([mdev], self.domain_mdevs("host1"))
        self._delete_server(server)
        self._run_periodics()
        self.assertNotIn(provider_name(used), self.gpu_providers("host1"))
        self.assertEqual([], self.computes["host1"].driver.vgpu.journal.claims())
