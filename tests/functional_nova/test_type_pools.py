"""Type pools through nova's services: a board takes the size of its first
vGPU, gives it up with its last, and the board filter packs one size.

Two computes with two L40S each, every board listed under three NVIDIA
types (4, 8 and 24 GB) with ``[devices] shared_board_mode = pool``: the
boards stay in equal-size mode, each provider offers every size while its
board is empty and only its vGPUs' size once it holds one.  The scheduler
runs ``VGPUBoardFilter``, so a request of a size some board already holds
goes there before it types an empty board.
"""

import glob
import os
import urllib.parse

from nova import conf

from tests.functional_nova import host_audit
from tests.functional_nova import test_board_choice
from tests.functional_nova import test_mixed_size
from tests.functional_nova import test_vgpu
from vgpu_driver import framebuffer
from vgpu_driver import guest as guest_xml
from vgpu_driver import inventory
from vgpu_driver import size_classes
from vgpu_driver.fake import fakekernel

CONF = conf.CONF
HOSTS = ("host1", "host2")
BOARDS = test_board_choice.BOARDS
SIZES = {"nvidia-1155": 4, "nvidia-1156": 8, "nvidia-1159": 24}
TYPES = {gb: type_id for type_id, gb in SIZES.items()}
# NVIDIA's maximum of each size on an L40S in equal-size mode (the profile).
MOST = {4: 12, 8: 6, 24: 2}
RC = framebuffer.RESOURCE_CLASS
GB = framebuffer.SLOT_MIB
PIN = test_board_choice.PIN


class TypePoolTestBase(test_vgpu.VGPUDriverTestBase):
    """Two hosts of two L40S pool boards each, the board filter on."""

    ENABLED_TYPES = ",".join(SIZES)

    def _setup_scheduler_service(self):
        self.flags(
            available_filters=[*CONF.filter_scheduler.available_filters, test_board_choice.FILTER],
            enabled_filters=[*CONF.filter_scheduler.enabled_filters, "VGPUBoardFilter"],
            group="filter_scheduler",
        )
        return super()._setup_scheduler_service()

    def setUp(self):
        super().setUp()
        self.flags(shared_board_mode="pool", group="devices")
        for type_id in SIZES:
            self.flags(device_addresses=list(BOARDS), group=f"mdev_{type_id}")
        for host in HOSTS:
            root = os.path.join(self.tmp, host, "sys")
            # Equal-size mode, as the vGPU manager starts every board.
            self.kernels[host] = fakekernel.FakeKernel.build(
                root, test_board_choice.two_boards(host)
            )
            self.start_vgpu_compute(host)
        self.flavors = {gb: test_mixed_size.vgpu_flavor(self, t, gb, 1) for t, gb in SIZES.items()}

    def boot(self, gb, **kwargs):
        return self._create_server(flavor_id=self.flavors[gb], networks="none", **kwargs)

    def boot_pinned(self, host, board, gb):
        """A ``gb`` GB vGPU on ``board`` of ``host``: a flavor requiring a
        trait that board carries for the time of the boot."""
        spec = size_classes.flavor_spec(
            inventory.type_traits(TYPES[gb], None)[0], gb, gb * GB, 1, RC
        )
        flavor = self._create_flavor(
            memory_mb=512,
            vcpu=1,
            disk=1,
            ephemeral=0,
            name=f"vgpu-{gb}g-pinned",
            extra_spec={**spec, f"trait{size_classes.GROUP}:{PIN}": "required"},
        )
        self.placement.put(f"/traits/{PIN}", None, version="1.6")
        rp = self.provider(host, board)
        traits = self._get_provider_traits(rp)
        self._set_provider_traits(rp, [*traits, PIN])
        server = self._create_server(flavor_id=flavor, networks="none", host=host)
        self._set_provider_traits(rp, traits)
        return server

    def provider(self, host, board):
        return self._get_provider_uuid_by_name(
            f"{host}_pci_" + board.replace(":", "_").replace(".", "_")
        )

    def offered(self, host, board):
        """``(framebuffer, {GB: size class})`` of the board's provider, each
        as Placement holds it: ``(total, reserved, used)``."""
        rp = self.provider(host, board)
        inventories = self._get_provider_inventory(rp)
        usages = self._get_provider_usages(rp)

        def held(rc):
            return inventories[rc]["total"], inventories[rc]["reserved"], usages.get(rc, 0)

        sizes = {gb: held(size_classes.class_name(gb)) for gb in MOST}
        self.assertEqual(
            sorted([RC, *(size_classes.class_name(gb) for gb in MOST)]), sorted(inventories)
        )
        return held(RC), sizes

    def assert_empty(self, host, board):
        """Nothing typed on the board, and every size offered in full."""
        self.assertEqual({}, self.vf_types(host, board))
        self.assertEqual(
            ((48 * GB, 0, 0), {gb: (most, 0, 0) for gb, most in MOST.items()}),
            self.offered(host, board),
        )

    def assert_holds(self, host, board, gb, count):
        """``count`` VFs of the board typed ``gb`` GB, Placement counting
        them, and the board's other sizes reserved in full."""
        self.assertEqual([TYPES[gb]] * count, list(self.vf_types(host, board).values()))
        sizes = {
            size: (most, 0, count) if size == gb else (most, most, 0) for size, most in MOST.items()
        }
        self.assertEqual(((48 * GB, 0, count * gb * GB), sizes), self.offered(host, board))

    def vf_types(self, host, board):
        """``{VF: type id}`` of the board's VFs whose
        ``nvidia/current_vgpu_type`` is set, read from the host's sysfs."""
        pf = os.path.join(self.tmp, host, "sys", "bus", "pci", "devices", board)
        found = {}
        for link in sorted(glob.glob(os.path.join(pf, "virtfn*"))):
            with open(os.path.join(link, "nvidia", "current_vgpu_type"), encoding="ascii") as f:
                number = f.read().strip()
            if number != "0":
                found[os.path.basename(os.path.realpath(link))] = f"nvidia-{number}"
        return found

    def placed(self, server):
        """``(host, board, VF)`` of the server's one vGPU: its host as nova's
        API says, the VF as its domain's PCI hostdev, checked to be typed
        in sysfs on that board."""
        host = self.api.get_server(server["id"])["OS-EXT-SRV-ATTR:host"]
        (guest,) = [
            g
            for g in self.computes[host].driver._host.list_guests(only_running=False)
            if g.uuid == server["id"]
        ]
        (vf,) = guest_xml.pci_vfs(guest_xml.parse(guest.get_xml_desc()))
        (board,) = [b for b in BOARDS if vf in self.vf_types(host, b)]
        return host, board, vf

    def placements_first_board(self, host, gb):
        """The board of Placement's first candidate on ``host`` for one
        ``gb`` GB vGPU, as nova's scheduler would claim it."""
        query = size_classes.candidates_query(
            size_classes.flavor_spec(inventory.type_traits(TYPES[gb], None)[0], gb, gb * GB, 1, RC)
        )
        query.update(
            resources="VCPU:1,MEMORY_MB:512,DISK_GB:1", in_tree=self.compute_rp_uuids[host]
        )
        found = self.placement.get(
            "/allocation_candidates?" + urllib.parse.urlencode(query), version="1.39"
        ).body["allocation_requests"]
        by_provider = {self.provider(host, b): b for b in BOARDS}
        return next(by_provider[rp] for rp in found[0]["allocations"] if rp in by_provider)

    def assert_audit_clean(self):
        for host in HOSTS:
            self.assertEqual([], host_audit.audit_of(self, host), host)


class TypePoolTests(TypePoolTestBase):
    def test_a_board_takes_the_size_of_its_first_vgpu_until_its_last_goes(self):
        for host in HOSTS:
            for board in BOARDS:
                self.assert_empty(host, board)
        four = self.boot(4)
        host, board, vf = self.placed(four)
        (other,) = set(BOARDS) - {board}
        self.assertEqual({vf: "nvidia-1155"}, self.vf_types(host, board))
        self.assert_holds(host, board, 4, 1)
        # The board refuses 8 GB now: an 8 GB vGPU on its host types the other.
        eight = self.boot(8, host=host)
        self.assertEqual((host, other), self.placed(eight)[:2])
        self.assert_holds(host, other, 8, 1)
        self.assert_holds(host, board, 4, 1)
        for elsewhere in set(HOSTS) - {host}:
            for each in BOARDS:
                self.assert_empty(elsewhere, each)

        # Their last vGPUs gone, the VFs' types are cleared and both boards
        # offer every size again, once nova has deleted each server (its
        # resource tracker's update sends the inventory, no periodic) ...
        self._delete_server(four)
        self._delete_server(eight)
        for each in BOARDS:
            self.assert_empty(host, each)
        # ... so the board of 4 GB takes 8 GB.
        again = self.boot_pinned(host, board, 8)
        self.assertEqual((host, board), self.placed(again)[:2])
        self.assert_holds(host, board, 8, 1)
        self.assert_empty(host, other)
        self.assert_audit_clean()

    def test_a_vgpu_goes_to_the_board_already_holding_its_size(self):
        host = "host2"
        # Placement's first board for 4 GB stays empty; the other holds one.
        first = self.placements_first_board(host, 4)
        (typed,) = set(BOARDS) - {first}
        self.boot_pinned(host, typed, 4)
        self.assert_holds(host, typed, 4, 1)
        # nova's scheduler alone would type the empty board for 4 GB.
        self.assertEqual(first, self.placements_first_board(host, 4))

        second = self.boot(4, host=host)
        self.assertEqual((host, typed), self.placed(second)[:2])
        self.assert_holds(host, typed, 4, 2)
        self.assert_empty(host, first)
        # The empty board stayed whole for a size the other refuses.
        eight = self.boot(8, host=host)
        self.assertEqual((host, first), self.placed(eight)[:2])
        self.assert_holds(host, first, 8, 1)
        self.assert_audit_clean()
