"""nova-compute killed in the middle of a vGPU operation, then started again.

The compute is killed while libvirt defines the guest's domain (nova's
``Host.write_instance_config``, the one define every operation goes
through): :class:`Killed` is raised there, a ``BaseException`` that none of
nova's error handling (``except Exception``) or ours runs for, as none runs
in a killed process; the compute is then started again on the same host,
libvirt and state directory, as systemd would.  nova's ``init_host``
resumes what it finds interrupted (a hard reboot, a power-on); the service
must start whatever our allocation says, and the guest get its vGPU back.
"""

import os

import fixtures
from nova import context
from nova import objects
from nova.compute import task_states
from nova.virt.libvirt import host as libvirt_host

from tests.functional_nova import test_fault_outcomes
from vgpu_driver import claims
from vgpu_driver import driver as core

A100, A100_TYPE = "0000:41:00.0", "nvidia-468"      # A100-4C, mdevs on its VFs


class Killed(BaseException):
    """nova-compute killed: no handler of the process runs."""


class CrashTestBase(test_fault_outcomes.FaultOutcomeTestBase):
    HOSTS = {"host1": ("a100-sriov",)}
    ENABLED_TYPES = A100_TYPE

    def setUp(self):
        super().setUp()
        self.ctxt = context.get_admin_context()
        self.a100 = self._create_flavor(name="a100", memory_mb=512, vcpu=1, disk=1,
                                        ephemeral=0, extra_spec={"resources:VGPU": "1"})

    def boot(self, host="host1", flavor=None):
        return self._create_server(flavor_id=flavor or self.a100, networks="none",
                                   host=host)

    def instance(self, server):
        return objects.Instance.get_by_uuid(self.ctxt, server["id"],
                                            expected_attrs=["flavor"])

    def killed_while_defining(self, server, task_state, operation, *args, **kwargs):
        """Run the compute manager's ``operation`` on the server's instance,
        as nova's API casts it (``task_state`` set first); the compute is
        killed when libvirt defines the domain."""
        instance = self.instance(server)
        instance.task_state = task_state
        instance.save()
        host = instance.host

        def define(this, xml):
            raise Killed(f"nova-compute on {host} killed while defining a domain")

        with fixtures.MonkeyPatch(
                "nova.virt.libvirt.host.Host.write_instance_config", define):
            method = getattr(self.computes[host].manager, operation)
            self.assertRaises(Killed, method, self.ctxt, instance, *args, **kwargs)
        self.assertEqual(libvirt_host.Host.write_instance_config.__name__,
                         "write_instance_config")

    def restart(self, hostname):
        """nova-compute started again on its host's sysfs, state and libvirt."""
        self.flags(sysfs_root=os.path.join(self.tmp, hostname, "sys"),
                   state_dir=os.path.join(self.tmp, hostname, "state"), group="vgpu")
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
        self.killed_while_defining(server, task_states.REBOOTING_HARD,
                                   "reboot_instance", block_device_info=None,
                                   reboot_type="HARD")
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
        self.killed_while_defining(server, task_states.REBOOTING_HARD,
                                   "reboot_instance", block_device_info=None,
                                   reboot_type="HARD")
        self.placement.delete(f"/allocations/{server['id']}")
        self.restart("host1")
        server = self._wait_for_state_change(server, "ERROR")
        self.assertIsNone(server["OS-EXT-STS:task_state"])
        self.assertIn("gets no vGPU here: the flavor asks for 1 VGPU, the allocation "
                      "holds 0", server["fault"]["message"])
        self.assertEqual((None, []), self.holds(server))
        # The service runs: it boots the next guest.
        self.assertEqual("ACTIVE", self.boot()["status"])


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


class ResizeCrashTests(CrashTestBase):
    """An A100 guest resized to a flavor asking only ``VGPU:1`` (any type)
    lands on the L40S host, whose finish fails right after the allocation.

    nova puts the guest's A100 flavor back, leaves it in ERROR on the L40S
    host holding the new flavor's allocation there, and says a hard reboot
    may recover it.  The driver judged that allocation by the A100 flavor
    alone and refused the reboot: "a type the flavor does not ask for".
    The allocation is the resize's, made for its new flavor, which asks for
    any type: the guest is defined with it.
    """

    HOSTS = {"host1": ("a100-sriov",), "host2": ("l40s-vfio",)}
    ENABLED_TYPES = f"{A100_TYPE},{test_fault_outcomes.L40S_TYPE}"

    def configure(self):
        self.flags(device_addresses=[A100], group=f"mdev_{A100_TYPE}")
        # sysfs does not say how many L40S-4Q fit on the GPU: the operator does.
        self.flags(device_addresses=[test_fault_outcomes.L40S], max_instances=12,
                   group=f"mdev_{test_fault_outcomes.L40S_TYPE}")

    def setUp(self):
        super().setUp()
        self.a100_typed = self.flavor("a100-4c", "CUSTOM_VGPU_NVIDIA_A100_4C")
        self.any_type = self._create_flavor(name="any-vgpu", memory_mb=1024, vcpu=1,
                                            disk=1, ephemeral=0,
                                            extra_spec={"resources:VGPU": "1"})

    def test_a_hard_reboot_recovers_the_guest_with_the_resizes_vgpu(self):
        server = self.boot(flavor=self.a100_typed)
        with fixtures.MonkeyPatch(
                "vgpu_driver.driver.VGPUDriver.allocate",
                _raise_after(core.VGPUDriver.allocate, RuntimeError("injected"))):
            server = self.act(server, {"resize": {"flavorRef": self.any_type}})
        self.assertEqual(("ERROR", "host2", "a100-4c"),
                         (server["status"], server["OS-EXT-SRV-ATTR:host"],
                          server["flavor"]["original_name"]))
        server = self.act(server, {"reboot": {"type": "HARD"}})
        self.assertEqual("ACTIVE", server["status"], server.get("fault"))
        vfs = self.domains("host2")[server["id"]]
        self.assertEqual(1, len(vfs))
        self.assertEqual((test_fault_outcomes.L40S, test_fault_outcomes.L40S_TYPE),
                         self.vgpus("host2")[vfs[0]])
        self.assertEqual([(vfs[0], claims.ATTACHED)], self.claims("host2", server))
        self.later()
        self.assert_usage_matches_holders()
        self.assert_left_nothing(server)
        self.delete_all()
        self.assert_nothing_left()
