"""nova's scheduler with ``VGPUBoardFilter``: a vGPU lands on the board of
its host it fragments least.

One host, two L40S boards in mixed-size mode.  Placement offers both for a
small vGPU, nova's scheduler claims its host's first candidate; the filter
puts first the board whose large rooms are already broken, so the other
stays whole for a large request.
"""

import copy
import urllib.parse

from nova import conf
from nova.scheduler.client import report

from tests.functional_nova import host_audit
from tests.functional_nova import test_mixed_size
from tests.functional_nova import test_vgpu
from vgpu_driver import inventory
from vgpu_driver import size_classes
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles
from vgpu_driver.nova import scheduler

CONF = conf.CONF
BOARDS = ("0000:c1:00.0", "0000:c2:00.0")
SIZES = test_mixed_size.SIZES
TYPES = {gb: type_id for type_id, gb in SIZES.items()}
GB = test_mixed_size.GB
# A trait one board carries for a while, so that a flavor lands there.
PIN = "CUSTOM_TEST_PINNED_HERE"
FILTER = "vgpu_driver.nova.scheduler.VGPUBoardFilter"


def two_boards(hostname):
    """Two copies of the ``l40s-vfio`` board, at :data:`BOARDS`."""
    one = profiles.load("l40s-vfio")
    copies = []
    for address in BOARDS:
        board = copy.deepcopy(one)
        board["gpus"][0]["address"] = address
        copies.append(board)
    return profiles.combine(hostname, *copies)


class BoardChoiceTests(test_vgpu.VGPUDriverTestBase):
    ENABLED_TYPES = ",".join(SIZES)

    def _setup_scheduler_service(self):
        self.flags(
            available_filters=[*CONF.filter_scheduler.available_filters, FILTER],
            enabled_filters=[*CONF.filter_scheduler.enabled_filters, "VGPUBoardFilter"],
            group="filter_scheduler",
        )
        return super()._setup_scheduler_service()

    def setUp(self):
        super().setUp()
        for type_id in SIZES:
            self.flags(device_addresses=list(BOARDS), group=f"mdev_{type_id}")
        root = f"{self.tmp}/host1/sys"
        kernel = self.kernels["host1"] = fakekernel.FakeKernel.build(root, two_boards("host1"))
        for board in BOARDS:
            kernel.set_mixed_sizes(board, True)
        self.start_vgpu_compute("host1")
        pinned = size_classes.flavor_spec(
            inventory.type_traits(TYPES[12], None)[0], 12, 12 * GB, 1, test_mixed_size.RC
        )
        self.pinned_12_gb = self._create_flavor(
            memory_mb=512,
            vcpu=1,
            disk=1,
            ephemeral=0,
            name="vgpu-12g-pinned",
            extra_spec={**pinned, f"trait{size_classes.GROUP}:{PIN}": "required"},
        )
        self.flavors = {
            (gb, count): test_mixed_size.vgpu_flavor(self, type_id, gb, count)
            for type_id, gb in SIZES.items()
            for count in (1, 2)
        }

    def boot(self, gb, count=1, **kwargs):
        return self._create_server(
            flavor_id=self.flavors[gb, count], networks="none", host="host1", **kwargs
        )

    def locations(self):
        """``{board: ((type, placement ID), ...)}`` as the boards hold them."""
        return {b: self.kernels["host1"].vgpu_locations(b) for b in BOARDS}

    def provider(self, board):
        return self._get_provider_uuid_by_name(
            "host1_pci_" + board.replace(":", "_").replace(".", "_")
        )

    def query(self, gb):
        """Placement's allocation-candidates query for one ``gb`` GB vGPU."""
        query = size_classes.candidates_query(
            size_classes.flavor_spec(
                inventory.type_traits(TYPES[gb], None)[0], gb, gb * GB, 1, test_mixed_size.RC
            )
        )
        query["resources"] = "VCPU:1,MEMORY_MB:512,DISK_GB:1"
        return query

    def placements_first_board(self, gb):
        """The board of Placement's first candidate for a ``gb`` GB vGPU."""
        found = self.placement.get(
            "/allocation_candidates?" + urllib.parse.urlencode(self.query(gb)), version="1.39"
        ).body["allocation_requests"]
        by_provider = {self.provider(b): b for b in BOARDS}
        return next(by_provider[rp] for rp in found[0]["allocations"] if rp in by_provider)

    def test_a_small_vgpu_goes_where_the_large_rooms_are_broken(self):
        # A 12 GB vGPU on the board Placement would not offer first for
        # 4 GB (put there by a trait only that board carries for a while).
        first = self.placements_first_board(4)
        (broken,) = set(BOARDS) - {first}
        self.placement.put(f"/traits/{PIN}", None, version="1.6")
        rp = self.provider(broken)
        traits = self._get_provider_traits(rp)
        self._set_provider_traits(rp, [*traits, PIN])
        self._create_server(flavor_id=self.pinned_12_gb, networks="none", host="host1")
        self._set_provider_traits(rp, traits)
        self.assertEqual(((1157, 0),), self.locations()[broken])
        # nova's scheduler alone would claim the whole board for 4 GB.
        self.assertEqual(first, self.placements_first_board(4))

        # 4 GB vGPUs go to the broken board, beside the 12 GB one (slots
        # 12 and 20), leaving the empty board whole ...
        for _ in range(2):
            self.boot(4)
        self.assertEqual(((1157, 0), (1155, 12), (1155, 20)), self.locations()[broken])
        self.assertEqual((), self.locations()[first])
        # ... so two 24 GB vGPUs still fit, on it.
        self.boot(24, count=2)
        self.assertEqual(((1159, 0), (1159, 24)), self.locations()[first])
        self.assertEqual([], host_audit.audit_of(self, "host1"))

    def test_every_request_that_fits_is_served(self):
        """The filter loses no candidate: 12 GB vGPUs fill both boards."""
        for _ in range(4):
            self.boot(12)
        held = [len(v) for v in self.locations().values()]
        self.assertEqual(4, sum(held))
        for _ in range(4):
            self.boot(12)
        self.assertEqual([4, 4], [len(v) for v in self.locations().values()])
        refused = self.boot(12, expected_state="ERROR")
        self.assertIn("No valid host", refused["fault"]["message"])
        self.assertEqual([], host_audit.audit_of(self, "host1"))

    def candidates(self):
        """The host's allocation candidates for a 4 GB vGPU, as nova's
        scheduler gets them (one per board), in Placement's order."""
        return self.placement.get(
            "/allocation_candidates?" + urllib.parse.urlencode(self.query(4)), version="1.39"
        ).body["allocation_requests"]

    def test_boards_are_read_when_the_first_candidate_is_taken_only(self):
        host = self.compute_rp_uuids["host1"]
        reads = []

        class Counted(scheduler.PlacementCounts):
            def read(self, boards, *args):
                reads.append(tuple(boards))
                return super().read(boards, *args)

        candidates = self.candidates()
        self.assertEqual(2, len(candidates))
        ordered = scheduler.BoardOrderedCandidates(candidates, host, Counted())
        self.assertEqual(2, len(ordered))
        self.assertEqual(candidates, list(iter(ordered)))
        self.assertEqual([], reads)
        first = ordered[0]
        self.assertEqual([tuple(sorted(self.provider(b) for b in BOARDS))], reads)
        self.assertIs(first, ordered[0])
        self.assertEqual(1, len(reads))

    def test_one_request_reads_what_each_boards_records_say(self):
        """The host's provider summaries give each board's counts as its
        own inventories and usages do, with vGPUs held on one board."""
        self.boot(12)
        self.boot(4)
        host = self.compute_rp_uuids["host1"]
        boards = sorted(self.provider(b) for b in BOARDS)
        urls = []

        class Counted:
            def get(self, url, **kwargs):
                urls.append(url)
                return report.report_client_singleton().get(url, **kwargs)

        counts = scheduler.PlacementCounts(Counted())
        by_summary = counts.read(boards, host, self.candidates()[0])
        self.assertEqual(1, len(urls))
        self.assertTrue(urls[0].startswith("/allocation_candidates?"))
        self.assertEqual(counts.read(boards), by_summary)
        self.assertEqual(1 + 2 * len(boards), len(urls))
        # Both vGPUs on one board (the filter put the 4 GB beside the 12 GB).
        self.assertEqual([0, 2], sorted(sum(c.used.values()) for c in by_summary.values()))

    def test_a_failed_read_keeps_placements_order(self):
        host = self.compute_rp_uuids["host1"]
        gone = "00000000-0000-0000-0000-00000000dead"
        self.assertIsNone(scheduler.PlacementCounts().read([self.provider(BOARDS[0]), gone]))
        candidates = self.candidates()
        # A candidate naming a board Placement no longer knows.
        stale = copy.deepcopy(candidates[-1])
        (board,) = scheduler.boards_of(stale, host)
        stale["allocations"][gone] = stale["allocations"].pop(board)
        ordered = scheduler.BoardOrderedCandidates(
            [*candidates, stale], host, scheduler.PlacementCounts()
        )
        self.assertEqual([*candidates, stale], [ordered[i] for i in range(3)])
        self.assertIn("Boards keep Placement's order", self.stdlog.logger.output)

    def test_the_compute_nodes_own_resources_are_no_board(self):
        host = self.compute_rp_uuids["host1"]
        for candidate in self.candidates():
            self.assertIn(host, candidate["allocations"])
            (board,) = scheduler.boards_of(candidate, host)
            self.assertIn(board, {self.provider(b) for b in BOARDS})
