"""Hard reboot and rescue of vGPU guests under LibvirtVGPUDriver.

nova defines the domain again for each: the guest must come back with the
mdevs it had, keep them claimed while its domain is briefly undefined, get
them re-created if the host rebooted, and, when it lost track of them
altogether, get new ones from its Placement allocation whatever the mdev
class (nova only knows the literal ``resources:VGPU`` there).
"""

import os

from nova import context
from nova import objects
from nova.virt.libvirt import utils as libvirt_utils

from tests.functional_nova import test_vgpu


class PowerTestBase(test_vgpu.VGPUDriverTestBase):
    ENABLED_TYPES = "nvidia-231"
    PROFILE = "t4x8"
    FLAVOR_RESOURCES = {"resources:VGPU": "1"}

    def setUp(self):
        super().setUp()
        self.ctxt = context.get_admin_context()
        self.configure_types()
        self.start_vgpu_compute("host1", self.PROFILE)
        self.flavor = self._create_flavor(
            memory_mb=512, vcpu=1, disk=1, ephemeral=0, extra_spec=self.FLAVOR_RESOURCES
        )

    def configure_types(self):
        """[mdev_<type>] options, set before the compute starts."""

    @property
    def driver(self):
        return self.computes["host1"].driver

    def boot(self, name="guest"):
        server = self._create_server(
            name=name, flavor_id=self.flavor, networks="none", host="host1"
        )
        return server, self.server_mdevs(server)

    def server_mdevs(self, server):
        guest = self.driver._host.get_guest(self._instance(server))
        return test_vgpu.guest_xml.mdev_uuids(test_vgpu.guest_xml.parse(guest.get_xml_desc()))

    def _instance(self, server):
        return objects.Instance.get_by_uuid(self.ctxt, server["id"])

    def claims(self, server):
        return [(c.mdev_uuid, c.state) for c in self.driver.vgpu.journal.claims(server["id"])]

    def sysfs_mdevs(self):
        return set(self.kernel_mdevs("host1"))

    def used(self):
        return sum(usage for _t, _r, usage in self.gpu_providers("host1").values())

    def assert_holds(self, server, mdevs):
        self.assertEqual(mdevs, self.server_mdevs(server))
        self.assertEqual([(m, "attached") for m in sorted(mdevs)], self.claims(server))
        self.assertTrue(set(mdevs) <= self.sysfs_mdevs())
        self.assertEqual(len(self.domain_mdevs("host1")), self.used())


class HardRebootTests(PowerTestBase):
    def test_hard_reboot_keeps_the_guests_mdev(self):
        server, mdevs = self.boot()
        self._reboot_server(server, hard=True)
        self.assert_holds(server, mdevs)

    def test_hard_reboot_after_a_host_reboot_recreates_the_mdev(self):
        server, mdevs = self.boot()
        self.kernels["host1"].reboot()
        self.assertEqual(set(), self.sysfs_mdevs())
        self._reboot_server(server, hard=True)
        self.assert_holds(server, mdevs)

    def test_the_mdev_stays_claimed_while_the_domain_is_undefined(self):
        """Between nova's destroy and its new definition, another boot must
        not take the rebooting guest's mdev."""
        server, mdevs = self.boot()
        seen = {}
        real_destroy = type(self.driver).__mro__[1].destroy

        def destroy_then_boot(driver, *args, **kwargs):
            real_destroy(driver, *args, **kwargs)
            seen["claims"] = self.claims(server)
            seen["other"] = self.driver.vgpu.allocate(
                "other-instance", self._allocations(server), self.driver._providers_by_uuid()
            )

        self.useFixture(
            test_vgpu.fixtures.MonkeyPatch(
                "nova.virt.libvirt.driver.LibvirtDriver.destroy", destroy_then_boot
            )
        )
        self._reboot_server(server, hard=True)
        self.assertEqual([(mdevs[0], "attached")], seen["claims"])
        self.assertNotIn(mdevs[0], seen["other"])
        self.assert_holds(server, mdevs)

    def _allocations(self, server):
        return self.placement.get(f"/allocations/{server['id']}").body["allocations"]


class LostTrackTests(PowerTestBase):
    """A guest whose domain and claims were lost (a failed earlier reboot)
    gets mdevs again from its allocation; here of a custom class."""

    ENABLED_TYPES = "mtty-2"
    PROFILE = "mtty"
    FLAVOR_RESOURCES = {"resources:CUSTOM_SERIAL": "2"}

    def configure_types(self):
        self.flags(mdev_class="CUSTOM_SERIAL", group="mdev_mtty-2")

    def test_hard_reboot_reclaims_from_the_allocation(self):
        server, mdevs = self.boot()
        self.assertEqual(2, len(mdevs))
        self.driver._host.get_guest(self._instance(server))._domain.undefine()
        with self.driver.vgpu.journal.transaction() as txn:
            txn.remove(server["id"])
        self._reboot_server(server, hard=True)
        again = self.server_mdevs(server)
        self.assertEqual(2, len(again))
        self.assertEqual(
            {"mtty-2"}, {m.type_id for m in self.kernels["host1"].list_mdevs() if m.uuid in again}
        )
        self.assertEqual(sorted((m, "attached") for m in again), self.claims(server))
        usage = self._get_provider_usages(self._gpu_provider())
        self.assertEqual(2, usage["CUSTOM_SERIAL"])

    def _gpu_provider(self):
        root = self.compute_rp_uuids["host1"]
        for rp in self._get_all_rp_uuids_in_a_tree(root):
            if "CUSTOM_SERIAL" in self._get_provider_inventory(rp):
                return rp
        self.fail("no CUSTOM_SERIAL provider")


class RescueTests(PowerTestBase):
    def test_rescue_and_unrescue_keep_the_mdev(self):
        server, mdevs = self.boot()
        # Where rescue writes unrescue.xml; fake image creation never made it.
        os.makedirs(libvirt_utils.get_instance_path(self._instance(server)), exist_ok=True)
        self.api.post_server_action(server["id"], {"rescue": {}})
        server = self._wait_for_state_change(server, "RESCUE")
        self.assert_holds(server, mdevs)
        self.api.post_server_action(server["id"], {"unrescue": None})
        server = self._wait_for_state_change(server, "ACTIVE")
        self.assert_holds(server, mdevs)
