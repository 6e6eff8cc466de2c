"""nova-compute refuses, at start, a nova that lacks what the adapter hooks.

The adapter (``vgpu_driver.nova``) relies on private methods of nova's
libvirt driver and Host; :mod:`vgpu_driver.nova.compat` lists them.  These
tests run in every nova lane: the installed nova offers every hook, and a
nova where one is renamed, takes other parameters or stopped doing what the
adapter relies on makes ``start_compute`` fail with one message naming the
nova version, the hook and the supported range, before any guest exists.
"""

import fixtures
from nova import exception as nova_exception
from nova.virt.libvirt import driver as libvirt_driver

from tests.functional_nova import test_vgpu
from vgpu_driver import exception
from vgpu_driver.nova import compat


class CompatTests(test_vgpu.VGPUDriverTestBase):
    ENABLED_TYPES = "nvidia-231"  # GRID T4-2Q on each of the eight T4

    def replace_driver_method(self, name, function):
        """nova's LibvirtDriver.name is ``function`` for this test (set as
        is: fixtures.MonkeyPatch would wrap it in the old signature)."""
        cls = libvirt_driver.LibvirtDriver
        original = cls.__dict__[name]
        setattr(cls, name, function)
        self.addCleanup(setattr, cls, name, original)

    def test_the_installed_nova_offers_every_hook(self):
        self.assertEqual([], compat.problems())
        self.assertRegex(compat.supported_range(), r"^nova[<>=]")
        self.start_vgpu_compute("host1", "t4x8")
        self.assertEqual(8, len(self.gpu_providers("host1")))

    def assert_start_refused(self, *expected):
        error = self.assertRaises(
            exception.NovaIncompatible, self.start_vgpu_compute, "host1", "t4x8"
        )
        message = str(error)
        self.assertIn(f"nova {compat.nova_version()}", message)
        self.assertIn(f"supports {compat.supported_range()}", message)
        for text in expected:
            self.assertIn(text, message)
        self.assertNotIn("host1", self.computes)
        return message

    def test_a_renamed_hook_stops_nova_compute_at_start(self):
        # As if nova renamed _get_all_assigned_mediated_devices.
        original = libvirt_driver.LibvirtDriver._get_all_assigned_mediated_devices
        self.useFixture(
            fixtures.MonkeyPatch(
                "nova.virt.libvirt.driver.LibvirtDriver._get_all_assigned_mediated_devices",
                fixtures.MonkeyPatch.delete,
            )
        )
        self.useFixture(
            fixtures.MonkeyPatch(
                "nova.virt.libvirt.driver.LibvirtDriver._get_assigned_mediated_devices", original
            )
        )
        self.assert_start_refused("LibvirtDriver._get_all_assigned_mediated_devices does not exist")

    def test_a_hook_taking_other_parameters_is_named_with_both(self):
        def _allocate_mdevs(self, allocs, instance):
            return []

        self.replace_driver_method("_allocate_mdevs", _allocate_mdevs)
        self.assert_start_refused(
            "LibvirtDriver._allocate_mdevs takes (self, allocs, instance), where "
            "vgpu-driver passes (self, allocations, ...)"
        )

    def test_a_hard_reboot_that_no_longer_destroys_is_refused(self):
        def _hard_reboot(
            self,
            context,
            instance,
            network_info,
            share_info,
            block_device_info=None,
            accel_info=None,
        ):
            self._host.get_guest(instance).poweroff()

        self.replace_driver_method("_hard_reboot", _hard_reboot)
        self.assert_start_refused(
            "LibvirtDriver._hard_reboot no longer does what vgpu-driver relies on"
        )

    def test_every_problem_is_named_in_the_one_message(self):
        for name in ("_guest_add_mdevs", "_start_inactive_mediated_devices"):
            self.useFixture(
                fixtures.MonkeyPatch(
                    f"nova.virt.libvirt.driver.LibvirtDriver.{name}", fixtures.MonkeyPatch.delete
                )
            )
        self.useFixture(
            fixtures.MonkeyPatch(
                "nova.virt.libvirt.host.Host._event_device_removed_callback",
                fixtures.MonkeyPatch.delete,
            )
        )
        message = self.assert_start_refused(
            "LibvirtDriver._start_inactive_mediated_devices does not exist",
            "LibvirtDriver._guest_add_mdevs does not exist",
            "Host._event_device_removed_callback does not exist",
        )
        self.assertEqual(1, len(message.splitlines()))

    def test_vgpus_asked_for_outside_a_known_operation_are_refused(self):
        """No silent fallback to nova's allocator, which journals nothing."""
        self.start_vgpu_compute("host1", "t4x8")
        driver = self.computes["host1"].driver
        before = set(self.kernel_mdevs("host1"))
        error = self.assertRaises(
            nova_exception.ComputeResourcesUnavailable, driver._allocate_mdevs, {}
        )
        self.assertIn("outside the operations vgpu-driver knows", str(error))
        self.assertEqual(before, set(self.kernel_mdevs("host1")))
        self.assertEqual([], driver.vgpu.journal.claims())
