"""Live migration of guests whose vGPUs are NVIDIA vendor-specific VFIO VFs.

Two computes with an L40S each.  The destination claims VFs and sets their
type before the guest moves; the mapping goes to the source in nova's own
``pci_dev_map_src_dst``, from which nova rewrites the guest's PCI hostdevs;
fake libvirt plays the migration (nova's ``LibvirtMigrationMixin``).
"""

from nova.tests.functional.api import client

from tests.functional_nova import host_audit
from tests.functional_nova import test_live_migration
from tests.functional_nova import test_vgpu

TYPE = "nvidia-1156"  # L40S-8Q
PROVIDER = "pci_0000_c1_00_0"


class VendorVfioLiveMigrationTestBase(test_live_migration.LiveMigrationTestBase):
    ENABLED_TYPES = SOURCE_TYPES = DEST_TYPES = TYPE
    UNITS = 1

    def setUp(self):
        super().setUp()
        self.flavor = self._create_flavor(
            memory_mb=512,
            vcpu=1,
            disk=1,
            ephemeral=0,
            extra_spec={"resources:VGPU": str(self.UNITS)},
        )

    def start_host(self, hostname, enabled_types):
        self.flags(enabled_mdev_types=enabled_types, group="devices")
        # sysfs does not say how many fit on the GPU: the operator does.
        self.flags(max_instances=6, group=f"mdev_{TYPE}")
        self.start_vgpu_compute(hostname, "l40s-vfio")
        return self.computes[hostname]

    def usage(self, hostname):
        return self.gpu_providers(hostname)[f"{hostname}_{PROVIDER}"][2]

    def domain_vfs(self, hostname):
        vfs = []
        for guest in self.computes[hostname].driver._host.list_guests(only_running=False):
            vfs += test_vgpu.guest_xml.pci_vfs(test_vgpu.guest_xml.parse(guest.get_xml_desc()))
        return sorted(vfs)

    def typed_vfs(self, hostname):
        """``{VF: type}`` of the host's VFs that have a vGPU type set."""
        return {v.id: v.type_id for v in test_vgpu.discovery.discover(self.kernels[hostname]).vgpus}

    def boot(self):
        self.server = self._create_server(flavor_id=self.flavor, networks="none", host="src")
        vfs = self.domain_vfs("src")
        self.assertEqual(self.UNITS, len(vfs))
        return vfs

    def assert_refused(self, *logged):
        """The guest's migration refused, with ``logged``; nothing changed."""
        on_source = self.boot()
        ex = self.assertRaises(
            client.OpenStackApiException, self._live_migrate, self.server, "completed"
        )
        self.assertIn("NoValidHost", str(ex))
        for text in logged:
            self.assertIn(text, self.stdlog.logger.output)
        self.assertEqual(([], {}), (self.claims("dest"), self.typed_vfs("dest")))
        self.assertEqual(on_source, self.domain_vfs("src"))
        self.assertEqual((self.UNITS, 0), (self.usage("src"), self.usage("dest")))

    def assert_audit_clean(self):
        for host in ("src", "dest"):
            self.assertEqual([], host_audit.audit_of(self, host), host)


class OneVfTests(VendorVfioLiveMigrationTestBase):
    def test_the_guest_moves_to_vfs_typed_on_the_destination(self):
        # A guest on the destination holds the VFs of the source's addresses,
        # so the guest's hostdevs must be rewritten to others.
        occupant = self._create_server(flavor_id=self.flavor, networks="none", host="dest")
        taken = self.domain_vfs("dest")
        on_source = self.boot()
        self.assertEqual(taken, on_source)
        self._live_migrate(self.server, "completed")
        self.assertEqual("dest", self.api.get_server(self.server["id"])["OS-EXT-SRV-ATTR:host"])
        arrived = sorted(set(self.domain_vfs("dest")) - set(taken))
        self.assertEqual(self.UNITS, len(arrived))
        self.assertEqual({vf: TYPE for vf in taken + arrived}, self.typed_vfs("dest"))
        self.assertEqual(
            sorted((vf, "attached") for vf in arrived),
            sorted(self.claims("dest", self.server["id"])),
        )
        # The source's VFs are free: no claim, no domain, kept typed for the
        # next guest ([vgpu] remove_mdevs_on_release is off).
        self.assertEqual(([], []), (self.claims("src"), self.domain_vfs("src")))
        self.assertEqual({vf: TYPE for vf in on_source}, self.typed_vfs("src"))
        self.assertEqual((0, 2 * self.UNITS), (self.usage("src"), self.usage("dest")))
        self.assertEqual(
            sorted((vf, "attached") for vf in taken), sorted(self.claims("dest", occupant["id"]))
        )
        self._run_periodics()
        self.assert_audit_clean()
        other = self._create_server(flavor_id=self.flavor, networks="none", host="src")
        self.assertEqual(
            sorted((vf, "attached") for vf in on_source), sorted(self.claims("src", other["id"]))
        )


class TwoVfsTests(OneVfTests):
    UNITS = 2


class ClaimBeforeTheGuestMovesTests(VendorVfioLiveMigrationTestBase):
    """While the migration runs the destination's VFs are claimed, typed and
    counted, and the XML sent over names them."""

    def _migrate_stub(self, domain, destination, params, flags):
        sent = test_vgpu.guest_xml.pci_vfs(test_vgpu.guest_xml.parse(params["destination_xml"]))
        self.seen = (
            self.claims("dest", self.server["id"]),
            self.typed_vfs("dest"),
            (self.usage("src"), self.usage("dest")),
            sent,
        )
        super()._migrate_stub(domain, destination, params, flags)

    def test_the_destination_claims_and_types_its_vf_first(self):
        self.boot()
        self._live_migrate(self.server, "completed")
        claims, typed, usage, sent = self.seen
        ((claimed, state),) = claims
        self.assertEqual(
            ("migrating_in", {claimed: TYPE}, (1, 1), [claimed]), (state, typed, usage, sent)
        )
        self.assertEqual([claimed], self.domain_vfs("dest"))


class FailedVfMigrationTests(VendorVfioLiveMigrationTestBase):
    """The migration fails after the destination claimed and typed its VF:
    nothing is left there, and the guest keeps its VF on the source."""

    def _migrate_stub(self, domain, destination, params, flags):
        self.during = (self.claims("dest", self.server["id"]), self.typed_vfs("dest"))
        conn = self.src.driver._host.get_connection()
        conn.lookupByUUIDString(self.server["id"]).fail_job()
        self.migrate_stub_ran = True

    def test_a_failed_migration_leaves_nothing_on_the_destination(self):
        on_source = self.boot()
        self._live_migrate(self.server, "failed")
        ((claimed, state),) = self.during[0]
        self.assertEqual(("migrating_in", {claimed: TYPE}), (state, self.during[1]))
        self.assertEqual(
            ([], {}, []), (self.claims("dest"), self.typed_vfs("dest"), self.domain_vfs("dest"))
        )
        self.assertEqual(on_source, self.domain_vfs("src"))
        self.assertEqual([(on_source[0], "attached")], self.claims("src"))
        self.assertEqual((1, 0), (self.usage("src"), self.usage("dest")))
        self._run_periodics()
        self.assert_audit_clean()


class PostCopyTests(VendorVfioLiveMigrationTestBase):
    def test_post_copy_permitted_refuses_before_anything_is_claimed(self):
        self.flags(live_migration_permit_post_copy=True, group="libvirt")
        on_source = self.boot()
        ex = self.assertRaises(
            client.OpenStackApiException, self._live_migrate, self.server, "completed"
        )
        self.assertIn("NoValidHost", str(ex))
        self.assertIn(
            f"its vGPUs on VFs {on_source[0]} (NVIDIA vendor-specific VFIO) cannot "
            "be migrated in post-copy mode",
            self.stdlog.logger.output,
        )
        self.assertEqual(([], {}), (self.claims("dest"), self.typed_vfs("dest")))
        self.assertEqual((1, 0), (self.usage("src"), self.usage("dest")))


class RefusedBeforeAnythingIsClaimedTests(VendorVfioLiveMigrationTestBase):
    """The gates of mdev guests hold for VF guests, and those of VF guests,
    each before the destination claims or types anything."""

    def test_a_kernel_without_vfio_migration(self):
        self.set_kernel("5.15.0-91-generic")
        self.assert_refused("the source host's Linux kernel is 5.15.0, 5.18.0 or later is needed")

    def test_an_old_source_hypervisor(self):
        self.restart_host("src", libvirt_version=8005000, qemu_version=8000000)
        self.assert_refused("for compute service source are too old")

    def test_another_vgpu_manager_on_the_destination(self):
        """The destination reads the source's version from the traits of
        the GPU providers the guest holds there, its own from sysfs."""
        self.kernels["dest"].load_vgpu_manager("570.133.10")
        self.assert_refused(
            "the source host runs NVIDIA vGPU manager 550.127.06 and this host 570.133.10"
        )

    def test_a_source_whose_vgpu_manager_cannot_be_told(self):
        self.kernels["src"].load_vgpu_manager(None)
        self._run_periodics()
        self.assert_refused("the source host's NVIDIA vGPU manager version is unknown")


class TwoVfsOnAnOlderQemuTests(VendorVfioLiveMigrationTestBase):
    """QEMU 8.1 migrates one VFIO device of a guest; each side checks its own."""

    UNITS = 2

    def run_qemu(self, hostname, version):
        self.computes[hostname].driver._host.get_connection().fakeVersion = version

    def test_on_the_source(self):
        self.run_qemu("src", 8001000)
        self.assert_refused(
            "it has 2 VFIO devices (",
            "QEMU migrates several from 8.2.0 "
            "on, each supporting P2P, and the source host's QEMU is 8.1.0",
        )

    def test_on_the_destination(self):
        self.run_qemu("dest", 8001000)
        self.assert_refused("and the destination host's QEMU is 8.1.0")


class AnotherTypeOnTheDestinationTests(VendorVfioLiveMigrationTestBase):
    """The destination's L40S serves L40S-4Q only: an 8Q guest cannot move."""

    DEST_TYPES = "nvidia-1155"
    ENABLED_TYPES = "nvidia-1155,nvidia-1156"

    def test_the_destination_refuses_a_type_it_does_not_serve(self):
        on_source = self.boot()
        ex = self.assertRaises(
            client.OpenStackApiException, self._live_migrate, self.server, "completed"
        )
        self.assertIn("NoValidHost", str(ex))
        self.assertIn(
            f"source mdev types ['{TYPE}'] are not served by this host", self.stdlog.logger.output
        )
        self.assertEqual(([], {}), (self.claims("dest"), self.typed_vfs("dest")))
        self.assertEqual(on_source, self.domain_vfs("src"))
