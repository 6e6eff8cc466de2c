"""nova-compute killed in the middle of a vGPU operation, then started again
(:mod:`tests.functional_nova.crash_points`), and what such crashes and
failed steps leave: claims no domain uses, a guest a failed resize left in
ERROR.  nova's ``init_host`` resumes what it finds interrupted (a hard
reboot, a power-on); the service must start whatever our allocation says,
and the guest get its vGPU back.
"""

import os

import fixtures
from nova import context
from nova import objects
from nova.compute import task_states
from nova.compute import vm_states

from tests.functional_nova import crash_points
from tests.functional_nova import host_audit
from tests.functional_nova import test_fault_outcomes
from vgpu_driver import claims
from vgpu_driver import driver as core

A100, A100_TYPE = "0000:41:00.0", "nvidia-468"  # A100-4C, mdevs on its VFs


class CrashTestBase(test_fault_outcomes.FaultOutcomeTestBase):
    HOSTS = {"host1": ("a100-sriov",)}
    ENABLED_TYPES = A100_TYPE

    def setUp(self):
        super().setUp()
        self.ctxt = context.get_admin_context()
        self.a100 = self._create_flavor(
            name="a100",
            memory_mb=512,
            vcpu=1,
            disk=1,
            ephemeral=0,
            extra_spec={"resources:VGPU": "1"},
        )

    def boot(self, host="host1", flavor=None):
        return self._create_server(flavor_id=flavor or self.a100, networks="none", host=host)

    def instance(self, server):
        return objects.Instance.get_by_uuid(self.ctxt, server["id"], expected_attrs=["flavor"])

    def killed_while_defining(self, server, operation):
        """Run ``operation`` on the server's instance as nova's API casts
        it; its compute is killed when libvirt defines the domain."""
        instance = self.instance(server)
        self.assertTrue(
            crash_points.kill_during(
                self.computes[instance.host].manager, self.ctxt, instance, operation
            )
        )

    def restart(self, hostname):
        """nova-compute started again on its host's sysfs, state and libvirt."""
        self.flags(
            sysfs_root=os.path.join(self.tmp, hostname, "sys"),
            state_dir=os.path.join(self.tmp, hostname, "state"),
            group="vgpu",
        )
        return self.restart_compute_service(hostname)

    def holds(self, server):
        """``(vGPUs its domain uses, [(claim, state)])`` on its host."""
        server = self.api.get_server(server["id"])
        host = server["OS-EXT-SRV-ATTR:host"]
        return self.domains(host).get(server["id"]), self.claims(host, server)


class HardRebootCrashTests(CrashTestBase):
    """Killed while a hard reboot defines the guest again.

    nova's ``init_host`` resumes the reboot before the first inventory
    update.  The allocation then found no map of this host's GPU providers
    (built by that update) and refused the A100's own provider as "not a GPU
    of this host": nova-compute failed to start, at every restart.
    """

    def test_the_compute_starts_and_the_guest_gets_its_vgpu_again(self):
        server = self.boot()
        mdevs = self.domains("host1")[server["id"]]
        self.killed_while_defining(server, "hard_reboot")
        self.assertEqual((None, [(mdevs[0], claims.ATTACHED)]), self.holds(server))
        self.restart("host1")
        server = self._wait_for_state_change(server, "ACTIVE")
        self.assertEqual((mdevs, [(mdevs[0], claims.ATTACHED)]), self.holds(server))
        self.assertIn(mdevs[0], self.vgpus("host1"))
        self.assert_usage_matches_holders()
        self.delete_all()
        self.assert_nothing_left()

    def test_a_guest_that_cannot_have_its_vgpu_ends_in_error_and_the_compute_starts(self):
        """Its allocation is gone meanwhile (an operator deleted it): the
        resumed reboot would define no guest without its vGPU, and nova
        would have stopped the service with it."""
        server = self.boot()
        self.killed_while_defining(server, "hard_reboot")
        self.placement.delete(f"/allocations/{server['id']}")
        self.restart("host1")
        server = self._wait_for_state_change(server, "ERROR")
        self.assertIsNone(server["OS-EXT-STS:task_state"])
        self.assertIn(
            "gets no vGPU here: the flavor asks for 1 VGPU, the allocation holds 0",
            server["fault"]["message"],
        )
        self.assertEqual((None, []), self.holds(server))
        # The service runs: it boots the next guest.
        self.assertEqual("ACTIVE", self.boot()["status"])


class PowerOnCrashTests(CrashTestBase):
    """Killed while an ``os-start`` (nova's power-on, a hard reboot) defines
    the stopped guest again.

    The guest came back SHUTOFF with no domain and no vGPU while Placement
    still counted its VGPU (``audit``: allocation-without-mdev).  A stopped
    guest keeps its claim and vGPU, domain or not, as it does when nothing
    crashed: nova's start-up resumes the start and the guest runs with the
    same vGPU; if that start fails too, the guest stays stopped holding
    both, and ``audit`` finds no drift: the claim holds what Placement
    allocates, for the guest's next start.
    """

    def stopped_and_killed_in_its_start(self):
        server = self.boot()
        mdevs = self.domains("host1")[server["id"]]
        server = self.act(server, {"os-stop": None})
        self.assertEqual("SHUTOFF", server["status"])
        self.killed_while_defining(server, "start")
        return server, mdevs

    def test_the_start_resumes_with_the_same_vgpu(self):
        server, mdevs = self.stopped_and_killed_in_its_start()
        self.restart("host1")
        server = self._wait_for_state_change(server, "ACTIVE")
        self.assertEqual((mdevs, [(mdevs[0], claims.ATTACHED)]), self.holds(server))
        self.assertEqual([], host_audit.audit_of(self, "host1"))
        self.delete_all()
        self.assert_nothing_left()

    def test_a_guest_left_stopped_keeps_its_claim_and_vgpu_for_its_next_start(self):
        server, mdevs = self.stopped_and_killed_in_its_start()
        # nova's resumed start fails too: the guest stays stopped.
        with fixtures.MonkeyPatch(
            "nova.virt.libvirt.host.Host.write_instance_config",
            test_fault_outcomes._always_fail(RuntimeError("injected")),
        ):
            self.restart("host1")
        server = self._wait_for_state_change(server, "SHUTOFF")
        self.assertEqual((None, [(mdevs[0], claims.ATTACHED)]), self.holds(server))
        self.assertIn(mdevs[0], self.vgpus("host1"))
        self.assertEqual([], host_audit.audit_of(self, "host1"))
        self.flags(unused_claim_grace=0, group="vgpu")
        self._run_periodics()
        self.assertEqual((None, [(mdevs[0], claims.ATTACHED)]), self.holds(server))
        server = self.act(server, {"os-start": None})
        self.assertEqual("ACTIVE", server["status"])
        self.assertEqual((mdevs, [(mdevs[0], claims.ATTACHED)]), self.holds(server))
        self.delete_all()
        self.assert_nothing_left()


def _raise_after(real, error):
    """``real`` (a method), raising ``error`` once it returned, the first time."""
    calls = []

    def method(this, *args, **kwargs):
        result = real(this, *args, **kwargs)
        if not calls:
            calls.append(1)
            raise error
        return result

    return method


class TwoHostsTestBase(CrashTestBase):
    """An A100 host and an L40S host; an A100 flavor and one of any type."""

    HOSTS = {"host1": ("a100-sriov",), "host2": ("l40s-vfio",)}
    ENABLED_TYPES = f"{A100_TYPE},{test_fault_outcomes.L40S_TYPE}"

    def configure(self):
        self.flags(device_addresses=[A100], group=f"mdev_{A100_TYPE}")
        # sysfs does not say how many L40S-4Q fit on the GPU: the operator does.
        self.flags(
            device_addresses=[test_fault_outcomes.L40S],
            max_instances=12,
            group=f"mdev_{test_fault_outcomes.L40S_TYPE}",
        )

    def setUp(self):
        super().setUp()
        self.a100_typed = self.flavor("a100-4c", "CUSTOM_VGPU_NVIDIA_A100_4C")
        self.any_type = self._create_flavor(
            name="any-vgpu",
            memory_mb=1024,
            vcpu=1,
            disk=1,
            ephemeral=0,
            extra_spec={"resources:VGPU": "1"},
        )

    def resize_failing_after_allocation(self, server, flavor):
        """A resize whose finish raises right after the destination's
        allocation (nova's handling runs: the old flavor put back, ERROR)."""
        with fixtures.MonkeyPatch(
            "vgpu_driver.driver.VGPUDriver.allocate",
            _raise_after(core.VGPUDriver.allocate, RuntimeError("injected")),
        ):
            return self.act(server, {"resize": {"flavorRef": flavor}})


class ResizeCrashTests(TwoHostsTestBase):
    """An A100 guest resized to a flavor asking only ``VGPU:1`` (any type)
    lands on the L40S host, whose finish fails right after the allocation.

    nova puts the guest's A100 flavor back, leaves it in ERROR on the L40S
    host holding the new flavor's allocation there, and says a hard reboot
    may recover it.  The driver judged that allocation by the A100 flavor
    alone and refused the reboot: "a type the flavor does not ask for".
    The allocation is the resize's, made for its new flavor, which asks for
    any type: the guest is defined with it.
    """

    def test_a_hard_reboot_recovers_the_guest_with_the_resizes_vgpu(self):
        server = self.boot(flavor=self.a100_typed)
        server = self.resize_failing_after_allocation(server, self.any_type)
        self.assertEqual(
            ("ERROR", "host2", "a100-4c"),
            (server["status"], server["OS-EXT-SRV-ATTR:host"], server["flavor"]["original_name"]),
        )
        server = self.act(server, {"reboot": {"type": "HARD"}})
        self.assertEqual("ACTIVE", server["status"], server.get("fault"))
        vfs = self.domains("host2")[server["id"]]
        self.assertEqual(1, len(vfs))
        self.assertEqual(
            (test_fault_outcomes.L40S, test_fault_outcomes.L40S_TYPE), self.vgpus("host2")[vfs[0]]
        )
        self.assertEqual([(vfs[0], claims.ATTACHED)], self.claims("host2", server))
        self.later()
        self.assert_usage_matches_holders()
        self.assert_left_nothing(server)
        self.delete_all()
        self.assert_nothing_left()


class UnusedClaimTestsMixin:
    """What the host reconciler's periodic pass does with claims no domain
    uses, once ``[vgpu] unused_claim_grace`` has passed (``claim_grace``,
    after which guests that left a host lose its claims, is not)."""

    def after_unused_grace(self):
        self.flags(unused_claim_grace=0, group="vgpu")
        self._run_periodics()


class SourceClaimTests(UnusedClaimTestsMixin, TwoHostsTestBase):
    def test_the_source_lets_go_the_claim_of_a_domain_the_operator_undefined(self):
        """A resize whose finish fails, the hard reboot that recovers the
        guest on the destination, then the operator undefines the source's
        stale domain: its attached claim and vGPU stayed for
        ``claim_grace`` (or until a restart), Placement no longer counting
        them (nova deleted the source's allocation)."""
        server = self.boot(flavor=self.a100_typed)
        source_mdevs = self.domains("host1")[server["id"]]
        server = self.resize_failing_after_allocation(server, self.any_type)
        server = self.act(server, {"reboot": {"type": "HARD"}})
        self.assertEqual(("ACTIVE", "host2"), (server["status"], server["OS-EXT-SRV-ATTR:host"]))
        conn = self.computes["host1"].driver._host.get_connection()
        conn.lookupByUUIDString(server["id"]).undefine()
        self.assertEqual([(source_mdevs[0], claims.ATTACHED)], self.claims("host1", server))
        self.after_unused_grace()
        self.assertEqual(([], {}), (self.claims("host1"), self.vgpus("host1")))
        self.assert_usage_matches_holders()
        self.delete_all()
        self.assert_nothing_left()


class ClaimBesideTheDomainTests(UnusedClaimTestsMixin, CrashTestBase):
    """A running A100 guest also holds a claim on an L40S VF of its host
    that its domain does not use: a resize's finish here was killed right
    after its allocation, and the guest's next define here marked every
    claim it held attached.  Placement counts the A100 vGPU the guest
    uses; the VF stayed reserved for nobody.  Released after the grace,
    never while nova is in the middle of an operation on the guest."""

    HOSTS = {"host1": ("a100-sriov", "l40s-vfio")}
    ENABLED_TYPES = f"{A100_TYPE},{test_fault_outcomes.L40S_TYPE}"

    def configure(self):
        TwoHostsTestBase.configure(self)

    def setUp(self):
        super().setUp()
        self.server = self.boot(flavor=self.flavor("a100-4c", "CUSTOM_VGPU_NVIDIA_A100_4C"))
        self.a100_vgpus = self.domains("host1")[self.server["id"]]

    def leave_a_vf_claim(self, attached):
        """The claim the killed finish left: allocated as any is, on the
        L40S's provider, then marked attached by a define if ``attached``."""
        driver = self.computes["host1"].driver
        l40s = [
            rp for rp, p in driver._providers_by_uuid().items() if p.name.endswith("0000_c1_00_0")
        ]
        vfs = driver._claim(self.instance(self.server), {l40s[0]: {"resources": {"VGPU": 1}}})
        if attached:
            driver.vgpu.instance_defined(self.server["id"])
        state = claims.ATTACHED if attached else claims.CLAIMED
        self.assertEqual(
            sorted([(self.a100_vgpus[0], claims.ATTACHED), (vfs[0], state)]),
            sorted(self.claims("host1", self.server)),
        )
        return vfs[0]

    def assert_holds_only_its_own(self, vf):
        self.assertEqual([(self.a100_vgpus[0], claims.ATTACHED)], self.claims("host1", self.server))
        self.assertNotIn(vf, self.vgpus("host1"))
        self.assertEqual(self.a100_vgpus, self.domains("host1")[self.server["id"]])
        self.assert_usage_matches_holders()

    def test_an_attached_claim_its_domain_does_not_use_is_released(self):
        vf = self.leave_a_vf_claim(attached=True)
        self.after_unused_grace()
        self.assert_holds_only_its_own(vf)
        self.delete_all()
        self.assert_nothing_left()

    def test_a_claimed_claim_under_a_running_guest_is_released(self):
        vf = self.leave_a_vf_claim(attached=False)
        self.after_unused_grace()
        self.assert_holds_only_its_own(vf)

    def test_nothing_is_released_while_nova_is_mid_operation_on_the_guest(self):
        vf = self.leave_a_vf_claim(attached=True)
        instance = self.instance(self.server)
        instance.task_state = task_states.REBOOTING_HARD
        instance.save()
        self.after_unused_grace()
        self.assertIn((vf, claims.ATTACHED), self.claims("host1", self.server))
        driver = self.computes["host1"].driver
        with driver._operating_on(instance):
            instance.task_state = None
            instance.save()
            self.after_unused_grace()
            self.assertIn((vf, claims.ATTACHED), self.claims("host1", self.server))
        # A resize to this node waiting to be confirmed or reverted: its
        # record unfinished, the instance RESIZED with no task.
        migration = objects.Migration(
            self.ctxt,
            instance_uuid=self.server["id"],
            source_compute="host0",
            dest_compute="host1",
            source_node="host0",
            dest_node="host1",
            migration_type="resize",
            status="finished",
            old_instance_type_id=1,
            new_instance_type_id=1,
        )
        if "dest_compute_id" in objects.Migration.fields:  # nova 28 on
            migration.dest_compute_id = objects.ComputeNode.get_by_nodename(self.ctxt, "host1").id
        migration.create()
        instance.vm_state = vm_states.RESIZED
        instance.save()
        self.after_unused_grace()
        self.assertIn((vf, claims.ATTACHED), self.claims("host1", self.server))
        # The same record left unfinished while the guest goes on with no
        # task (a finish killed mid-way, the server reset): nothing will
        # come for that move.
        instance.vm_state = vm_states.ACTIVE
        instance.save()
        self.after_unused_grace()
        self.assert_holds_only_its_own(vf)
