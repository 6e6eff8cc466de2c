"""vgpu-driver inside nova-compute, proven with nova's own in-process services.

Nova's functional framework runs its API, conductor, scheduler and compute
services with a real Placement and fake libvirt; the compute here loads
``vgpu_driver.nova.LibvirtVGPUDriver`` and reads a fake host written by our
fake kernel (``[vgpu] sysfs_root``).  Every assertion compares Placement's
usage on the per-GPU providers with the mdevs in the guests' domain XML and
in the fake sysfs.
"""

import os
import shutil
import tempfile
import time

import fixtures
import nova.conf
from nova.tests.fixtures import libvirt as fakelibvirt
from nova.tests.functional.libvirt import base

import vgpu_driver.nova  # noqa: F401 - registers [vgpu] in nova's CONF
from vgpu_driver import guest as guest_xml
from vgpu_driver import nova_alias
from vgpu_driver.sysfs import fakekernel
from vgpu_driver.sysfs import profiles


class VGPUDriverTestBase(base.ServersTestBase):
    microversion = "latest"
    ADMIN_API = True
    ENABLED_TYPES = "nvidia-468"

    def setUp(self):
        super().setUp()
        nova_alias.install()  # what vgpu-nova-compute does before nova-compute runs
        self.flags(compute_driver="vgpu_driver.nova.LibvirtVGPUDriver")
        self.flags(enabled_mdev_types=self.ENABLED_TYPES, group="devices")
        # nova registers [mdev_<type>] when its driver starts; tests set them first.
        nova.conf.devices.register_dynamic_opts(nova.conf.CONF)
        # Room for a dozen small guests on the fake host's two cores.
        self.flags(cpu_allocation_ratio=16.0)
        self.flags(instances=20, cores=40, group="quota")
        self.tmp = tempfile.mkdtemp(prefix="vgpu-nova-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.kernels = {}

    def start_vgpu_compute(self, hostname, *profile_names):
        loaded = [profiles.load(p) for p in profile_names]
        profile = loaded[0] if len(loaded) == 1 else profiles.combine(hostname, *loaded)
        root = os.path.join(self.tmp, hostname, "sys")
        self.kernels[hostname] = fakekernel.FakeKernel.build(root, profile)
        self.flags(sysfs_root=root, state_dir=os.path.join(self.tmp, hostname, "state"),
                   group="vgpu")
        return self.start_compute(
            hostname=hostname,
            pci_info=fakelibvirt.HostPCIDevicesInfo(num_pci=0, num_pfs=0, num_vfs=0))

    def gpu_providers(self, hostname):
        """``{name: (total, reserved, usage)}`` of the host's GPU providers."""
        root = self.compute_rp_uuids[hostname]
        found = {}
        for rp in self._get_all_rp_uuids_in_a_tree(root):
            inventory = self._get_provider_inventory(rp)
            if "VGPU" in inventory:
                name = self.placement.get(f"/resource_providers/{rp}").body["name"]
                usage = self._get_provider_usages(rp).get("VGPU", 0)
                found[name] = (inventory["VGPU"]["total"], inventory["VGPU"]["reserved"],
                               usage)
        return found

    def domain_mdevs(self, hostname):
        """The mdevs in the guests' domain XML, read as nova reads guests."""
        mdevs = []
        for guest in self.computes[hostname].driver._host.list_guests(only_running=False):
            mdevs += guest_xml.mdev_uuids(guest_xml.parse(guest.get_xml_desc()))
        return mdevs


class CreateServerTests(VGPUDriverTestBase):
    def test_a100_host_reports_one_provider_of_ten_and_boots_a_vgpu_guest(self):
        self.start_vgpu_compute("host1", "a100-sriov")
        self.assertEqual({"host1_pci_0000_41_00_0": (10, 0, 0)},
                         self.gpu_providers("host1"))
        flavor = self._create_flavor(extra_spec={"resources:VGPU": "1"})
        server = self._create_server(flavor_id=flavor, networks="none", host="host1")
        self.assertEqual("ACTIVE", server["status"])
        mdevs = self.domain_mdevs("host1")
        self.assertEqual(1, len(mdevs))
        self.assertEqual({"host1_pci_0000_41_00_0": (10, 0, 1)}, self.gpu_providers("host1"))
        self.assertEqual(mdevs, [m.uuid for m in self.kernels["host1"].list_mdevs()])
        claims = self.computes["host1"].driver.vgpu.journal.claims(server["id"])
        self.assertEqual([(mdevs[0], "attached")], [(c.mdev_uuid, c.state) for c in claims])

    def test_a100_schedules_at_most_ten_4c_guests(self):
        """nova's per-VF providers offer 16 A100-4C; the board holds 10."""
        self.start_vgpu_compute("host1", "a100-sriov")
        flavor = self._create_flavor(memory_mb=512, vcpu=1, disk=1, ephemeral=0,
                                     extra_spec={"resources:VGPU": "1"})
        for _ in range(10):
            self._create_server(flavor_id=flavor, networks="none", host="host1")
        self._create_server(flavor_id=flavor, networks="none", host="host1",
                            expected_state="ERROR")
        self.assertEqual({"host1_pci_0000_41_00_0": (10, 0, 10)},
                         self.gpu_providers("host1"))
        mdevs = self.domain_mdevs("host1")
        self.assertEqual(10, len(set(mdevs)))
        self.assertEqual(sorted(mdevs),
                         sorted(m.uuid for m in self.kernels["host1"].list_mdevs()))

    def test_deleting_the_server_frees_its_mdev_for_the_next(self):
        self.start_vgpu_compute("host1", "a100-sriov")
        flavor = self._create_flavor(extra_spec={"resources:VGPU": "1"})
        first = self._create_server(flavor_id=flavor, networks="none", host="host1")
        (mdev,) = self.domain_mdevs("host1")
        self._delete_server(first)
        self.assertEqual({"host1_pci_0000_41_00_0": (10, 0, 0)},
                         self.gpu_providers("host1"))
        self.assertEqual([], self.computes["host1"].driver.vgpu.journal.claims())
        self._create_server(flavor_id=flavor, networks="none", host="host1")
        self.assertEqual([mdev], self.domain_mdevs("host1"))   # reused, not re-created


class MultipleTypesTests(VGPUDriverTestBase):
    """nova's guide layout: two types chosen by automatic traits, no tagging."""

    ENABLED_TYPES = "nvidia-35,nvidia-36"

    def setUp(self):
        super().setUp()
        self.flags(device_addresses=["0000:84:00.0", "0000:85:00.0"], group="mdev_nvidia-35")
        self.flags(device_addresses=["0000:86:00.0"], group="mdev_nvidia-36")

    def test_a_type_trait_picks_the_gpu_serving_it(self):
        self.start_vgpu_compute("host1", "m60-multi")
        self.assertEqual({"host1_pci_0000_84_00_0": (16, 0, 0),
                          "host1_pci_0000_85_00_0": (16, 0, 0),
                          "host1_pci_0000_86_00_0": (8, 0, 0)},
                         self.gpu_providers("host1"))
        flavor = self._create_flavor(extra_spec={
            "resources:VGPU": "1", "trait:CUSTOM_VGPU_GRID_M60_1B": "required"})
        self._create_server(flavor_id=flavor, networks="none", host="host1")
        self.assertEqual(1, self.gpu_providers("host1")["host1_pci_0000_86_00_0"][2])
        (mdev,) = self.kernels["host1"].list_mdevs()
        self.assertEqual(("0000:86:00.0", "nvidia-36"), (mdev.parent, mdev.type_id))


class CustomClassTests(VGPUDriverTestBase):
    ENABLED_TYPES = "mtty-2"

    def setUp(self):
        super().setUp()
        self.flags(mdev_class="CUSTOM_SERIAL", group="mdev_mtty-2")

    def test_a_custom_resource_class_is_allocated_like_vgpu(self):
        self.start_vgpu_compute("host1", "mtty")
        flavor = self._create_flavor(extra_spec={"resources:CUSTOM_SERIAL": "2"})
        self._create_server(flavor_id=flavor, networks="none", host="host1")
        self.assertEqual(2, len(self.domain_mdevs("host1")))
        self.assertEqual({"mtty-2"}, {m.type_id for m in self.kernels["host1"].list_mdevs()})


class SeveralVGPUsTests(VGPUDriverTestBase):
    ENABLED_TYPES = "nvidia-231"

    def test_multi_create_gets_one_mdev_each(self):
        self.start_vgpu_compute("host1", "t4x8")
        flavor = self._create_flavor(memory_mb=512, vcpu=1, disk=1, ephemeral=0,
                                     extra_spec={"resources:VGPU": "1"})
        # The image nova's own _create_server defaults to in its fake Glance.
        self.api.post_server({"server": {
            "name": "multi", "imageRef": "155d900f-4e14-4e4c-a73d-069cbf4541e6",
            "flavorRef": flavor, "networks": "none", "min_count": 2}})
        servers = self._wait_for_servers("multi", 2)
        self.assertEqual(2, len(set(self.domain_mdevs("host1"))))
        used = sum(usage for _t, _r, usage in self.gpu_providers("host1").values())
        self.assertEqual(2, used)
        held = {c.instance_uuid for c in self.computes["host1"].driver.vgpu.journal.claims()}
        self.assertEqual({s["id"] for s in servers}, held)

    def test_two_vgpus_isolated_on_two_gpus(self):
        self.start_vgpu_compute("host1", "t4x8")
        flavor = self._create_flavor(memory_mb=512, vcpu=1, disk=1, ephemeral=0, extra_spec={
            "resources1:VGPU": "1", "resources2:VGPU": "1", "group_policy": "isolate"})
        server = self._create_server(flavor_id=flavor, networks="none", host="host1")
        self.assertEqual(2, len(set(self.domain_mdevs("host1"))))
        usages = [usage for _t, _r, usage in self.gpu_providers("host1").values() if usage]
        self.assertEqual([1, 1], usages)
        gpus = {c.gpu for c in self.computes["host1"].driver.vgpu.journal.claims(server["id"])}
        self.assertEqual(2, len(gpus))

    def _wait_for_servers(self, name, count):
        for _ in range(100):
            servers = [s for s in self.api.get_servers() if s["name"].startswith(name)]
            if len(servers) == count and all(s["status"] == "ACTIVE" for s in servers):
                return servers
            self.assertFalse(any(s["status"] == "ERROR" for s in servers), servers)
            time.sleep(0.1)
        self.fail(f"{count} servers named {name} not ACTIVE in time")


class ResizeTests(VGPUDriverTestBase):
    """nova's resize matrix: usage follows the guest, revert and confirm."""

    def setUp(self):
        super().setUp()
        # As nova's own vGPU resize tests: the fake guests have no disk files.
        self.useFixture(fixtures.MockPatch(
            "nova.virt.libvirt.LibvirtDriver._get_instance_disk_info", return_value=[]))
        self.useFixture(fixtures.MockPatch("os.rename"))

    def test_resize_revert_and_confirm(self):
        for host in ("host1", "host2"):
            self.start_vgpu_compute(host, "a100-sriov")
        flavor = self._create_flavor(memory_mb=512, vcpu=1, disk=1, ephemeral=0,
                                     extra_spec={"resources:VGPU": "1"})
        bigger = self._create_flavor(memory_mb=1024, vcpu=1, disk=1, ephemeral=0,
                                     extra_spec={"resources:VGPU": "1"})
        server = self._create_server(flavor_id=flavor, networks="none", host="host1")
        source = "host1" if self.domain_mdevs("host1") else "host2"
        target = "host2" if source == "host1" else "host1"

        def usage(host):
            return self.gpu_providers(host)[f"{host}_pci_0000_41_00_0"][2]

        server = self._resize_server(server, bigger)
        self.assertEqual((1, 1), (usage(source), usage(target)))
        self.assertEqual(1, len(self.domain_mdevs(target)))
        server = self._revert_resize(server)
        self.assertEqual((1, 0), (usage(source), usage(target)))
        self.assertEqual([], self.computes[target].driver.vgpu.journal.claims())
        server = self._resize_server(server, bigger)
        self._confirm_resize(server)
        self.assertEqual((0, 1), (usage(source), usage(target)))
        # Claims mirror the domains: the harness shares one CONF.host between its
        # computes, so nova leaves the source domain defined here; our claims on
        # the source follow whatever the source's domains still reference.
        self.assertEqual(sorted(self.domain_mdevs(source)),
                         sorted(c.mdev_uuid for c in
                                self.computes[source].driver.vgpu.journal.claims()))
        self.assertEqual(self.domain_mdevs(target),
                         [c.mdev_uuid for c in
                          self.computes[target].driver.vgpu.journal.claims(server["id"])])
