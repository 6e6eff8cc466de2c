"""nova's persistent mdevs across a takeover and restarts.

nova's own driver creates every mdev through libvirt's node-device API and
defines it persistently (autostart), and nova's start-up starts every
defined mdev that is inactive.  Under vgpu-driver, an mdev removed through
sysfs (a guest deleted with ``remove_mdevs_on_release``, an orphan the
operator removes) or one nothing references (a guest nova deleted) keeps
its definition: a restart must not bring it back, and the mdevs guests hold
must stay.
"""

import os
import unittest

from nova.tests.fixtures import libvirt as fakelibvirt

from tests.functional_nova import test_takeover
from vgpu_driver.sysfs import udev


class PersistentMdevTests(test_takeover.NovaHostTestBase):
    def setUp(self):
        super().setUp()
        self.flags(remove_mdevs_on_release=True, group="vgpu")

    def mdev_of(self, server):
        (mdev,) = self.domain_mdevs_of(server)
        return mdev

    def boot_under_nova(self):
        """Three guests under nova's driver; nova deletes the last one and
        leaves its mdev created and defined, as nova does."""
        self.start_nova_compute()
        servers = [
            self._create_server(flavor_id=self.flavor, networks="none", host="host1")
            for _ in range(3)
        ]
        mdevs = [self.mdev_of(s) for s in servers]
        # nova's own _create_mdev made them: created, defined, autostarted.
        self.assertEqual({m: True for m in mdevs}, self.nodedevs.defined("host1"))
        self._delete_server(servers[2])
        self.assertEqual(sorted(mdevs), sorted(self.kernel_mdevs("host1")))
        return servers[:2], mdevs

    def test_takeover_and_restart_resurrect_no_mdev(self):
        (keep, gone), (keep_mdev, gone_mdev, foreign_mdev) = self.boot_under_nova()

        self.switch_to_vgpu_driver()

        # The guests' definitions are kept; the one of nova's deleted guest is
        # not (its mdev stays in sysfs, an orphan).
        self.assertEqual({keep_mdev: True, gone_mdev: True}, self.nodedevs.defined("host1"))
        self.assertIn(foreign_mdev, self.kernel_mdevs("host1"))
        self.assertEqual([(keep_mdev, "attached")], self.claims_of(keep))
        # Through sysfs: a guest deleted, its mdev removed; the orphan removed.
        self._delete_server(gone)
        reconciler = self.computes["host1"].driver.vgpu.reconciler
        self.assertEqual([foreign_mdev], [o.mdev_uuid for o in reconciler.orphans()])
        self.assertEqual(["removed"], [o.result for o in reconciler.reclaim(reconciler.orphans())])
        self.assertEqual([keep_mdev], list(self.kernel_mdevs("host1")))
        # The next inventory update undefines the removed guest's mdev, so
        # autostart at a host boot cannot bring it back either.
        self._run_periodics(raise_on_error=True)
        self.assertEqual({keep_mdev: True}, self.nodedevs.defined("host1"))

        self.restart_compute_service("host1")

        self.assertEqual([keep_mdev], list(self.kernel_mdevs("host1")))
        self.assertEqual({keep_mdev: True}, self.nodedevs.defined("host1"))
        self.assertEqual([(keep_mdev, "attached")], self.claims_of(keep))
        self.assertEqual(keep_mdev, self.mdev_of(keep))
        self.assertEqual("ACTIVE", self.api.get_server(keep["id"])["status"])
        self.assertEqual({test_takeover.GPU_PROVIDER: (10, 0, 1)}, self.gpu_providers("host1"))

    def test_a_claimed_mdev_gone_from_sysfs_is_started_again(self):
        (keep, _other), (keep_mdev, other_mdev, foreign_mdev) = self.boot_under_nova()
        self.switch_to_vgpu_driver()
        self.kernel.remove_mdev(keep_mdev)

        self.restart_compute_service("host1")

        # Back with its UUID; the undefined orphan stays only in sysfs.
        self.assertEqual(
            sorted([keep_mdev, other_mdev, foreign_mdev]), sorted(self.kernel_mdevs("host1"))
        )
        self.assertEqual({keep_mdev: True, other_mdev: True}, self.nodedevs.defined("host1"))
        self.assertEqual([(keep_mdev, "attached")], self.claims_of(keep))
        self.assertIn(f"Started defined mdev {keep_mdev}", self.stdlog.logger.output)

    def test_a_late_vf_does_not_stop_the_start(self):
        (keep, _other), (keep_mdev, _other_mdev, _foreign) = self.boot_under_nova()
        self.switch_to_vgpu_driver()
        self.kernel.reboot()  # no mdevs, the A100's VFs not enabled yet

        self.restart_compute_service("host1")

        self.assertEqual([], list(self.kernel_mdevs("host1")))
        self.assertIn(f"Defined mdev {keep_mdev} does not start yet", self.stdlog.logger.output)
        self.assertEqual([(keep_mdev, "attached")], self.claims_of(keep))
        self.assertIn(keep_mdev, self.nodedevs.defined("host1"))


@unittest.skipIf(os.geteuid() != 0, "only root may send on udev's netlink group")
class EventDrivenSettleTests(test_takeover.NovaHostTestBase):
    """With udev telling what changed, an update lists libvirt's mdev
    definitions only when something can have left one nothing wants."""

    mdev_of = PersistentMdevTests.mdev_of
    boot_under_nova = PersistentMdevTests.boot_under_nova

    def setUp(self):
        super().setUp()
        self.flags(remove_mdevs_on_release=True, hotplug_events="udev", group="vgpu")

    def count_mdev_listings(self, driver):
        """The mdev listings made on the driver's connection from now on
        (each call goes through to the connection's own)."""
        conn = driver._host.get_connection()
        listings, real = [], conn.listAllDevices

        def listing(flags=0):
            if flags & fakelibvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV:
                listings.append(flags)
            return real(flags)

        conn.listAllDevices = listing
        self.addCleanup(vars(conn).pop, "listAllDevices", None)
        return listings

    def test_a_definition_goes_at_the_update_after_its_mdev_is_removed(self):
        (_keep, gone), (keep_mdev, gone_mdev, foreign_mdev) = self.boot_under_nova()
        self.kernel.enable_uevents()
        self.switch_to_vgpu_driver()
        driver = self.computes["host1"].driver
        self.addCleanup(driver.vgpu.close)
        self.assertIsInstance(driver.vgpu.changes, udev.UdevMonitor)
        listings = self.count_mdev_listings(driver)

        # Nothing changed since the start-up's settle: nothing is listed.
        self._run_periodics(raise_on_error=True)
        self.assertEqual([], listings)
        self.assertEqual({keep_mdev: True, gone_mdev: True}, self.nodedevs.defined("host1"))

        # The guest goes, its mdev removed through sysfs (udev tells): the
        # next update lists the definitions and undefines that one.
        self._delete_server(gone)
        self.assertEqual(sorted([keep_mdev, foreign_mdev]), sorted(self.kernel_mdevs("host1")))
        self._run_periodics(raise_on_error=True)
        self.assertEqual({keep_mdev: True}, self.nodedevs.defined("host1"))
        self.assertTrue(listings)

        # And quiet again after that.
        del listings[:]
        self._run_periodics(raise_on_error=True)
        self.assertEqual([], listings)
