"""Live migration of vGPU guests between two LibvirtVGPUDriver computes.

The destination claims its mdevs at ``check_source_migrate_data_at_dest``
(journal state ``migrating_in``), nova rewrites the domain XML with that
mapping, and post-migration turns the claims into ``attached`` ones while
the source lets its mdevs go.  Fake libvirt plays the migration itself
(nova's ``LibvirtMigrationMixin``); the hosts' sysfs is our fake kernel.
"""

import os
import threading

import fixtures
from nova.tests.fixtures import libvirt as fakelibvirt
from nova.tests.functional.api import client
from nova.tests.functional.libvirt import base

from tests.functional_nova import test_vgpu

GPU_NAME = "0000_41_00_0"  # the A100's provider is <host>_pci_<this>
# libvirt 8.6: the first that migrates mdevs; QEMU 8.2: the first that
# migrates a guest with several VFIO devices (8.1 migrates one).
MDEV_MIGRATION_LIBVIRT = 8006000
MDEV_MIGRATION_QEMU = 8002000
MDEV_MIGRATION_KERNEL = "5.18.0-1-generic"  # VFIO migration's v2 protocol


class LiveMigrationTestBase(base.LibvirtMigrationMixin, test_vgpu.VGPUDriverTestBase):
    SOURCE_TYPES = DEST_TYPES = "nvidia-468"  # A100-4C

    def setUp(self):
        super().setUp()
        # Every compute started here, restarts included, has versions that
        # migrate mdevs unless a test says otherwise.
        self.useFixture(
            fixtures.MonkeyPatch(
                "nova.tests.fixtures.libvirt.FAKE_LIBVIRT_VERSION", MDEV_MIGRATION_LIBVIRT
            )
        )
        self.useFixture(
            fixtures.MonkeyPatch(
                "nova.tests.fixtures.libvirt.FAKE_QEMU_VERSION", MDEV_MIGRATION_QEMU
            )
        )
        self.set_kernel(MDEV_MIGRATION_KERNEL)
        self.src = self.start_host("src", self.SOURCE_TYPES)
        self.dest = self.start_host("dest", self.DEST_TYPES)
        self.flavor = self._create_flavor(
            memory_mb=512, vcpu=1, disk=1, ephemeral=0, extra_spec={"resources:VGPU": "1"}
        )

    def set_kernel(self, release):
        """The kernel release both hosts report (nova's fixture fakes it)."""
        uname = self.libvirt.mock_uname.return_value
        self.libvirt.mock_uname.return_value = uname._replace(release=release)

    def start_host(self, hostname, enabled_types):
        self.flags(enabled_mdev_types=enabled_types, group="devices")
        self.start_vgpu_compute(hostname, "a100-sriov")
        return self.computes[hostname]

    def restart_host(self, hostname, **kwargs):
        """Restart a compute service on its own fake host and state."""
        # The computes share one CONF: point [vgpu] back at this host's.
        self.flags(
            sysfs_root=os.path.join(self.tmp, hostname, "sys"),
            state_dir=os.path.join(self.tmp, hostname, "state"),
            group="vgpu",
        )
        if kwargs:
            kwargs.update(
                keep_hypervisor_state=False,
                pci_info=fakelibvirt.HostPCIDevicesInfo(num_pci=0, num_pfs=0, num_vfs=0),
            )
        service = self.restart_compute_service(hostname, **kwargs)
        setattr(self, hostname, service)
        return service

    def usage(self, hostname):
        return self.gpu_providers(hostname)[f"{hostname}_pci_{GPU_NAME}"][2]

    def claims(self, hostname, instance=None):
        return [
            (c.mdev_uuid, c.state)
            for c in self.computes[hostname].driver.vgpu.journal.claims(instance)
        ]

    def sysfs_mdevs(self, hostname):
        return set(self.kernel_mdevs(hostname))

    def assert_usage_matches_domains(self, hostname):
        """Placement's usage on the host's GPU equals the mdevs its domains use."""
        self.assertEqual(len(self.domain_mdevs(hostname)), self.usage(hostname))

    def boot(self):
        self.server = self._create_server(flavor_id=self.flavor, networks="none", host="src")
        (mdev,) = self.domain_mdevs("src")
        return mdev

    def live_migrate_asking_nothing_meanwhile(self, server, migration_status):
        """nova's ``_live_migrate``, but no API request from this thread
        while ``_migrate_stub`` runs (the stub calls ``stub_done.set()``).

        A stub that runs nova's periodic tasks holds a read lock of nova's
        cell database fixture and waits for workers whose read locks queue
        behind the write lock a request switching cells waits for: on
        eventlet the lane hung there, every greenthread waiting.
        """
        self.stub_done = threading.Event()
        self.api.post_server_action(
            server["id"], {"os-migrateLive": {"host": None, "block_migration": "auto"}}
        )
        self.assertTrue(self.stub_done.wait(120), "the migration never reached its stub")
        self._wait_for_migration_status(server, [migration_status])
        return self._wait_for_state_change(server, "ACTIVE")


class LiveMigrationTests(LiveMigrationTestBase):
    def test_live_migrate_server(self):
        source_mdev = self.boot()
        self._live_migrate(self.server, "completed")
        (dest_mdev,) = self.domain_mdevs("dest")
        self.assertEqual("dest", self.api.get_server(self.server["id"])["OS-EXT-SRV-ATTR:host"])
        self.assertEqual([(dest_mdev, "attached")], self.claims("dest", self.server["id"]))
        self.assertIn(dest_mdev, self.sysfs_mdevs("dest"))
        # The source lets the guest's mdev go: no claim, free for the next guest.
        self.assertEqual([], self.claims("src"))
        self.assertEqual((0, 1), (self.usage("src"), self.usage("dest")))
        self.assert_usage_matches_domains("dest")
        other = self._create_server(flavor_id=self.flavor, networks="none", host="src")
        self.assertEqual([(source_mdev, "attached")], self.claims("src", other["id"]))


class ClaimDuringLiveMigrationTests(LiveMigrationTestBase):
    """While the migration runs, the destination's mdev is claimed and counted
    in Placement, and the XML sent over names it."""

    def _migrate_stub(self, domain, destination, params, flags):
        self.seen = (
            self.claims("dest", self.server["id"]),
            (self.usage("src"), self.usage("dest")),
            test_vgpu.guest_xml.mdev_uuids(test_vgpu.guest_xml.parse(params["destination_xml"])),
        )
        super()._migrate_stub(domain, destination, params, flags)

    def test_destination_claim_is_taken_before_the_guest_moves(self):
        self.boot()
        self._live_migrate(self.server, "completed")
        claims, usage, sent = self.seen
        ((claimed, state),) = claims
        self.assertEqual("migrating_in", state)
        self.assertEqual([claimed], sent)
        self.assertEqual((1, 1), usage)
        self.assertEqual([claimed], self.domain_mdevs("dest"))


class UnsupportedTypeTests(LiveMigrationTestBase):
    """The destination serves A100-5C only: the A100-4C guest cannot move."""

    DEST_TYPES = "nvidia-469"

    def test_live_migration_refused_for_a_type_the_destination_does_not_serve(self):
        source_mdev = self.boot()
        ex = self.assertRaises(
            client.OpenStackApiException, self._live_migrate, self.server, "completed"
        )
        self.assertEqual(500, ex.response.status_code)
        self.assertIn("NoValidHost", str(ex))
        self.assertIn(
            "source mdev types ['nvidia-468'] are not served by this host",
            self.stdlog.logger.output,
        )
        self.assertEqual([source_mdev], self.domain_mdevs("src"))
        self.assertEqual([], self.claims("dest"))
        self.assertEqual(set(), self.sysfs_mdevs("dest"))
        self.assertEqual((1, 0), (self.usage("src"), self.usage("dest")))


class KernelGateTests(LiveMigrationTestBase):
    """Hosts whose kernel cannot migrate VFIO devices refuse a vGPU guest
    (nova checks only libvirt's and QEMU's versions)."""

    def test_live_migration_refused_on_a_kernel_without_vfio_migration(self):
        source_mdev = self.boot()
        self.set_kernel("5.15.0-91-generic")
        ex = self.assertRaises(
            client.OpenStackApiException, self._live_migrate, self.server, "completed"
        )
        self.assertIn("NoValidHost", str(ex))
        self.assertIn(
            "the source host's Linux kernel is 5.15.0, 5.18.0 or later is needed",
            self.stdlog.logger.output,
        )
        self.assertEqual([source_mdev], self.domain_mdevs("src"))
        self.assertEqual([], self.claims("dest"))
        self.assertEqual((1, 0), (self.usage("src"), self.usage("dest")))

    def test_post_copy_is_warned_about(self):
        self.flags(live_migration_permit_post_copy=True, group="libvirt")
        self.boot()
        self._live_migrate(self.server, "completed")
        self.assertIn(
            "QEMU refuses to migrate a guest with a vGPU (VFIO device) in post-copy mode",
            self.stdlog.logger.output,
        )


class OldHypervisorTests(LiveMigrationTestBase):
    """libvirt 8.5 / QEMU 8.0 on one side: refused before anything is claimed,
    the refusal naming that side."""

    def test_live_migration_refused_on_an_old_source(self):
        self.restart_host("src", libvirt_version=8005000, qemu_version=8000000)
        self.assert_refused("source")

    def test_live_migration_refused_on_an_old_destination(self):
        # Else nova's scheduler-side check refuses first, without looking at mdevs.
        self.flags(skip_hypervisor_version_check_on_lm=True, group="workarounds")
        self.restart_host("dest", libvirt_version=8005000, qemu_version=8000000)
        self.assert_refused("target")

    def assert_refused(self, side):
        self.boot()
        ex = self.assertRaises(
            client.OpenStackApiException, self._live_migrate, self.server, "completed"
        )
        self.assertIn("NoValidHost", str(ex))
        self.assertIn(f"for compute service {side} are too old", self.stdlog.logger.output)
        self.assertEqual([], self.claims("dest"))
        self.assertEqual((1, 0), (self.usage("src"), self.usage("dest")))


class FailedLiveMigrationTests(LiveMigrationTestBase):
    """The migration fails once the destination has claimed and created its
    mdev: the rollback drops the claim and removes that mdev, nothing else."""

    def _migrate_stub(self, domain, destination, params, flags):
        self.during = (
            self.claims("dest", self.server["id"]),
            (self.usage("src"), self.usage("dest")),
        )
        # The periodic update must not free the destination's claim meanwhile.
        self._run_periodics()
        self.during_after_periodics = (self.usage("src"), self.usage("dest"))
        conn = self.src.driver._host.get_connection()
        conn.lookupByUUIDString(self.server["id"]).fail_job()
        self.migrate_stub_ran = True
        self.stub_done.set()

    def test_rollback_frees_the_destination(self):
        source_mdev = self.boot()
        self.live_migrate_asking_nothing_meanwhile(self.server, "failed")
        ((claimed, state),) = self.during[0]
        self.assertEqual("migrating_in", state)
        self.assertEqual((1, 1), self.during[1])
        self.assertEqual((1, 1), self.during_after_periodics)
        self.assertEqual([], self.claims("dest"))
        self.assertNotIn(claimed, self.sysfs_mdevs("dest"))
        self.assertEqual([source_mdev], self.domain_mdevs("src"))
        self.assertEqual([(source_mdev, "attached")], self.claims("src"))
        self.assertEqual((1, 0), (self.usage("src"), self.usage("dest")))
        self.assert_usage_matches_domains("src")


class ForgottenRollbackTests(LiveMigrationTestBase):
    """The migration fails and its rollback never reaches the destination
    (a lost RPC): nova's record says the migration is over, so the
    destination's reconciler rolls it back at its next periodic update,
    instead of keeping the vGPU reserved for migration_claim_timeout."""

    def _migrate_stub(self, domain, destination, params, flags):
        # While nova has the migration in progress, the claim stays, even
        # past claim_grace.
        self.flags(claim_grace=0, group="vgpu")
        self._run_periodics()
        self.during = self.claims("dest", self.server["id"])
        self.dest.driver._rollback_incoming = lambda instance: None  # the lost RPC
        conn = self.src.driver._host.get_connection()
        conn.lookupByUUIDString(self.server["id"]).fail_job()
        self.migrate_stub_ran = True
        self.stub_done.set()

    def test_a_lost_rollback_is_done_by_the_destination(self):
        self.boot()
        self.live_migrate_asking_nothing_meanwhile(self.server, "failed")
        ((claimed, state),) = self.during
        self.assertEqual("migrating_in", state)
        self.assertEqual([(claimed, "migrating_in")], self.claims("dest"))
        del self.dest.driver._rollback_incoming
        self._run_periodics()
        self.assertEqual([], self.claims("dest"))
        self.assertNotIn(claimed, self.sysfs_mdevs("dest"))
        self.assertEqual((1, 0), (self.usage("src"), self.usage("dest")))
        self.assertIn("its rollback never reached this host", self.stdlog.logger.output)


class RestartDuringLiveMigrationTests(LiveMigrationTestBase):
    """nova keeps the destination's reservation in memory: a restart of the
    destination compute mid-migration forgets it.  Ours is journalled."""

    def _migrate_stub(self, domain, destination, params, flags):
        before = self.claims("dest", self.server["id"])
        self.restart_host("dest")
        self.after_restart = (
            before,
            self.claims("dest", self.server["id"]),
            self.sysfs_mdevs("dest"),
        )
        # A boot on the restarted destination must not get the claimed mdev.
        self.intruder = self._create_server(flavor_id=self.flavor, networks="none", host="dest")
        self.dest.driver._host.get_connection().createXML(params["destination_xml"], 0)
        conn = self.src.driver._host.get_connection()
        conn.lookupByUUIDString(self.server["id"]).complete_job()
        self.migrate_stub_ran = True

    def test_destination_restart_keeps_the_claim(self):
        self.boot()
        self._live_migrate(self.server, "completed")
        before, after, present = self.after_restart
        ((claimed, state),) = before
        self.assertEqual(before, after)
        self.assertEqual("migrating_in", state)
        self.assertIn(claimed, present)
        self.assertEqual([(claimed, "attached")], self.claims("dest", self.server["id"]))
        ((intruder_mdev, _state),) = self.claims("dest", self.intruder["id"])
        self.assertNotEqual(claimed, intruder_mdev)
        self.assertEqual(sorted([claimed, intruder_mdev]), sorted(self.domain_mdevs("dest")))
        self.assertEqual((0, 2), (self.usage("src"), self.usage("dest")))
