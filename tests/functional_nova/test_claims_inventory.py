"""Inside nova-compute: claims no Placement allocation covers are reserved
at the periodic inventory update, so the scheduler never picks a GPU the
allocator would then refuse (a reschedule)."""

from tests.functional_nova import test_vgpu
from vgpu_driver import claims

PROVIDER = "host1_pci_0000_41_00_0"


class UnallocatedClaimsTests(test_vgpu.VGPUDriverTestBase):
    def test_a_migration_claim_without_allocation_is_reserved_until_rolled_back(self):
        self.start_vgpu_compute("host1", "a100-sriov")
        compute = self.computes["host1"]
        flavor = self._create_flavor(extra_spec={"resources:VGPU": "1"})
        self._create_server(flavor_id=flavor, networks="none", host="host1")
        self.assertEqual({PROVIDER: (10, 0, 1)}, self.gpu_providers("host1"))

        # An incoming migration's claims: its allocation still sits on the
        # source host, so Placement does not count them here.
        vgpu = compute.driver.vgpu
        providers = compute.driver._providers_by_uuid()
        (rp_uuid,) = providers
        vgpu.manager.allocate(
            "incoming", {rp_uuid: {"resources": {"VGPU": 2}}}, providers, state=claims.MIGRATING_IN
        )
        self._run_periodics()
        self.assertEqual({PROVIDER: (10, 2, 1)}, self.gpu_providers("host1"))

        # Eight more do not fit next to the claims: the scheduler says so,
        # no compute is tried; seven do.
        too_many = self._create_flavor(extra_spec={"resources:VGPU": "8"})
        refused = self._create_server(flavor_id=too_many, networks="none", expected_state="ERROR")
        self.assertIn("No valid host", refused["fault"]["message"])
        fits = self._create_flavor(extra_spec={"resources:VGPU": "7"})
        self._create_server(flavor_id=fits, networks="none")
        self.assertEqual({PROVIDER: (10, 2, 8)}, self.gpu_providers("host1"))

        vgpu.migrations.rollback_incoming("incoming")
        self._run_periodics()
        self.assertEqual({PROVIDER: (10, 0, 8)}, self.gpu_providers("host1"))
        self.used_mdevs_match_placement("host1")


class ProvidersBeforeTheFirstUpdateTests(test_vgpu.VGPUDriverTestBase):
    def test_a_sharing_provider_sorting_first_does_not_hide_the_hosts_tree(self):
        """Before nova's first inventory update (an operation init_host
        resumes) the GPU providers are looked up in Placement from the
        allocation, which may hold a shared disk's provider too."""
        self.start_vgpu_compute("host1", "a100-sriov")
        driver = self.computes["host1"].driver
        shared = "00000000-0000-0000-0000-000000000001"  # sorts before any other
        self.placement.post(
            "/resource_providers", {"name": "shared-disk", "uuid": shared}, version="1.20"
        )
        gpu = driver._providers_by_uuid()
        (gpu_rp,) = gpu
        allocations = {
            shared: {"resources": {"DISK_GB": 1}},
            self.compute_rp_uuids["host1"]: {"resources": {"VCPU": 1}},
            gpu_rp: {"resources": {"VGPU": 1}},
        }
        driver.provider_tree = None  # as at init_host, before the first update
        driver._gpu_tree = None
        found = driver._providers_by_uuid(allocations)
        self.assertEqual(
            {rp: p.name for rp, p in gpu.items()}, {rp: p.name for rp, p in found.items()}
        )
