"""OWNER_NOVA on our GPU providers, wherever nova puts it on its own.

nova 34 (2026.2, service version 73) marks every resource provider it
creates with the standard trait ``OWNER_NOVA`` (its compute node in the
resource tracker, its GPU, PCI and memory-encryption children in its
drivers), and its scheduler's ``owner_nova_filter`` requires the trait on
the root provider once every nova-compute reports that version, so that
providers another service made (Cyborg's, marked ``OWNER_CYBORG``) are told
apart.  Our GPU providers are nova's children too: inside nova 34 they carry
it, whether we created them or took them over from nova's own driver, and
vGPU flavors still schedule onto them with the filter active; an older nova
marks none of its providers, nor do we.
"""

import functools
import importlib.metadata
import os

import fixtures
import nova.conf
from nova import context as nova_context
from nova.objects import service as service_obj
from nova.scheduler import request_filter
from nova.tests.fixtures import libvirt as fakelibvirt

from tests.functional_nova import test_takeover
from tests.functional_nova import test_vgpu
from vgpu_driver import placement
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles

OWNER_NOVA = "OWNER_NOVA"
# The release, read from the installed distribution rather than from what
# the driver decides: nova 34 is the first to mark its providers.
NOVA_RELEASE = int(importlib.metadata.version("nova").split(".")[0])
NOVA_MARKS_OWNER = NOVA_RELEASE >= 34


class OwnerNovaTestMixin:
    def spy_owner_filter(self):
        """``[(applied, root_required)]`` of each run of nova's owner filter
        (none on a nova without it)."""
        runs = []

        def spying(request_filter_fn):
            if request_filter_fn.__name__ != "owner_nova_filter":
                return request_filter_fn

            @functools.wraps(request_filter_fn)
            def spy(ctxt, request_spec):
                applied = request_filter_fn(ctxt, request_spec)
                runs.append((applied, set(request_spec.root_required)))
                return applied

            return spy

        self.useFixture(
            fixtures.MonkeyPatch(
                "nova.scheduler.request_filter.ALL_REQUEST_FILTERS",
                [spying(f) for f in request_filter.ALL_REQUEST_FILTERS],
            )
        )
        return runs

    def assert_marked_as_nova_marks(self, rp_uuid):
        """The provider carries OWNER_NOVA exactly where nova marks its own."""
        self.assertEqual(
            NOVA_MARKS_OWNER,
            OWNER_NOVA in self._get_provider_traits(rp_uuid),
            f"nova {NOVA_RELEASE}, provider {rp_uuid}",
        )

    def assert_owner_filter_was_active(self, runs):
        """Every scheduling request of a nova 34 ran the filter, which required
        OWNER_NOVA on the root: every compute is at the current version."""
        if not NOVA_MARKS_OWNER:
            self.assertFalse(hasattr(request_filter, "owner_nova_filter"))
            return
        minimum = service_obj.get_minimum_version_all_cells(
            nova_context.get_admin_context(), ["nova-compute"]
        )
        self.assertGreaterEqual(minimum, request_filter.MIN_COMPUTE_VERSION_OWNER_TRAIT)
        self.assertTrue(runs)
        self.assertEqual(
            [(True, True)] * len(runs),
            [(applied, OWNER_NOVA in required) for applied, required in runs],
        )

    def vgpu_providers_of(self, server):
        """``{rp uuid: VGPU units}`` of a server's allocations."""
        allocations = self._get_allocations_by_server_uuid(server["id"])
        return {
            rp: a["resources"]["VGPU"] for rp, a in allocations.items() if "VGPU" in a["resources"]
        }


class OwnerNovaTests(OwnerNovaTestMixin, test_vgpu.VGPUDriverTestBase):
    ENABLED_TYPES = "nvidia-231"  # GRID T4-2Q on each of the eight T4

    def test_vgpu_flavors_land_on_gpu_providers_marked_as_nova_marks_its_own(self):
        runs = self.spy_owner_filter()
        self.start_vgpu_compute("host1", "t4x8")
        root = self.compute_rp_uuids["host1"]
        self.assert_marked_as_nova_marks(root)  # nova's own compute node
        gpus = {self._get_provider_uuid_by_name(name): name for name in self.gpu_providers("host1")}
        self.assertEqual(8, len(gpus))
        for rp in gpus:
            self.assert_marked_as_nova_marks(rp)
            self.assertIn(placement.OWNER_TRAIT, self._get_provider_traits(rp))
            self.assertIn("CUSTOM_VGPU_GRID_T4_2Q", self._get_provider_traits(rp))

        flavors = {
            "one": {"resources:VGPU": "1"},
            "two": {"resources1:VGPU": "1", "resources2:VGPU": "1", "group_policy": "isolate"},
        }
        if NOVA_MARKS_OWNER:
            # Where Cyborg offers vGPUs too, a flavor asks for nova's by owner.
            flavors["nova's"] = {"resources1:VGPU": "1", "trait1:OWNER_NOVA": "required"}
        for name, extra_spec in flavors.items():
            flavor = self._create_flavor(
                memory_mb=512, vcpu=1, disk=1, ephemeral=0, extra_spec=extra_spec
            )
            server = self._create_server(flavor_id=flavor, networks="none", host="host1")
            self.assertEqual("ACTIVE", server["status"], name)
            on = self.vgpu_providers_of(server)
            self.assertLessEqual(set(on), set(gpus), name)
            self.assertEqual(2 if name == "two" else 1, sum(on.values()), name)
        self.assertEqual(len(flavors) + 1, len(self.domain_mdevs("host1")))
        self.used_mdevs_match_placement("host1")
        self.assert_owner_filter_was_active(runs)

        # A restart writes the same traits again: nothing is lost or added.
        before = {rp: sorted(self._get_provider_traits(rp)) for rp in gpus}
        self.restart_compute_service("host1")
        self.assertEqual(before, {rp: sorted(self._get_provider_traits(rp)) for rp in gpus})


class OwnerNovaTakeoverTests(OwnerNovaTestMixin, test_takeover.NovaHostTestBase):
    """Providers taken over from nova's own driver keep (or get) the mark."""

    def test_the_gpu_provider_replacing_nova_per_vf_providers(self):
        runs = self.spy_owner_filter()
        self.start_nova_compute()
        vfs = self.child_providers()
        self.assertEqual(16, len(vfs))
        for rp in vfs.values():
            self.assert_marked_as_nova_marks(rp)  # nova's driver marks its own
        before = self._create_server(flavor_id=self.flavor, networks="none", host="host1")

        self.switch_to_vgpu_driver()

        (gpu_rp,) = self.child_providers().values()
        self.assert_marked_as_nova_marks(gpu_rp)
        self.assertIn(placement.OWNER_TRAIT, self._get_provider_traits(gpu_rp))
        self.assertEqual({gpu_rp: 1}, self.vgpu_providers_of(before))
        after = self._create_server(flavor_id=self.flavor, networks="none", host="host1")
        self.assertEqual({gpu_rp: 1}, self.vgpu_providers_of(after))
        self.assertEqual({test_takeover.GPU_PROVIDER: (10, 0, 2)}, self.gpu_providers("host1"))
        self.assert_owner_filter_was_active(runs)

    def test_a_per_gpu_provider_of_nova_is_adopted_with_its_traits(self):
        """nova names a time-sliced GPU's provider as we do: we adopt it in
        place, and keep the traits nova and others gave it."""
        runs = self.spy_owner_filter()
        name = "host1_pci_0000_18_00_0"
        self.start_nova_compute_on("t4x8", "0000:18:00.0", "nvidia-231")  # GRID T4-2Q
        nova_rp = self._get_provider_uuid_by_name(name)
        self.assert_marked_as_nova_marks(nova_rp)
        self._create_trait("CUSTOM_OPERATOR_TAG")  # an operator's, on nova's provider
        self._set_provider_traits(
            nova_rp, [*self._get_provider_traits(nova_rp), "CUSTOM_OPERATOR_TAG"]
        )
        before = self._create_server(flavor_id=self.flavor, networks="none", host="host1")
        self.assertEqual({nova_rp: 1}, self.vgpu_providers_of(before))

        self.switch_to_vgpu_driver()

        self.assertEqual({name: nova_rp}, self.child_providers())
        traits = self._get_provider_traits(nova_rp)
        self.assert_marked_as_nova_marks(nova_rp)
        self.assertIn("CUSTOM_OPERATOR_TAG", traits)
        self.assertIn(placement.OWNER_TRAIT, traits)
        self.assertIn("CUSTOM_VGPU_GRID_T4_2Q", traits)
        self.assertEqual(
            [(m, "attached") for m in self.domain_mdevs_of(before)], self.claims_of(before)
        )
        after = self._create_server(flavor_id=self.flavor, networks="none", host="host1")
        self.assertEqual({nova_rp: 1}, self.vgpu_providers_of(after))
        self.assertEqual({name: (8, 0, 2)}, self.gpu_providers("host1"))
        self.assert_owner_filter_was_active(runs)

    def start_nova_compute_on(self, profile, gpu, type_id):
        """nova's own driver on one time-sliced GPU of ``profile``, serving
        ``type_id``: fake libvirt shows the GPU as mdev-capable."""
        self.flags(enabled_mdev_types=type_id, group="devices")
        nova.conf.devices.register_dynamic_opts(nova.conf.CONF)
        self.flags(device_addresses=[gpu], group=f"mdev_{type_id}")
        root = os.path.join(self.tmp, "host1", "sys")
        self.kernel = fakekernel.FakeKernel.build(root, profiles.load(profile))
        self.kernels["host1"] = self.kernel
        self.flags(
            sysfs_root=root, state_dir=os.path.join(self.tmp, "host1", "state"), group="vgpu"
        )
        self.flags(compute_driver="libvirt.LibvirtDriver")
        pci_info = fakelibvirt.HostPCIDevicesInfo(num_pci=0, num_pfs=0, num_vfs=0)
        device = test_takeover.SysfsVF(self.kernel, gpu, type_id, 40)
        pci_info.devices[device.pci_device.split("<name>")[1].split("<")[0]] = device
        return self.start_compute(hostname="host1", pci_info=pci_info)
