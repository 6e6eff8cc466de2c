"""nova-compute killed while libvirt defines the domain of a resume, a
rescue, an unrescue, a resize's finish, a revert's finish or an unshelve
(:mod:`tests.functional_nova.crash_points`), then started again as systemd
would.

nova's ``init_host`` resumes none of these: it leaves the task state, and
the operator recovers the guest by resetting its state and hard-rebooting
it.  What the start settles: the guest keeps its vGPU (its domain still
uses it, or its claim holds it while nova is mid-operation), the audit
explains Placement's allocation, and the recovery gives the guest the same
vGPU; a guest nova gives up on loses its claim after the grace.
"""

import os

import fixtures
from nova.virt.libvirt import utils as libvirt_utils

from tests.functional_nova import crash_points
from tests.functional_nova import host_audit
from tests.functional_nova import test_crash_recovery
from tests.functional_nova import test_fault_outcomes
from tests.functional_nova import test_suspend
from vgpu_driver import claims


class RecoveryMixin(test_crash_recovery.UnusedClaimTestsMixin):
    def recover(self, server):
        """What nova tells the operator: reset the state, hard-reboot."""
        self.api.post_server_action(server["id"], {"os-resetState": {"state": "active"}})
        server = self.act(server, {"reboot": {"type": "HARD"}})
        self.assertEqual("ACTIVE", server["status"], server.get("fault"))
        return server

    def assert_settled(self, server, status, task_state, host, holds):
        """What the start left, unchanged by the host reconciler's pass."""
        for _ in range(2):
            found = self.api.get_server(server["id"])
            self.assertEqual(
                (status, task_state, host),
                (found["status"], found["OS-EXT-STS:task_state"], found["OS-EXT-SRV-ATTR:host"]),
            )
            self.assertEqual(holds, self.holds(found))
            self.assertEqual([], host_audit.audit_of(self, host))
            self.after_unused_grace()


class OneHostCrashTests(RecoveryMixin, test_crash_recovery.CrashTestBase):
    """Resume, rescue and unrescue redefine the guest's existing domain
    (suspended with its saved memory, or stopped by ``_destroy``): killed
    in that define, the guest keeps its domain, claim and vGPU, and nova
    keeps the task state."""

    def setUp(self):
        super().setUp()
        self.useFixture(test_suspend.LiveMdevHotplug(lambda: set(self.kernel_mdevs("host1"))))

    def boot(self, *args, **kwargs):
        server = super().boot(*args, **kwargs)
        # Where rescue writes unrescue.xml; fake image creation never made it.
        os.makedirs(libvirt_utils.get_instance_path(self.instance(server)), exist_ok=True)
        return server

    def killed_and_recovered(self, server, operation, status, task_state):
        mdevs = self.domains("host1")[server["id"]]
        self.killed_while_defining(server, operation)
        self.restart("host1")
        self.assert_settled(
            server, status, task_state, "host1", (mdevs, [(mdevs[0], claims.ATTACHED)])
        )
        server = self.recover(server)
        self.assertEqual((mdevs, [(mdevs[0], claims.ATTACHED)]), self.holds(server))
        self.assert_usage_matches_holders()
        self.delete_all()
        self.assert_nothing_left()

    def test_killed_in_a_resume(self):
        server = self.act(self.boot(), {"suspend": None})
        self.assertEqual("SUSPENDED", server["status"])
        self.killed_and_recovered(server, "resume", "SUSPENDED", "resuming")

    def test_killed_in_a_rescue(self):
        self.killed_and_recovered(self.boot(), "rescue", "ACTIVE", "rescuing")

    def test_killed_in_an_unrescue(self):
        server = self.act(self.boot(), {"rescue": {}})
        self.assertEqual("RESCUE", server["status"])
        self.killed_and_recovered(server, "unrescue", "RESCUE", "unrescuing")


class UnshelveCrashTests(RecoveryMixin, test_crash_recovery.CrashTestBase):
    """Killed in an unshelve's spawn: the guest stays offloaded with the
    task state ``spawning``, its new claim held (nova is mid-operation);
    once the operator sets it to ERROR the claim is released after the
    grace, and Placement's allocation is the server's until it goes."""

    def test_killed_in_an_unshelve(self):
        server = self._wait_for_state_change(
            self.act(self.boot(), {"shelve": None}), "SHELVED_OFFLOADED"
        )
        self.assertEqual(
            "host1",
            crash_points.kill_in_cast(
                self.computes,
                "unshelve_instance",
                lambda: self.api.post_server_action(server["id"], {"unshelve": None}),
            ),
        )
        self.restart("host1")
        held = self.claims("host1", server)
        self.assertEqual([claims.CLAIMED], [state for _vgpu, state in held])
        for _ in range(2):
            found = self.api.get_server(server["id"])
            self.assertEqual(
                ("SHELVED_OFFLOADED", "spawning"), (found["status"], found["OS-EXT-STS:task_state"])
            )
            self.assertEqual(held, self.claims("host1", server))
            self.assertEqual([], host_audit.audit_of(self, "host1"))
            self.after_unused_grace()
        self.api.post_server_action(server["id"], {"os-resetState": {"state": "error"}})
        self.after_unused_grace()
        self.assertEqual(([], {}), (self.claims("host1"), self.vgpus("host1")))
        self.delete_all()
        self.assert_nothing_left()


class MoveCrashTests(RecoveryMixin, test_crash_recovery.TwoHostsTestBase):
    def test_killed_in_a_resizes_finish_on_the_destination(self):
        """nova leaves the guest resizing on the destination (migration
        ``post-migrating``): the destination keeps the claim it made, the
        source its domain; the recovery defines the guest with that claim."""
        server = self.boot(flavor=self.a100_typed)
        source = self.domains("host1")[server["id"]]
        self.assertEqual(
            "host2",
            crash_points.kill_in_cast(
                self.computes,
                "finish_resize",
                lambda: self.api.post_server_action(
                    server["id"], {"resize": {"flavorRef": self.any_type}}
                ),
            ),
        )
        self.restart("host2")
        vfs = [vgpu for vgpu, _state in self.claims("host2", server)]
        self.assertEqual(1, len(vfs))
        self.assert_settled(
            server, "RESIZE", "resize_finish", "host2", (None, [(vfs[0], claims.CLAIMED)])
        )
        self.assertEqual([(source[0], claims.ATTACHED)], self.claims("host1", server))
        server = self.recover(server)
        self.assertEqual((vfs, [(vfs[0], claims.ATTACHED)]), self.holds(server))
        # nova never finishes that migration (its record stays
        # post-migrating), and the guest runs on the destination with no
        # task: the source's domain and claim are nobody's after the grace.
        self.flags(claim_grace=0, group="vgpu")
        self.after_unused_grace()
        self.assertEqual([], self.claims("host1", server))
        self.assertNotIn(server["id"], self.domains("host1"))
        self.assertEqual((vfs, [(vfs[0], claims.ATTACHED)]), self.holds(server))
        # The deleted guest's vGPUs go too: its migration record, left
        # unfinished, is no move under way.
        self.delete_all()
        self.assert_nothing_left()

    def test_killed_in_a_reverts_finish_on_the_source(self):
        """The revert's define replaces the source's domain, which keeps
        its vGPU: the recovery defines the guest with it again.  A revert
        finished there first: the kill is the second one's."""
        server = self.boot(flavor=self.a100_typed)
        mdevs = self.domains("host1")[server["id"]]
        server = self.act(server, {"resize": {"flavorRef": self.any_type}})
        server = self.act(server, {"revertResize": None})
        self.assertEqual(("ACTIVE", "host1"), (server["status"], server["OS-EXT-SRV-ATTR:host"]))
        server = self.act(server, {"resize": {"flavorRef": self.any_type}})
        self.assertEqual("VERIFY_RESIZE", server["status"])
        self.assertEqual(
            "host1",
            crash_points.kill_in_cast(
                self.computes,
                "finish_revert_resize",
                lambda: self.api.post_server_action(server["id"], {"revertResize": None}),
            ),
        )
        self.restart("host1")
        self.assert_settled(
            server,
            "REVERT_RESIZE",
            "resize_reverting",
            "host1",
            (mdevs, [(mdevs[0], claims.ATTACHED)]),
        )
        self.assertEqual(([], {}), (self.claims("host2"), self.vgpus("host2")))
        server = self.recover(server)
        self.assertEqual((mdevs, [(mdevs[0], claims.ATTACHED)]), self.holds(server))
        self.assert_usage_matches_holders()
        self.delete_all()
        self.assert_nothing_left()


class FailedBootDefineTests(test_crash_recovery.CrashTestBase):
    """A boot whose define raises on the only host that fits: the driver
    releases its claim and re-raises, nova deletes the instance's
    allocation (``force=True``) before it reschedules, finds no other host,
    and sets the server to ERROR with no host; with the compute restarted
    meanwhile and the server deleted, no claim, vGPU or allocation is left.
    An allocation left so is one whose delete nova's reschedule failed to
    send (Placement failing): nova's, for ``nova-manage placement audit``."""

    def test_a_boot_whose_define_raised_leaves_nothing_once_deleted(self):
        with fixtures.MonkeyPatch(
            "nova.virt.libvirt.host.Host.write_instance_config",
            test_fault_outcomes._always_fail(RuntimeError("injected")),
        ):
            server = self._create_server(
                flavor_id=self.a100, networks="none", host="host1", expected_state="ERROR"
            )
        self.assertIn("Exhausted all hosts", server["fault"]["message"])
        self.assertEqual(([], {}), (self.claims("host1"), self.vgpus("host1")))
        self.assertEqual({}, self.placement.get(f"/allocations/{server['id']}").body["allocations"])
        self.restart("host1")
        self.later()
        self.assertEqual({}, self.placement.get(f"/allocations/{server['id']}").body["allocations"])
        self.delete_all()
        self.assert_nothing_left()
        for rp in self.placement.get("/resource_providers").body["resource_providers"]:
            usages = self.placement.get(f"/resource_providers/{rp['uuid']}/usages").body["usages"]
            self.assertEqual({}, {rc: n for rc, n in usages.items() if n}, rp["name"])
