"""One L40S serving 4, 8, 12 and 24 GB vGPUs at once, through nova's services.

The board is listed under four vendor-VFIO types and switched to mixed-size
mode; its provider has one inventory of framebuffer MiB and one per vGPU
size, and each flavor asks for its type's MiB, one unit of its size class
per vGPU, and requires its type's trait
(:func:`vgpu_driver.cmd.flavor_commands.flavor_spec`).  Placement, not the
board, turns away what no longer fits, and grants what does, for flavors
of several vGPUs too; and on a 96 GB Blackwell board, whose placements do
not nest, a 24 GB vGPU is turned away from a free 32 GB region.
"""

import os

from nova import context
from nova import objects
from nova.scheduler.client import report as nova_report

from tests.functional_nova import host_audit
from tests.functional_nova import test_vendor_vfio_live_migration
from tests.functional_nova import test_vgpu
from vgpu_driver import framebuffer
from vgpu_driver import inventory
from vgpu_driver import size_classes
from vgpu_driver.fake import board_tables
from vgpu_driver.fake import fakekernel

L40S = "0000:c1:00.0"
PROVIDER = "host1_pci_0000_c1_00_0"
RC = framebuffer.RESOURCE_CLASS
GB = framebuffer.SLOT_MIB
OTHERS_TRAIT = "CUSTOM_SET_BY_ANOTHER_TOOL"
SIZES = {"nvidia-1155": 4, "nvidia-1156": 8, "nvidia-1157": 12, "nvidia-1159": 24}


def vgpu_flavor(test, type_id, gb, count):
    """A flavor of ``count`` vGPUs of ``type_id`` (``gb`` GB each) with the
    extra specs ``vgpu-manage flavor-spec`` prints."""
    return test._create_flavor(
        memory_mb=512,
        vcpu=1,
        disk=1,
        ephemeral=0,
        name=f"vgpu-{count}x{gb}g",
        extra_spec=size_classes.flavor_spec(
            inventory.type_traits(type_id, None)[0], gb, gb * GB, count, RC
        ),
    )


class MixedSizeTests(test_vgpu.VGPUDriverTestBase):
    ENABLED_TYPES = ",".join(SIZES)

    def setUp(self):
        super().setUp()
        for type_id in SIZES:
            self.flags(device_addresses=[L40S], group=f"mdev_{type_id}")
        kernel = self.build_vgpu_host("host1", "l40s-vfio")
        # What "vgpu-manage sriov sizes 0000:c1:00.0 mixed" does, through NVML.
        kernel.set_mixed_sizes(L40S, True)
        self.start_vgpu_compute("host1")
        self.flavors = {gb: self.flavor(type_id, 1) for type_id, gb in SIZES.items()}

    def flavor(self, type_id, count):
        return vgpu_flavor(self, type_id, SIZES[type_id], count)

    def boot(self, gb, **kwargs):
        return self._create_server(
            flavor_id=self.flavors[gb], networks="none", host="host1", **kwargs
        )

    def board(self):
        """``(total, reserved, largest size that fits, usage)`` of the
        board's provider: the framebuffer's, and the largest size whose
        class has room left."""
        rp = self._get_provider_uuid_by_name(PROVIDER)
        inventories = self._get_provider_inventory(rp)
        usages = self._get_provider_usages(rp)
        found = inventories[RC]
        fits = [
            int(rc.split("_")[3])
            for rc, record in inventories.items()
            if size_classes.is_size_class(rc)
            and record["total"] - record["reserved"] - usages.get(rc, 0) > 0
        ]
        return found["total"], found["reserved"], max(fits, default=0), usages.get(RC, 0)

    def typed_vfs(self):
        """``{VF: type id}`` as sysfs shows them."""
        return {
            str(vf.address): f"nvidia-{vf.current_type}"
            for vf in self.kernels["host1"].list_vendor_vfio()
            if vf.current_type
        }

    def guest_vfs(self, server):
        return [
            c.mdev_uuid for c in self.computes["host1"].driver.vgpu.journal.claims(server["id"])
        ]

    def test_three_sizes_on_one_board_and_placement_turns_away_the_fourth(self):
        self.assertEqual((48 * GB, 0, 24 * GB, 0), self.board())
        four, twelve, eight = self.boot(4), self.boot(12), self.boot(8)
        types = {
            gb: [self.typed_vfs()[vf] for vf in self.guest_vfs(server)]
            for gb, server in ((4, four), (12, twelve), (8, eight))
        }
        self.assertEqual({4: ["nvidia-1155"], 12: ["nvidia-1157"], 8: ["nvidia-1156"]}, types)
        # 4 GB at slot 0, 12 GB at 12, 8 GB at 24: no empty half is left for
        # 24 GB, and slots 4-7 fit no configured size.
        kernel = self.kernels["host1"]
        self.assertEqual(((1155, 0), (1157, 12), (1156, 24)), kernel.vgpu_locations(L40S))
        self.assertEqual((48 * GB, 4 * GB, 12 * GB, 24 * GB), self.board())
        refused = self.boot(24, expected_state="ERROR")
        self.assertIn("No valid host", refused["fault"]["message"])
        self.assertEqual(3, len(self.typed_vfs()))

        self._delete_server(eight)
        self.assertEqual(16 * GB, self.board()[3])  # exactly its 8 GB freed
        self.assertEqual(2, len(self.typed_vfs()))  # its VF's type cleared
        self._run_periodics()
        self.assertEqual((48 * GB, 4 * GB, 24 * GB, 16 * GB), self.board())
        twenty_four = self.boot(24)
        self.assertEqual(
            ["nvidia-1159"], [self.typed_vfs()[vf] for vf in self.guest_vfs(twenty_four)]
        )
        # 4 GB at 0, 12 GB at 12, 24 GB at 24: only a 4 GB vGPU fits, at 8.
        self.assertEqual((48 * GB, 4 * GB, 4 * GB, 40 * GB), self.board())
        # Each guest's MiB in Placement are the vGPUs it holds here.
        self.assertEqual([], host_audit.audit_of(self, "host1"))

    def test_two_24_gb_vgpus_on_an_empty_board(self):
        """No single vGPU is 48 GB, but one flavor of 2 x 24 GB fits."""
        server = self._create_server(
            flavor_id=self.flavor("nvidia-1159", 2), networks="none", host="host1"
        )
        self.assertEqual(
            ["nvidia-1159"] * 2, [self.typed_vfs()[vf] for vf in self.guest_vfs(server)]
        )
        self.assertEqual((48 * GB, 0, 0, 48 * GB), self.board())
        self.assertEqual([], host_audit.audit_of(self, "host1"))

    def test_three_4_gb_vgpus_where_only_two_fit(self):
        """12 GB vGPUs at 0, 12 and 24 leave slots 36-47: 12 GB free, but
        only two 4 GB placements (36, 44).  3 x 4 GB is turned away by
        Placement, 2 x 4 GB is served there."""
        for _ in range(3):
            self.boot(12)
        refused = self._create_server(
            flavor_id=self.flavor("nvidia-1155", 3),
            networks="none",
            host="host1",
            expected_state="ERROR",
        )
        self.assertIn("No valid host", refused["fault"]["message"])
        self.assertEqual(3, len(self.typed_vfs()))
        served = self._create_server(
            flavor_id=self.flavor("nvidia-1155", 2), networks="none", host="host1"
        )
        self.assertEqual(
            ["nvidia-1155"] * 2, [self.typed_vfs()[vf] for vf in self.guest_vfs(served)]
        )
        kernel = self.kernels["host1"]
        self.assertEqual(
            ((1157, 0), (1157, 12), (1157, 24), (1155, 36), (1155, 44)), kernel.vgpu_locations(L40S)
        )
        self.assertEqual([], host_audit.audit_of(self, "host1"))

    def test_a_restart_gives_allocations_without_a_size_class_theirs(self):
        """A guest of a flavor made before the size classes: its 4 GB vGPU
        is reserved in its class until nova-compute restarts and reshapes
        its allocation to hold it."""
        old = self._create_flavor(
            memory_mb=512,
            vcpu=1,
            disk=1,
            ephemeral=0,
            name="vgpu-4g-old",
            extra_spec={
                f"resources:{RC}": str(4 * GB),
                f"trait:{inventory.type_traits('nvidia-1155', None)[0]}": "required",
            },
        )
        server = self._create_server(flavor_id=old, networks="none", host="host1")
        rp = self._get_provider_uuid_by_name(PROVIDER)
        four = size_classes.class_name(4)
        self.assertNotIn(four, self._get_allocations_by_server_uuid(server["id"])[rp]["resources"])
        self._run_periodics()
        record = self._get_provider_inventory(rp)[four]
        # 8 placements of 4 GB on the board, 1 held: 7 left, the held one
        # reserved since no allocation counts it.
        self.assertEqual((8, 1), (record["total"], record["reserved"]))
        self.restart_compute_service("host1")
        self.assertEqual(
            1, self._get_allocations_by_server_uuid(server["id"])[rp]["resources"][four]
        )
        self.assertIn("Reshaping: 1 allocation(s) on mixed-size boards", self.stdlog.logger.output)
        self.assertEqual(0, self._get_provider_inventory(rp)[four]["reserved"])
        self.assertEqual([], host_audit.audit_of(self, "host1"))

    def test_a_placement_conflict_on_the_board_leaves_it_to_the_periodic_update(self):
        """Someone changes the board's provider between the driver's read of
        its generation and its write of the inventory after a claim: the
        write is refused (409), the guest still gets its vGPU, and the next
        periodic update sends the inventory."""
        rp = self._get_provider_uuid_by_name(PROVIDER)
        real = nova_report.SchedulerReportClient._refresh_and_get_inventory
        placement = self.placement

        placement.put(f"/traits/{OTHERS_TRAIT}", None, version="1.6")

        def refresh_then_bump(client, context, rp_uuid):
            found = real(client, context, rp_uuid)
            if rp_uuid == rp:  # another writer: a trait of its own, on or off
                body = placement.get(f"/resource_providers/{rp}/traits", version="1.6").body
                traits = set(body["traits"]) ^ {OTHERS_TRAIT}
                placement.put(
                    f"/resource_providers/{rp}/traits",
                    {
                        "traits": sorted(traits),
                        "resource_provider_generation": body["resource_provider_generation"],
                    },
                    version="1.6",
                )
            return found

        self.useFixture(
            test_vgpu.fixtures.MonkeyPatch(
                "nova.scheduler.client.report.SchedulerReportClient._refresh_and_get_inventory",
                refresh_then_bump,
            )
        )
        self.boot(4)
        twelve = self.boot(12)
        eight = self.boot(8)
        self.assertIn("reaches Placement at the next periodic update", self.stdlog.logger.output)
        self.assertEqual(3, len(self.typed_vfs()))
        self.assertEqual(["nvidia-1157"], [self.typed_vfs()[vf] for vf in self.guest_vfs(twelve)])
        self.assertEqual(["nvidia-1156"], [self.typed_vfs()[vf] for vf in self.guest_vfs(eight)])
        self._run_periodics()
        self.assertEqual((48 * GB, 4 * GB, 12 * GB, 24 * GB), self.board())

    def test_a_race_placement_lets_through_ends_in_error_with_nothing_leaked(self):
        """Three 8 GB guests in one request: the scheduler allocates all three
        before the compute places any.  Placement's sum fits (24 GB free, up
        to 12 GB at once) but the board has two 8 GB placements left, so it
        refuses the third at claim time; with no other host to retry on, that
        guest ends in ERROR holding nothing here.  The flavor asks MiB alone
        (made before the size classes, whose inventory would have turned
        the third away in the scheduler): the board is the last check."""
        twelves = [self.boot(12) for _ in range(4)]  # at slots 0, 12, 24 and 36
        self._delete_server(twelves[0])
        self._delete_server(twelves[2])  # free: slots 0-11 and 24-35
        self._run_periodics()
        self.assertEqual((48 * GB, 0, 12 * GB, 24 * GB), self.board())
        mib_only = self._create_flavor(
            memory_mb=512,
            vcpu=1,
            disk=1,
            ephemeral=0,
            name="vgpu-8g-mib-only",
            extra_spec={
                f"resources:{RC}": str(8 * GB),
                f"trait:{inventory.type_traits('nvidia-1156', None)[0]}": "required",
            },
        )
        servers = self.create_servers("eight", mib_only, 3, ends=("ACTIVE", "ERROR"), tries=200)
        states = sorted(s["status"] for s in servers)
        self.assertEqual(["ACTIVE", "ACTIVE", "ERROR"], states)
        (refused,) = [s for s in servers if s["status"] == "ERROR"]
        # Refused by the board at claim time, and rescheduled: not by Placement.
        self.assertIn(
            f"NoGpuCapacity: Cannot give {refused['id']} 1 x nvidia-1156 on {L40S}",
            self.stdlog.logger.output,
        )
        self.assertIn(
            "Exhausted all hosts available for retrying build failures",
            self.api.get_server(refused["id"])["fault"]["message"],
        )
        self.assertEqual({}, self._get_allocations_by_server_uuid(refused["id"]))
        self.assertEqual([], self.guest_vfs(refused))
        kernel = self.kernels["host1"]
        self.assertEqual(
            ((1156, 0), (1157, 12), (1156, 24), (1157, 36)), kernel.vgpu_locations(L40S)
        )
        self.assertEqual(40 * GB, self.board()[3])
        self._run_periodics()
        self.assertEqual([], host_audit.audit_of(self, "host1"))

    def guest_domain_vfs(self, server):
        instance = objects.Instance.get_by_uuid(context.get_admin_context(), server["id"])
        guest = self.computes["host1"].driver._host.get_guest(instance)
        return test_vgpu.guest_xml.pci_vfs(test_vgpu.guest_xml.parse(guest.get_xml_desc()))

    def test_a_host_reboot_brings_back_vfs_then_mode_then_types_then_guests(self):
        servers = [self.boot(4), self.boot(12)]
        before = self.typed_vfs()
        held = [self.guest_domain_vfs(server) for server in servers]
        kernel = self.kernels["host1"]
        kernel.reboot()
        kernel.set_vfs(L40S, 16)  # the VFs first: the boot unit, by NVIDIA's sriov-manage
        self.assertEqual(({}, False), (self.typed_vfs(), kernel.heterogeneous_mode(L40S)))
        self.restart_compute_service("host1")
        # Then the mode, then the types: written in equal-size mode, the first
        # type would have locked the board to its size and the other failed.
        self.assertTrue(kernel.heterogeneous_mode(L40S))
        self.assertEqual(before, self.typed_vfs())
        self.assertIn(
            f"GPU {L40S} switched to mixed-size mode before its vGPUs are restored",
            self.stdlog.logger.output,
        )
        for server, vfs in zip(servers, held, strict=True):  # then the guests
            self._reboot_server(server, hard=True)
            self.assertEqual(vfs, self.guest_domain_vfs(server))
        self.assertEqual(16 * GB, self.board()[3])
        self.assertEqual([], host_audit.audit_of(self, "host1"))


BLACKWELL = board_tables.board("rtx-pro-6000-blackwell-se")
# The 96 GB board's 24 and 32 GB types (type numbers illustrative).
BLACKWELL_SIZES = {"nvidia-2007": 24, "nvidia-2008": 32}


def blackwell_host():
    """A host whose one GPU is the 96 GB Blackwell board under vendor VFIO,
    every type of its family offered."""
    return board_tables.host_profile(BLACKWELL, L40S, version="580.65.05", device="0x2bb5")


class BlackwellMixedSizeTests(test_vgpu.VGPUDriverTestBase):
    """A 96 GB Blackwell board serving 24 and 32 GB vGPUs: its placements
    are evenly spaced (24 GB at 0, 24, 48, 72; 32 GB at 0, 32, 64), so they
    do not nest, and a free 32 GB region at 32 holds no 24 GB vGPU."""

    ENABLED_TYPES = ",".join(BLACKWELL_SIZES)

    def setUp(self):
        super().setUp()
        for type_id in BLACKWELL_SIZES:
            self.flags(device_addresses=[L40S], group=f"mdev_{type_id}")
        root = os.path.join(self.tmp, "host1", "sys")
        self.kernels["host1"] = fakekernel.FakeKernel.build(root, blackwell_host())
        self.kernels["host1"].set_mixed_sizes(L40S, True)
        self.start_vgpu_compute("host1")

    def flavor(self, type_id, count=1):
        return vgpu_flavor(self, type_id, BLACKWELL_SIZES[type_id], count)

    def located(self):
        """``((type number, placement ID), ...)`` of the board's vGPUs, as
        each VF's ``nvidia/placement_id`` says."""
        return tuple(sorted(self.kernels["host1"].vgpu_locations(L40S), key=lambda v: v[1]))

    def test_a_free_32_gb_region_takes_no_24_gb_vgpu(self):
        thirty_two = self.flavor("nvidia-2008")
        servers = [
            self._create_server(flavor_id=thirty_two, networks="none", host="host1")
            for _ in range(3)
        ]
        self.assertEqual(((2008, 0), (2008, 32), (2008, 64)), self.located())
        self._delete_server(servers[1])
        self._run_periodics()
        # 32 GB free at 32-63, the largest size configured fits there, but
        # no 24 GB placement (24 and 48 straddle the guests at 0 and 64).
        found = self._get_provider_inventory(self._get_provider_uuid_by_name(PROVIDER))
        twenty_four = found[size_classes.class_name(24)]
        self.assertEqual(
            (0, 32 * GB),
            (
                twenty_four["total"] - twenty_four["reserved"],
                found[RC]["total"] - found[RC]["reserved"] - 64 * GB,
            ),
        )
        refused = self._create_server(
            flavor_id=self.flavor("nvidia-2007"),
            networks="none",
            host="host1",
            expected_state="ERROR",
        )
        self.assertIn("No valid host", refused["fault"]["message"])
        self.assertEqual(((2008, 0), (2008, 64)), self.located())
        self._create_server(flavor_id=thirty_two, networks="none", host="host1")
        self.assertEqual(((2008, 0), (2008, 32), (2008, 64)), self.located())
        self.assertEqual([], host_audit.audit_of(self, "host1"))


class MixedSizeLiveMigrationTests(test_vendor_vfio_live_migration.VendorVfioLiveMigrationTestBase):
    """Both hosts' L40S serve 8 and 12 GB in mixed-size mode: a 12 GB guest
    moves to a VF typed 12 GB beside the destination's 8 GB guest."""

    ENABLED_TYPES = SOURCE_TYPES = DEST_TYPES = "nvidia-1156,nvidia-1157"

    def start_host(self, hostname, enabled_types):
        self.flags(enabled_mdev_types=enabled_types, group="devices")
        for type_id in enabled_types.split(","):
            self.flags(device_addresses=[L40S], group=f"mdev_{type_id}")
        self.build_vgpu_host(hostname, "l40s-vfio").set_mixed_sizes(L40S, True)
        self.start_vgpu_compute(hostname)
        return self.computes[hostname]

    def mixed_flavor(self, type_id):
        return self._create_flavor(
            memory_mb=512,
            vcpu=1,
            disk=1,
            ephemeral=0,
            name=f"vgpu-{type_id}",
            extra_spec={
                f"resources:{RC}": str(SIZES[type_id] * GB),
                f"trait:{inventory.type_traits(type_id, None)[0]}": "required",
            },
        )

    def usage(self, hostname):
        rp = self._get_provider_uuid_by_name(f"{hostname}_pci_0000_c1_00_0")
        return self._get_provider_usages(rp).get(RC, 0)

    def test_the_guest_moves_to_a_vf_of_its_type(self):
        self.flavor = self.mixed_flavor("nvidia-1157")
        resident = self._create_server(
            flavor_id=self.mixed_flavor("nvidia-1156"), networks="none", host="dest"
        )
        (on_source,) = self.boot()
        self.assertEqual({on_source: "nvidia-1157"}, self.typed_vfs("src"))
        self._live_migrate(self.server, "completed")
        self.assertEqual("dest", self.api.get_server(self.server["id"])["OS-EXT-SRV-ATTR:host"])
        (arrived,) = [vf for vf, _state in self.claims("dest", self.server["id"])]
        self.assertEqual("nvidia-1157", self.typed_vfs("dest")[arrived])
        self.assertEqual(2, len(self.typed_vfs("dest")))
        # The source's VF goes with its guest: a mixed-size board keeps no
        # typed VF for reuse.
        self.assertEqual(
            ({}, 0, 20 * GB), (self.typed_vfs("src"), self.usage("src"), self.usage("dest"))
        )
        self.assertEqual(1, len(self.claims("dest", resident["id"])))
        self._run_periodics()
        self.assert_audit_clean()
