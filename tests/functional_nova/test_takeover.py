"""Switching a running host from nova's libvirt driver to vgpu-driver.

The host first runs nova's own ``libvirt.LibvirtDriver``: it reads the
A100's VFs as mdev-capable devices from fake libvirt, makes one provider per
VF and boots guests with vGPUs, whose mdevs it creates.  Fake libvirt's VFs
are the fake kernel's (same addresses, ``availableInstances`` read from the
fake sysfs) and nova's own ``_create_mdev`` creates and persistently
defines each mdev through fake libvirt's node-device API, which creates it
in the fake sysfs, with its UUID, on its VF, so both drivers see one host.
The same compute is then restarted with
``vgpu_driver.nova.LibvirtVGPUDriver``, which must take the host over
through Placement's reshaper, guests untouched.
"""

import importlib.metadata
import os
import re

from nova.tests.fixtures import libvirt as fakelibvirt

from tests.functional_nova import test_vgpu
from vgpu_driver import guest as guest_xml
from vgpu_driver import names
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles

A100_4C = "nvidia-468"
GPU_PROVIDER = "host1_pci_0000_41_00_0"
# nova's own driver gives a guest one mdev per provider its vGPUs are
# allocated on from nova 33 (2026.1) on; an older one, only the first
# provider's, whatever the allocation says: a guest with two vGPUs on two VFs
# runs with one mdev, and holds two units.
NOVA_MDEVS_PER_PROVIDER = int(importlib.metadata.version("nova").split(".")[0]) >= 33


class SysfsVF(fakelibvirt.FakePCIDevice):
    """A VF of the fake kernel's A100, as libvirt's node-device API shows it:
    mdev-capable, offering ``type_id`` with the fake sysfs's availability."""

    _TYPES_RE = re.compile(r"<type id='[^']*'>.*</type>", re.S)

    def __init__(self, kernel, address, type_id, iommu_group):
        self.kernel = kernel
        self.vf = address
        self.type_id = type_id
        pci = names.parse_pci_address(address)
        super().__init__(
            "MDEV_TYPES",
            pci.bus,
            pci.slot,
            pci.function,
            iommu_group,
            0,
            prod_id="20F1",
            prod_name="GA100 [A100 PCIe 40GB]",
        )

    def XMLDesc(self, flags):
        available = self.kernel.available_instances(self.vf, self.type_id)
        block = (
            f"<type id='{self.type_id}'><name>NVIDIA A100-4C</name>"
            f"<deviceAPI>vfio-pci</deviceAPI>"
            f"<availableInstances>{available}</availableInstances></type>"
        )
        return self._TYPES_RE.sub(block, self.pci_device)


class NovaHostTestBase(test_vgpu.VGPUDriverTestBase):
    """A host first run by nova's own driver, whose mdevs nova makes with its
    own ``_create_mdev`` through libvirt's node-device API (created and
    defined persistently, autostarted), here served by the fake kernel."""

    def setUp(self):
        super().setUp()
        self.kernel = None
        self.flavor = self._create_flavor(
            memory_mb=512, vcpu=1, disk=1, ephemeral=0, extra_spec={"resources:VGPU": "1"}
        )
        # Two vGPUs: on nova's per-VF providers (total 1 each) two groups.
        self.two_flavor = self._create_flavor(
            memory_mb=512,
            vcpu=1,
            disk=1,
            ephemeral=0,
            extra_spec={"resources1:VGPU": "1", "resources2:VGPU": "1", "group_policy": "isolate"},
        )

    # -- the host under nova's own driver --------------------------------------------------

    def start_nova_compute(self):
        root = os.path.join(self.tmp, "host1", "sys")
        self.kernel = fakekernel.FakeKernel.build(root, profiles.load("a100-sriov"))
        self.kernels["host1"] = self.kernel
        self.flags(
            sysfs_root=root, state_dir=os.path.join(self.tmp, "host1", "state"), group="vgpu"
        )
        self.flags(compute_driver="libvirt.LibvirtDriver")
        pci_info = fakelibvirt.HostPCIDevicesInfo(num_pci=0, num_pfs=0, num_vfs=0)
        for group, parent in enumerate(self.kernel.list_parents(), start=40):
            device = SysfsVF(self.kernel, parent.name, A100_4C, group)
            pci_info.devices[device.pci_device.split("<name>")[1].split("<")[0]] = device
        return self.start_compute(hostname="host1", pci_info=pci_info)

    def switch_to_vgpu_driver(self):
        self.flags(compute_driver="vgpu_driver.nova.LibvirtVGPUDriver")
        self.restart_compute_service("host1")

    # -- what Placement and the host say -------------------------------------------------

    def child_providers(self):
        """``{name: uuid}`` of the host's child providers."""
        root = self.compute_rp_uuids["host1"]
        found = {}
        for rp in self._get_all_rp_uuids_in_a_tree(root):
            if rp != root:
                found[self.placement.get(f"/resource_providers/{rp}").body["name"]] = rp
        return found

    def domain_mdevs_of(self, server):
        for guest in self.computes["host1"].driver._host.list_guests(only_running=False):
            if guest.uuid == server["id"]:
                return sorted(guest_xml.mdev_uuids(guest_xml.parse(guest.get_xml_desc())))
        return []

    def claims_of(self, server):
        journal = self.computes["host1"].driver.vgpu.journal
        return sorted((c.mdev_uuid, c.state) for c in journal.claims(server["id"]))

    def vgpu_allocation(self, server):
        """``{rp uuid: VGPU units}`` of a server."""
        allocations = self._get_allocations_by_server_uuid(server["id"])
        return {
            rp: a["resources"]["VGPU"] for rp, a in allocations.items() if "VGPU" in a["resources"]
        }


class TakeoverTests(NovaHostTestBase):
    def test_guests_move_to_the_gpu_provider_and_keep_their_mdevs(self):
        self.start_nova_compute()
        one = self._create_server(flavor_id=self.flavor, networks="none", host="host1")
        other = self._create_server(flavor_id=self.flavor, networks="none", host="host1")
        two = self._create_server(flavor_id=self.two_flavor, networks="none", host="host1")
        servers = [one, other, two]
        # nova's layout: one provider of total 1 per VF, a guest's units on its VFs.
        before = self.child_providers()
        self.assertEqual(16, len(before))
        self.assertNotIn(GPU_PROVIDER, before)
        vf_of = {uuid: name for name, uuid in before.items()}
        self.assertEqual([1, 1, 2], [sum(self.vgpu_allocation(s).values()) for s in servers])
        self.assertTrue(
            all(vf_of[rp] != GPU_PROVIDER for s in servers for rp in self.vgpu_allocation(s))
        )
        mdevs = {s["id"]: self.domain_mdevs_of(s) for s in servers}
        two_mdevs = 2 if NOVA_MDEVS_PER_PROVIDER else 1
        self.assertEqual([1, 1, two_mdevs], [len(mdevs[s["id"]]) for s in servers])
        self.assertEqual(
            sorted(m for ms in mdevs.values() for m in ms),
            [m.uuid for m in self.kernel.list_mdevs()],
        )
        root_before = {
            s["id"]: self._get_allocations_by_server_uuid(s["id"])[self.compute_rp_uuids["host1"]]
            for s in servers
        }

        self.switch_to_vgpu_driver()

        # One atomic reshape, asked for by the driver and sent by nova.
        log = self.stdlog.logger.output
        self.assertIn("Requesting a reshape to take over providers", log)
        self.assertEqual(1, log.count('"POST /placement/reshaper" status: 204'))
        # An older nova's two-vGPU guest: its allocation moves as it is, said.
        self.assertEqual(
            not NOVA_MDEVS_PER_PROVIDER,
            f"Consumer {two['id']} had 2 unit(s) allocated on GPU 0000:41:00.0's "
            "old providers but holds 1 mdev(s) of it here" in log,
        )
        providers = self.child_providers()
        self.assertEqual([GPU_PROVIDER], list(providers))
        for old in before.values():
            self.assertEqual(404, self.placement.get(f"/resource_providers/{old}").status)
        self.assertEqual({GPU_PROVIDER: (10, 0, 4)}, self.gpu_providers("host1"))
        gpu_rp = providers[GPU_PROVIDER]
        root = self.compute_rp_uuids["host1"]
        for server, units in zip(servers, (1, 1, 2), strict=True):
            self.assertEqual({gpu_rp: units}, self.vgpu_allocation(server))
            allocations = self._get_allocations_by_server_uuid(server["id"])
            self.assertEqual(root_before[server["id"]]["resources"], allocations[root]["resources"])
            self.assertEqual("ACTIVE", self.api.get_server(server["id"])["status"])
            self.assertEqual(mdevs[server["id"]], self.domain_mdevs_of(server))
            self.assertEqual([(m, "attached") for m in mdevs[server["id"]]], self.claims_of(server))
            claims = self.computes["host1"].driver.vgpu.journal.claims(server["id"])
            self.assertEqual({"0000:41:00.0"}, {c.gpu for c in claims})

        # Business as usual: a new guest gets a new mdev, a delete frees capacity.
        new = self._create_server(flavor_id=self.flavor, networks="none", host="host1")
        (new_mdev,) = self.domain_mdevs_of(new)
        self.assertNotIn(new_mdev, [m for ms in mdevs.values() for m in ms])
        self.assertEqual([(new_mdev, "attached")], self.claims_of(new))
        self.assertEqual({gpu_rp: 1}, self.vgpu_allocation(new))
        self.assertEqual({GPU_PROVIDER: (10, 0, 5)}, self.gpu_providers("host1"))
        self._delete_server(two)
        self.assertEqual({GPU_PROVIDER: (10, 0, 3)}, self.gpu_providers("host1"))
        self.assertEqual([], self.claims_of(two))
        self.assertEqual(
            sorted([*mdevs[one["id"]], *mdevs[other["id"]], new_mdev]),
            sorted(c.mdev_uuid for c in self.computes["host1"].driver.vgpu.journal.claims()),
        )

    def test_a_host_without_guests_is_taken_over_too(self):
        self.start_nova_compute()
        self.assertEqual(16, len(self.child_providers()))
        self.switch_to_vgpu_driver()
        self.assertEqual({GPU_PROVIDER: (10, 0, 0)}, self.gpu_providers("host1"))
        self.assertEqual([GPU_PROVIDER], list(self.child_providers()))
        server = self._create_server(flavor_id=self.flavor, networks="none", host="host1")
        self.assertEqual(1, len(self.domain_mdevs_of(server)))

    def test_a_second_restart_finds_nothing_to_take_over(self):
        self.start_nova_compute()
        server = self._create_server(flavor_id=self.flavor, networks="none", host="host1")
        self.switch_to_vgpu_driver()
        gpu_rp = self.child_providers()[GPU_PROVIDER]
        self.restart_compute_service("host1")
        self.assertEqual(1, self.stdlog.logger.output.count("POST /placement/reshaper"))
        self.assertEqual({GPU_PROVIDER: gpu_rp}, self.child_providers())
        self.assertEqual({GPU_PROVIDER: (10, 0, 1)}, self.gpu_providers("host1"))
        self.assertEqual(
            [(m, "attached") for m in self.domain_mdevs_of(server)], self.claims_of(server)
        )
