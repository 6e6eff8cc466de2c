"""vGPUs on NVIDIA's vendor-specific VFIO framework, through nova's services.

There is no mdev there: the driver gives a VF a type (``current_vgpu_type``)
and nova's domain gets that VF as a PCI hostdev.  nova has no notion of it;
here the allocation, the XML and Placement must all agree on the VFs.
"""

from tests.functional_nova import test_vgpu

L40S = "0000:c1:00.0"
PROVIDER = "host1_pci_0000_c1_00_0"
TYPE = "nvidia-1155"  # L40S-4Q in the fake profile: 12 per GPU


class VendorVfioTests(test_vgpu.VGPUDriverTestBase):
    ENABLED_TYPES = TYPE

    def setUp(self):
        super().setUp()
        # sysfs does not say how many fit on the GPU: the operator does.
        self.flags(max_instances=12, group=f"mdev_{TYPE}")
        self.start_vgpu_compute("host1", "l40s-vfio")
        self.flavor = self._create_flavor(
            memory_mb=512, vcpu=1, disk=1, ephemeral=0, extra_spec={"resources:VGPU": "1"}
        )

    @property
    def driver(self):
        return self.computes["host1"].driver

    def domain_vfs(self):
        vfs = []
        for guest in self.driver._host.list_guests(only_running=False):
            vfs += test_vgpu.guest_xml.pci_vfs(test_vgpu.guest_xml.parse(guest.get_xml_desc()))
        return vfs

    def typed_vfs(self):
        """``{VF: type id}`` of the VFs sysfs shows with a vGPU type set."""
        snapshot = self.driver.vgpu.manager.snapshot(refresh=True)
        return {v.id: v.type_id for v in snapshot.vgpus if v.id == v.parent}

    def claims(self, server):
        return [(c.mdev_uuid, c.state) for c in self.driver.vgpu.journal.claims(server["id"])]

    def assert_usage_matches(self):
        self.assertEqual(len(self.domain_vfs()), self.gpu_providers("host1")[PROVIDER][2])
        self.assertEqual(sorted(self.domain_vfs()), sorted(self.typed_vfs()))

    def test_guests_get_typed_vfs_as_pci_hostdevs(self):
        self.assertEqual({PROVIDER: (12, 0, 0)}, self.gpu_providers("host1"))
        first = self._create_server(flavor_id=self.flavor, networks="none", host="host1")
        second = self._create_server(flavor_id=self.flavor, networks="none", host="host1")
        vfs = self.domain_vfs()
        self.assertEqual(2, len(set(vfs)))
        self.assertEqual({TYPE}, set(self.typed_vfs().values()))
        claimed = self.claims(first) + self.claims(second)
        self.assertEqual(sorted((vf, "attached") for vf in vfs), sorted(claimed))
        self.assert_usage_matches()

    def test_delete_frees_the_vf_and_the_next_guest_reuses_it(self):
        first = self._create_server(flavor_id=self.flavor, networks="none", host="host1")
        ((vf, _state),) = self.claims(first)
        self._delete_server(first)
        self.assertEqual([], self.domain_vfs())
        self.assertEqual({PROVIDER: (12, 0, 0)}, self.gpu_providers("host1"))
        # Kept typed for reuse ([vgpu] remove_mdevs_on_release is off).
        self.assertEqual({vf: TYPE}, self.typed_vfs())
        again = self._create_server(flavor_id=self.flavor, networks="none", host="host1")
        self.assertEqual([(vf, "attached")], self.claims(again))
        self.assert_usage_matches()

    def test_hard_reboot_keeps_the_vf(self):
        server = self._create_server(flavor_id=self.flavor, networks="none", host="host1")
        before = self.domain_vfs()
        self._reboot_server(server, hard=True)
        self.assertEqual(before, self.domain_vfs())
        self.assertEqual([(before[0], "attached")], self.claims(server))
        self.assert_usage_matches()
