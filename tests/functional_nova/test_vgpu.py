"""vgpu-driver inside nova-compute, proven with nova's own in-process services.

Nova's functional framework runs its API, conductor, scheduler and compute
services with a real Placement and fake libvirt; the compute here loads
``vgpu_driver.nova.LibvirtVGPUDriver`` and reads a fake host written by our
fake kernel (``[vgpu] sysfs_root``).  Every assertion compares Placement's
usage on the per-GPU providers with the mdevs in the guests' domain XML and
in the fake sysfs.
"""

import functools
import os
import shutil
import tempfile
import threading
import time

import fixtures
import nova.conf
from nova.tests.fixtures import libvirt as fakelibvirt
from nova.tests.functional.libvirt import base
from prometheus_client import parser as prometheus_parser

import vgpu_driver.nova  # noqa: F401 - registers [vgpu] in nova's CONF
from tests import collector
from tests.functional_nova import deadline
from tests.functional_nova import libvirt_nodedevs
from vgpu_driver import claims_journal
from vgpu_driver import discovery
from vgpu_driver import driver as core
from vgpu_driver import guest as guest_xml
from vgpu_driver import inventory
from vgpu_driver import nova_alias
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles


def _keep_nova_thread_pools():
    """nova 34 ends a stopped service's graceful shutdown, in a thread its
    test harness does not wait for (``manager_shutdown_timeout = 0``), by
    shutting nova's thread pools for the whole process.  Its service fixture
    prevents that only while the test runs: a restart whose shutdown thread
    outlives its test (the driver's ``cleanup_host`` stops its host
    reconciler first) left every later test of the process without pools.
    A test process never wants them shut; older novas have no such pools."""
    try:
        from nova import thread_pool_factory
    except ImportError:
        return
    thread_pool_factory.shutdown_all_executors = lambda: None


_keep_nova_thread_pools()


class VGPUDriverTestBase(base.ServersTestBase):
    microversion = "latest"
    ADMIN_API = True
    ENABLED_TYPES = "nvidia-468"

    def setUp(self):
        deadline.arm_watchdog(self)  # oslotest's base class gives the gentle alarm
        collector.tune_for_nova(self)
        super().setUp()
        nova_alias.install()  # what vgpu-nova-compute does before nova-compute runs
        self.flags(compute_driver="vgpu_driver.nova.LibvirtVGPUDriver")
        # Each host's sysfs root is a fake kernel, which answers the writes
        # the privileged helper would make on a real host.
        self.useFixture(
            fixtures.MonkeyPatch(
                "vgpu_driver.sysfs.open_host", lambda root, writer=None: fakekernel.FakeKernel(root)
            )
        )
        self.flags(enabled_mdev_types=self.ENABLED_TYPES, group="devices")
        # nova registers [mdev_<type>] when its driver starts; tests set them first.
        nova.conf.devices.register_dynamic_opts(nova.conf.CONF)
        # Room for a dozen small guests on the fake host's two cores.
        self.flags(cpu_allocation_ratio=16.0)
        self.flags(instances=20, cores=40, group="quota")
        # nova's own API contract is not under test here; checking each of
        # its responses against the API's schema (every poll of a server's
        # state) is about a twentieth of the lane's CPU.
        self.flags(response_validation="ignore", group="api")
        self.tmp = tempfile.mkdtemp(prefix="vgpu-nova-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.kernels = {}
        # libvirt's node-device API over each host's fake kernel (nova's fake
        # knows no mdev by name), as the driver's definitions step reads it.
        self.nodedevs = self.useFixture(libvirt_nodedevs.MdevNodeDevices(self.kernels.get))

    def build_vgpu_host(self, hostname, *profile_names, mdevs=()):
        """The host's fake kernel, with ``mdevs`` (``{parent, type, uuid}``)
        already there as an earlier deployment would have left them."""
        loaded = [profiles.load(p) for p in profile_names]
        profile = loaded[0] if len(loaded) == 1 else profiles.combine(hostname, *loaded)
        profile = {**profile, "mdevs": [*profile.get("mdevs", ()), *mdevs]}
        root = os.path.join(self.tmp, hostname, "sys")
        self.kernels[hostname] = fakekernel.FakeKernel.build(root, profile)
        return self.kernels[hostname]

    def start_vgpu_compute(self, hostname, *profile_names, mdevs=()):
        if hostname not in self.kernels:
            self.build_vgpu_host(hostname, *profile_names, mdevs=mdevs)
        self.flags(
            sysfs_root=os.path.join(self.tmp, hostname, "sys"),
            state_dir=os.path.join(self.tmp, hostname, "state"),
            group="vgpu",
        )
        return self.start_compute(
            hostname=hostname,
            pci_info=fakelibvirt.HostPCIDevicesInfo(num_pci=0, num_pfs=0, num_vfs=0),
        )

    def gpu_providers(self, hostname):
        """``{name: (total, reserved, usage)}`` of the host's GPU providers."""
        root = self.compute_rp_uuids[hostname]
        found = {}
        for rp in self._get_all_rp_uuids_in_a_tree(root):
            inventory = self._get_provider_inventory(rp)
            if "VGPU" in inventory:
                name = self.placement.get(f"/resource_providers/{rp}").body["name"]
                usage = self._get_provider_usages(rp).get("VGPU", 0)
                found[name] = (inventory["VGPU"]["total"], inventory["VGPU"]["reserved"], usage)
        return found

    def domain_mdevs(self, hostname):
        """The mdevs in the guests' domain XML, read as nova reads guests."""
        return [m for mdevs in self.guest_mdevs(hostname).values() for m in mdevs]

    def guest_mdevs(self, hostname):
        """``{instance uuid: [mdev uuid]}`` from the guests' domain XML."""
        found = {}
        for guest in self.computes[hostname].driver._host.list_guests(only_running=False):
            found[guest.uuid] = guest_xml.mdev_uuids(guest_xml.parse(guest.get_xml_desc()))
        return found

    def kernel_mdevs(self, hostname):
        """``{uuid: (parent, type id)}`` of the mdevs in the fake sysfs."""
        return {m.uuid: (m.parent, m.type_id) for m in self.kernels[hostname].list_mdevs()}

    def used_mdevs_match_placement(self, hostname):
        """Each GPU provider's usage is the number of domain mdevs on its GPU,
        and every domain mdev exists in sysfs."""
        kernel = self.kernel_mdevs(hostname)
        in_domains = self.domain_mdevs(hostname)
        self.assertEqual(len(in_domains), len(set(in_domains)), "an mdev is shared")
        self.assertLessEqual(set(in_domains), set(kernel))
        snapshot = discovery.discover(self.kernels[hostname])
        per_gpu = {}
        for uuid in in_domains:
            gpu = snapshot.gpu_of_parent(kernel[uuid][0])
            name = inventory.provider_name(hostname, gpu)
            per_gpu[name] = per_gpu.get(name, 0) + 1
        usages = {
            name: usage for name, (_t, _r, usage) in self.gpu_providers(hostname).items() if usage
        }
        self.assertEqual(per_gpu, usages)

    def create_servers(self, name, flavor, count, ends=("ACTIVE",), tries=100):
        """One API request for ``count`` servers (``min_count``), once each
        is in a state of ``ends`` (polled ``tries`` times, 0.1 s apart); an
        ERROR not among them fails the test."""
        # The image nova's own _create_server defaults to in its fake Glance.
        self.api.post_server(
            {
                "server": {
                    "name": name,
                    "imageRef": "155d900f-4e14-4e4c-a73d-069cbf4541e6",
                    "flavorRef": flavor,
                    "networks": "none",
                    "min_count": count,
                }
            }
        )
        return self._wait_for_servers(name, count, ends, tries)

    def _wait_for_servers(self, name, count, ends, tries):
        for _ in range(tries):
            servers = [s for s in self.api.get_servers() if s["name"].startswith(name)]
            if len(servers) == count and all(s["status"] in ends for s in servers):
                return servers
            if "ERROR" not in ends:
                self.assertFalse(any(s["status"] == "ERROR" for s in servers), servers)
            time.sleep(0.1)
        self.fail(f"{count} servers named {name} not {' or '.join(ends)} in time")


class CreateServerTests(VGPUDriverTestBase):
    def test_a100_host_reports_one_provider_of_ten_and_boots_a_vgpu_guest(self):
        self.start_vgpu_compute("host1", "a100-sriov")
        self.assertEqual({"host1_pci_0000_41_00_0": (10, 0, 0)}, self.gpu_providers("host1"))
        flavor = self._create_flavor(extra_spec={"resources:VGPU": "1"})
        server = self._create_server(flavor_id=flavor, networks="none", host="host1")
        self.assertEqual("ACTIVE", server["status"])
        mdevs = self.domain_mdevs("host1")
        self.assertEqual(1, len(mdevs))
        self.assertEqual({"host1_pci_0000_41_00_0": (10, 0, 1)}, self.gpu_providers("host1"))
        self.assertEqual(mdevs, list(self.kernel_mdevs("host1")))
        claims = self.computes["host1"].driver.vgpu.journal.claims(server["id"])
        self.assertEqual([(mdevs[0], "attached")], [(c.mdev_uuid, c.state) for c in claims])

    def test_a100_schedules_at_most_ten_4c_guests(self):
        """nova's per-VF providers offer 16 A100-4C; the board holds 10."""
        self.start_vgpu_compute("host1", "a100-sriov")
        flavor = self._create_flavor(
            memory_mb=512, vcpu=1, disk=1, ephemeral=0, extra_spec={"resources:VGPU": "1"}
        )
        for _ in range(10):
            self._create_server(flavor_id=flavor, networks="none", host="host1")
        self._create_server(flavor_id=flavor, networks="none", host="host1", expected_state="ERROR")
        self.assertEqual({"host1_pci_0000_41_00_0": (10, 0, 10)}, self.gpu_providers("host1"))
        mdevs = self.domain_mdevs("host1")
        self.assertEqual(10, len(set(mdevs)))
        self.assertEqual(sorted(mdevs), sorted(self.kernel_mdevs("host1")))

    def test_the_periodic_update_writes_what_it_reported_to_the_metrics_file(self):
        textfile = os.path.join(self.tmp, "vgpu.prom")
        self.flags(metrics_textfile=textfile, group="vgpu")
        self.start_vgpu_compute("host1", "a100-sriov")
        flavor = self._create_flavor(extra_spec={"resources:VGPU": "2"})
        server = self._create_server(flavor_id=flavor, networks="none", host="host1")
        self._run_periodics()
        with open(textfile, encoding="utf-8") as written:
            found = {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in prometheus_parser.text_string_to_metric_families(written.read())
                for s in family.samples
            }
        gpu = (("gpu", "0000:41:00.0"), ("type", "nvidia-468"))
        # What Placement holds: (total, reserved, usage).
        self.assertEqual({"host1_pci_0000_41_00_0": (10, 0, 2)}, self.gpu_providers("host1"))
        self.assertEqual(
            (10, 0, 2, 1),
            tuple(
                found[(f"vgpu_gpu_{name}", gpu)]
                for name in ("vgpus_capacity", "vgpus_reserved", "vgpus_used")
            )
            + (found[("vgpu_gpu_guests", gpu[:1])],),
        )
        self.assertEqual(
            1,
            found[
                (
                    "vgpu_gpu_info",
                    (
                        ("gpu", "0000:41:00.0"),
                        ("model", "10de:20f1"),
                        ("pci_bus_id", "00000000:41:00.0"),
                        ("provider", "host1_pci_0000_41_00_0"),
                        ("resource_class", "VGPU"),
                        ("unit", "vGPUs"),
                    ),
                )
            ],
        )
        self.assertEqual(2, found[("vgpu_claims", (("state", "attached"),))])
        self.assertEqual(1, found[("vgpu_reconciler_up", ())])
        self.assertEqual(0, found[("vgpu_orphan_vgpus", ())])
        self._delete_server(server)
        self._run_periodics()
        with open(textfile, encoding="utf-8") as written:
            self.assertIn(
                'vgpu_gpu_vgpus_used{gpu="0000:41:00.0",type="nvidia-468"} 0.0',
                written.read().splitlines(),
            )

    def test_deleting_the_server_frees_its_mdev_for_the_next(self):
        self.start_vgpu_compute("host1", "a100-sriov")
        flavor = self._create_flavor(extra_spec={"resources:VGPU": "1"})
        first = self._create_server(flavor_id=flavor, networks="none", host="host1")
        (mdev,) = self.domain_mdevs("host1")
        self._delete_server(first)
        self.assertEqual({"host1_pci_0000_41_00_0": (10, 0, 0)}, self.gpu_providers("host1"))
        self.assertEqual([], self.computes["host1"].driver.vgpu.journal.claims())
        self._create_server(flavor_id=flavor, networks="none", host="host1")
        self.assertEqual([mdev], self.domain_mdevs("host1"))  # reused, not re-created


class MultipleTypesTests(VGPUDriverTestBase):
    """nova's guide layout: two types chosen by automatic traits, no tagging."""

    ENABLED_TYPES = "nvidia-35,nvidia-36"

    def setUp(self):
        super().setUp()
        self.flags(device_addresses=["0000:84:00.0", "0000:85:00.0"], group="mdev_nvidia-35")
        self.flags(device_addresses=["0000:86:00.0"], group="mdev_nvidia-36")

    def test_a_type_trait_picks_the_gpu_serving_it(self):
        self.start_vgpu_compute("host1", "m60-multi")
        self.assertEqual(
            {
                "host1_pci_0000_84_00_0": (16, 0, 0),
                "host1_pci_0000_85_00_0": (16, 0, 0),
                "host1_pci_0000_86_00_0": (8, 0, 0),
            },
            self.gpu_providers("host1"),
        )
        flavor = self._create_flavor(
            extra_spec={"resources:VGPU": "1", "trait:CUSTOM_VGPU_GRID_M60_1B": "required"}
        )
        self._create_server(flavor_id=flavor, networks="none", host="host1")
        self.assertEqual(1, self.gpu_providers("host1")["host1_pci_0000_86_00_0"][2])
        (mdev,) = self.kernels["host1"].list_mdevs()
        self.assertEqual(("0000:86:00.0", "nvidia-36"), (mdev.parent, mdev.type_id))


class SharedBoardModeTests(VGPUDriverTestBase):
    """``[devices] shared_board_mode`` is ours, in nova's own ``[devices]``
    group: nova-compute reads it beside nova's ``enabled_mdev_types``."""

    ENABLED_TYPES = "nvidia-1155,nvidia-1156"

    def test_a_board_of_two_types_is_served_as_a_type_pool(self):
        self.flags(shared_board_mode="pool", group="devices")
        for type_id in self.ENABLED_TYPES.split(","):
            self.flags(device_addresses=["0000:c1:00.0"], group=f"mdev_{type_id}")
        self.start_vgpu_compute("host1", "l40s-vfio")
        self.assertTrue(self.computes["host1"].driver.vgpu.mdev_config.pools)
        rp = self._get_provider_uuid_by_name("host1_pci_0000_c1_00_0")
        found = self._get_provider_inventory(rp)
        # Every size of the empty board offered, up to NVIDIA's maximum.
        self.assertEqual(
            {
                "CUSTOM_VGPU_FRAMEBUFFER_MIB": 49152,
                "CUSTOM_VGPU_SIZE_4096_MIB": 12,
                "CUSTOM_VGPU_SIZE_8192_MIB": 6,
            },
            {rc: record["total"] - record["reserved"] for rc, record in found.items()},
        )


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
        flavor = self._create_flavor(
            memory_mb=512, vcpu=1, disk=1, ephemeral=0, extra_spec={"resources:VGPU": "1"}
        )
        servers = self.create_servers("multi", flavor, 2)
        self.assertEqual(2, len(set(self.domain_mdevs("host1"))))
        used = sum(usage for _t, _r, usage in self.gpu_providers("host1").values())
        self.assertEqual(2, used)
        held = {c.instance_uuid for c in self.computes["host1"].driver.vgpu.journal.claims()}
        self.assertEqual({s["id"] for s in servers}, held)

    def test_two_vgpus_isolated_on_two_gpus(self):
        self.start_vgpu_compute("host1", "t4x8")
        flavor = self._create_flavor(
            memory_mb=512,
            vcpu=1,
            disk=1,
            ephemeral=0,
            extra_spec={"resources1:VGPU": "1", "resources2:VGPU": "1", "group_policy": "isolate"},
        )
        server = self._create_server(flavor_id=flavor, networks="none", host="host1")
        self.assertEqual(2, len(set(self.domain_mdevs("host1"))))
        usages = [usage for _t, _r, usage in self.gpu_providers("host1").values() if usage]
        self.assertEqual([1, 1], usages)
        gpus = {c.gpu for c in self.computes["host1"].driver.vgpu.journal.claims(server["id"])}
        self.assertEqual(2, len(gpus))


class ResizeTests(VGPUDriverTestBase):
    """nova's resize matrix: usage follows the guest, revert and confirm."""

    def setUp(self):
        super().setUp()
        # As nova's own vGPU resize tests: the fake guests have no disk files.
        self.useFixture(
            fixtures.MockPatch(
                "nova.virt.libvirt.LibvirtDriver._get_instance_disk_info", return_value=[]
            )
        )
        self.useFixture(fixtures.MockPatch("os.rename"))

    def test_resize_revert_and_confirm(self):
        for host in ("host1", "host2"):
            self.start_vgpu_compute(host, "a100-sriov")
        flavor = self._create_flavor(
            memory_mb=512, vcpu=1, disk=1, ephemeral=0, extra_spec={"resources:VGPU": "1"}
        )
        bigger = self._create_flavor(
            memory_mb=1024, vcpu=1, disk=1, ephemeral=0, extra_spec={"resources:VGPU": "1"}
        )
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
        self.assertEqual(
            sorted(self.domain_mdevs(source)),
            sorted(c.mdev_uuid for c in self.computes[source].driver.vgpu.journal.claims()),
        )
        self.assertEqual(
            self.domain_mdevs(target),
            [c.mdev_uuid for c in self.computes[target].driver.vgpu.journal.claims(server["id"])],
        )


class MaxInstancesTests(VGPUDriverTestBase):
    """``[mdev_<type>] max_instances`` caps a type host-wide, GPU by GPU.

    nova counts GPUs in turn and deletes the provider of every GPU whose
    whole capacity would pass what is left of the cap (its
    VGPULimitMultipleTypesTests: a 16-wide GPU under ``max_instances=2``
    loses its provider), so a cap of 3 over 2-wide GPUs offers 2.  We
    assert the cap is met exactly: GPUs in address order keep their
    capacity until it runs out, the GPU where it runs out is capped
    partially, later ones keep their provider fully reserved (saying why),
    a guest past the cap gets NoValidHost, and a higher cap read at restart
    never takes capacity from GPUs already in use.
    """

    # nvidia-43 (GRID M60-4A) fits twice on a GPU; nvidia-36 is nova's second type.
    ENABLED_TYPES = "nvidia-43,nvidia-36"
    CAPPED = ["0000:84:00.0", "0000:85:00.0", "0000:86:00.0"]

    def setUp(self):
        super().setUp()
        self.flags(device_addresses=self.CAPPED, max_instances=3, group="mdev_nvidia-43")
        self.flags(device_addresses=["0000:87:00.0"], group="mdev_nvidia-36")
        self.start_vgpu_compute("host1", "m60-multi")
        self.capped = self._create_flavor(
            memory_mb=512,
            vcpu=1,
            disk=1,
            ephemeral=0,
            extra_spec={"resources:VGPU": "1", "trait:CUSTOM_VGPU_GRID_M60_4A": "required"},
        )

    def test_max_instances_caps_the_type_partially_and_refuses_past_it(self):
        self.assertEqual(
            {
                "host1_pci_0000_84_00_0": (2, 0, 0),
                "host1_pci_0000_85_00_0": (1, 0, 0),
                "host1_pci_0000_86_00_0": (2, 2, 0),
                "host1_pci_0000_87_00_0": (8, 0, 0),
            },
            self.gpu_providers("host1"),
        )
        tree = self.computes["host1"].driver.vgpu.provider_tree("host1")
        self.assertIn(
            "max_instances=3 for nvidia-43", tree.provider("host1_pci_0000_86_00_0").reason
        )
        for _ in range(3):
            self._create_server(flavor_id=self.capped, networks="none", host="host1")
        refused = self._create_server(
            flavor_id=self.capped, networks="none", host="host1", expected_state="ERROR"
        )
        self.assertIn("No valid host", refused["fault"]["message"])
        self.assertEqual(
            {
                "host1_pci_0000_84_00_0": (2, 0, 2),
                "host1_pci_0000_85_00_0": (1, 0, 1),
                "host1_pci_0000_86_00_0": (2, 2, 0),
                "host1_pci_0000_87_00_0": (8, 0, 0),
            },
            self.gpu_providers("host1"),
        )
        self.assertEqual(3, len(self.domain_mdevs("host1")))
        self.assertEqual({"nvidia-43"}, {t for _p, t in self.kernel_mdevs("host1").values()})
        self.used_mdevs_match_placement("host1")
        # The other type is not capped by it.
        other = self._create_flavor(
            memory_mb=512,
            vcpu=1,
            disk=1,
            ephemeral=0,
            extra_spec={"resources:VGPU": "1", "trait:CUSTOM_VGPU_GRID_M60_1B": "required"},
        )
        self._create_server(flavor_id=other, networks="none", host="host1")
        self.assertEqual(1, self.gpu_providers("host1")["host1_pci_0000_87_00_0"][2])
        self.used_mdevs_match_placement("host1")

    def test_raising_max_instances_on_restart_opens_the_next_gpu(self):
        for _ in range(3):
            self._create_server(flavor_id=self.capped, networks="none", host="host1")
        self.flags(max_instances=5, group="mdev_nvidia-43")
        self.restart_compute_service("host1")
        self.assertEqual(
            {
                "host1_pci_0000_84_00_0": (2, 0, 2),
                "host1_pci_0000_85_00_0": (2, 0, 1),
                "host1_pci_0000_86_00_0": (1, 0, 0),
                "host1_pci_0000_87_00_0": (8, 0, 0),
            },
            self.gpu_providers("host1"),
        )
        for _ in range(2):
            self._create_server(flavor_id=self.capped, networks="none", host="host1")
        self._create_server(
            flavor_id=self.capped, networks="none", host="host1", expected_state="ERROR"
        )
        self.assertEqual(5, len(self.domain_mdevs("host1")))
        self.used_mdevs_match_placement("host1")


class ConcurrentReuseTests(VGPUDriverTestBase):
    """Two guests built at the same time never get the same free mdev.

    nova hands out an existing free mdev by looking only at the domains:
    until the first guest's domain is defined, its mdev still looks free, so
    a second build on the same GPU can take it too (two guests, one mdev; the
    second fails to start or both share the device).  Here two free mdevs
    exist, both builds are held until both are inside the allocation, and we
    assert each guest got a different one of them (both reused, none
    created), one claim per instance, and usage 2 on the GPU's provider;
    also when libvirt calls yield to the other build, as they do through
    tpool on an eventlet compute.
    """

    ENABLED_TYPES = "nvidia-231"
    GPU = "0000:18:00.0"
    FREE = ["0f0e0d0c-0000-4000-8000-000000000001", "0f0e0d0c-0000-4000-8000-000000000002"]

    def setUp(self):
        super().setUp()
        # One GPU serves the type, so both builds land on it.
        self.flags(device_addresses=[self.GPU], group="mdev_nvidia-231")

    def test_two_builds_reusing_free_mdevs_at_once_get_distinct_ones(self):
        self.start_vgpu_compute(
            "host1",
            "t4x8",
            mdevs=[{"parent": self.GPU, "type": "nvidia-231", "uuid": u} for u in self.FREE],
        )
        self._race_two_builds()

    def test_two_builds_at_once_while_libvirt_calls_yield(self):
        """As on an eventlet compute, libvirt calls run in tpool, and the
        calling green thread yields while one runs (a no-op with native
        threads): a build that yields while it holds the claims journal must
        not stall the other build on the journal's lock."""
        # A stalled build fails within seconds rather than the journal's 30.
        self.useFixture(
            fixtures.MonkeyPatch(
                "vgpu_driver.claims_journal.Journal.__init__",
                functools.partialmethod(claims_journal.Journal.__init__, busy_timeout=3.0),
            )
        )
        self.start_vgpu_compute(
            "host1",
            "t4x8",
            mdevs=[{"parent": self.GPU, "type": "nvidia-231", "uuid": u} for u in self.FREE],
        )
        host = self.computes["host1"].driver._host
        # nova's own wrapper for libvirt objects (every supported release
        # has it): tpool on eventlet, the object itself with native threads.
        proxied = host._wrap_libvirt_proxy(host.get_connection())
        host.get_connection = lambda: proxied
        self._race_two_builds()

    def _race_two_builds(self):
        self.assertEqual({"host1_pci_0000_18_00_0": (8, 0, 0)}, self.gpu_providers("host1"))
        both_inside = threading.Barrier(2, timeout=30)
        arrived = []
        allocate = core.VGPUDriver.allocate

        def allocate_together(driver, instance_uuid, allocations, providers, type_traits=None):
            arrived.append(instance_uuid)
            both_inside.wait()  # a build alone here fails: the builds must overlap
            return allocate(driver, instance_uuid, allocations, providers, type_traits)

        self.useFixture(
            fixtures.MonkeyPatch("vgpu_driver.driver.VGPUDriver.allocate", allocate_together)
        )
        flavor = self._create_flavor(
            memory_mb=512, vcpu=1, disk=1, ephemeral=0, extra_spec={"resources:VGPU": "1"}
        )
        servers = self.create_servers("racer", flavor, 2)

        ids = {s["id"] for s in servers}
        self.assertEqual(ids, set(arrived))
        by_guest = self.guest_mdevs("host1")
        self.assertEqual(ids, set(by_guest))
        self.assertEqual(sorted(self.FREE), sorted(m for ms in by_guest.values() for m in ms))
        self.assertEqual(set(self.FREE), set(self.kernel_mdevs("host1")))  # none created
        journal = self.computes["host1"].driver.vgpu.journal
        for instance, mdevs in by_guest.items():
            self.assertEqual(
                [(m, "attached", False) for m in mdevs],
                [(c.mdev_uuid, c.state, c.created) for c in journal.claims(instance)],
            )
        self.assertEqual({"host1_pci_0000_18_00_0": (8, 0, 2)}, self.gpu_providers("host1"))
        self.used_mdevs_match_placement("host1")


class StaleTypeTests(VGPUDriverTestBase):
    """A GPU holding mdevs of a type it no longer serves.

    A time-sliced GPU hosts one type at a time, so an mdev of an old type
    leaves ``available_instances`` of the new one at 0: nova reports no
    capacity for that GPU and never removes the mdev, so the GPU stays lost
    until someone removes it by hand.  We assert an unused old-type mdev is
    removed at start-up and the GPU reports the new type's full capacity and
    takes a guest; and that one a guest still uses is kept, its GPU
    reported fully reserved (saying it drains) until the guest goes, then
    reclaimed and served.
    """

    ENABLED_TYPES = "nvidia-231"
    GPU = "0000:18:00.0"
    PROVIDER = "host1_pci_0000_18_00_0"
    ORPHAN = "0f0e0d0c-0000-4000-8000-0000000000aa"

    def setUp(self):
        super().setUp()
        self.flags(device_addresses=[self.GPU], group="mdev_nvidia-231")
        self.flavor = self._create_flavor(
            memory_mb=512, vcpu=1, disk=1, ephemeral=0, extra_spec={"resources:VGPU": "1"}
        )

    def test_an_unused_old_type_mdev_is_removed_and_the_gpu_serves_the_new_type(self):
        kernel = self.build_vgpu_host(
            "host1", "t4x8", mdevs=[{"parent": self.GPU, "type": "nvidia-222", "uuid": self.ORPHAN}]
        )
        # What nova would count for this GPU: nothing.
        self.assertEqual(0, kernel.available_instances(self.GPU, "nvidia-231"))

        self.start_vgpu_compute("host1")
        self.assertEqual({}, self.kernel_mdevs("host1"))
        self.assertEqual({self.PROVIDER: (8, 0, 0)}, self.gpu_providers("host1"))
        self.assertIn(
            "CUSTOM_VGPU_GRID_T4_2Q",
            self._get_provider_traits(self._get_provider_uuid_by_name(self.PROVIDER)),
        )
        self.assertEqual([], self.computes["host1"].driver.vgpu.journal.claims())

        self._create_server(flavor_id=self.flavor, networks="none", host="host1")
        (mdev,) = self.domain_mdevs("host1")
        self.assertEqual({mdev: (self.GPU, "nvidia-231")}, self.kernel_mdevs("host1"))
        self.assertEqual({self.PROVIDER: (8, 0, 1)}, self.gpu_providers("host1"))
        self.used_mdevs_match_placement("host1")

    def test_an_old_type_mdev_a_guest_uses_is_kept_and_its_gpu_drains(self):
        # The GPU served nvidia-222 (GRID T4-1B) when the guest was built...
        self.flags(enabled_mdev_types="nvidia-222", group="devices")
        nova.conf.devices.register_dynamic_opts(nova.conf.CONF)
        self.flags(device_addresses=[self.GPU], group="mdev_nvidia-222")
        self.start_vgpu_compute("host1", "t4x8")
        old = self._create_server(flavor_id=self.flavor, networks="none", host="host1")
        (mdev,) = self.domain_mdevs("host1")
        self.assertEqual({self.PROVIDER: (16, 0, 1)}, self.gpu_providers("host1"))

        # ... then the operator switches it to nvidia-231 and restarts the compute.
        self.flags(enabled_mdev_types="nvidia-231", group="devices")
        self.restart_compute_service("host1")
        self.assertEqual({mdev: (self.GPU, "nvidia-222")}, self.kernel_mdevs("host1"))
        self.assertEqual([mdev], self.domain_mdevs("host1"))
        self.assertEqual({self.PROVIDER: (8, 8, 1)}, self.gpu_providers("host1"))
        reason = (
            self.computes["host1"].driver.vgpu.provider_tree("host1").provider(self.PROVIDER).reason
        )
        self.assertIn("draining", reason)
        self.assertIn("1 of nvidia-222", reason)
        self.assertIn("in use by guests", reason)
        self.used_mdevs_match_placement("host1")
        refused = self._create_server(
            flavor_id=self.flavor, networks="none", host="host1", expected_state="ERROR"
        )
        self.assertIn("No valid host", refused["fault"]["message"])

        # Once the guest is gone, its mdev goes and the GPU serves the new type.
        self._delete_server(old)
        self._run_periodics()
        self.assertEqual({}, self.kernel_mdevs("host1"))
        self.assertEqual({self.PROVIDER: (8, 0, 0)}, self.gpu_providers("host1"))
        self._create_server(flavor_id=self.flavor, networks="none", host="host1")
        (new,) = self.domain_mdevs("host1")
        self.assertEqual({new: (self.GPU, "nvidia-231")}, self.kernel_mdevs("host1"))
        self.used_mdevs_match_placement("host1")
