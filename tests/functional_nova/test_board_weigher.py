"""nova's scheduler with ``VGPUBoardWeigher``: a vGPU goes to the host whose
board already holds its size, though nova's weighers would spread it.

Two computes of two L40S type-pool boards each (as
:mod:`tests.functional_nova.test_type_pools`), the board filter on, and
nova's own weighers (``nova.scheduler.weights.all_weighers``) with or
without ours.  host1 holds one 4 GB guest, so one of its boards is typed
4 GB and nova's RAM, CPU and disk weighers prefer the emptier host2.  Each
compute publishes its boards in its compute node's stats at its periodic
update; the scheduler reads them from the compute nodes.

``[vgpu] board_weight_multiplier`` keeps its default, 1.0, as do nova's
weighers: nova's RAM, CPU and disk weighers weigh each host's free
resources against zero, so one small guest moves the hosts' weights apart
by a sliver (host2 3.0, host1 2.996 here), while ours spans 0 to 1 between
the host whose best board fits the request worst and the one it fits best.
"""

import json
import os

from nova import context as nova_context
from nova import objects

from tests.functional_nova import test_type_pools
from vgpu_driver import board_stats
from vgpu_driver import size_classes

WEIGHER = "vgpu_driver.nova.scheduler.VGPUBoardWeigher"
NOVAS = "nova.scheduler.weights.all_weighers"
FOUR, EIGHT, TWENTY_FOUR = (size_classes.class_name(gb) for gb in (4, 8, 24))
EMPTY = {
    "free": {FOUR: 12, EIGHT: 6, TWENTY_FOUR: 2},
    "used": {FOUR: 0, EIGHT: 0, TWENTY_FOUR: 0},
}


def four_gb_board(used):
    """A board typed 4 GB holding ``used`` vGPUs, as published."""
    return {
        "free": {FOUR: 12 - used, EIGHT: 0, TWENTY_FOUR: 0},
        "used": {FOUR: used, EIGHT: 0, TWENTY_FOUR: 0},
    }


class BoardWeigherTestBase(test_type_pools.TypePoolTestBase):
    WEIGHERS = (NOVAS, WEIGHER)

    def _setup_scheduler_service(self):
        self.flags(weight_classes=list(self.WEIGHERS), group="filter_scheduler")
        return super()._setup_scheduler_service()

    def published(self, host):
        """``{board: {"free": ..., "used": ...}}`` of the host's
        ``vgpu_boards`` stat, as its compute node holds it in the database
        the scheduler reads."""
        ctx = nova_context.get_admin_context()
        with nova_context.target_cell(ctx, self.host_mappings[host].cell_mapping) as cctxt:
            node = objects.ComputeNode.get_by_uuid(cctxt, self.compute_rp_uuids[host])
        self.assertIn(board_stats.STAT, node.stats, host)
        stat = json.loads(node.stats[board_stats.STAT])
        return {
            board: stat[f"{host}_pci_" + board.replace(":", "_").replace(".", "_")]
            for board in test_type_pools.BOARDS
        }

    def second_four_gb_goes_to(self):
        """One 4 GB guest on host1, the computes' periodic update, then the
        host nova's scheduler picks for a second 4 GB guest."""
        first = self.boot(4, host="host1")
        _host, typed, _vf = self.placed(first)
        self.assert_holds("host1", typed, 4, 1)
        self._run_periodics()
        second = self.boot(4)
        return typed, self.placed(second)


class BoardWeigherTests(BoardWeigherTestBase):
    def test_a_vgpu_goes_to_the_host_whose_board_holds_its_size(self):
        typed, (host, board, _vf) = self.second_four_gb_goes_to()
        self.assertEqual(("host1", typed), (host, board))
        self.assert_holds("host1", typed, 4, 2)
        for each in test_type_pools.BOARDS:
            self.assert_empty("host2", each)
        self.assert_audit_clean()

    def test_each_host_publishes_its_boards_at_its_periodic_update(self):
        self._run_periodics()
        for host in test_type_pools.HOSTS:
            self.assertEqual(dict.fromkeys(test_type_pools.BOARDS, EMPTY), self.published(host))
        _host, typed, _vf = self.placed(self.boot(4, host="host1"))
        (other,) = set(test_type_pools.BOARDS) - {typed}
        # As old as the last periodic update: the boot does not refresh it.
        self.assertEqual(dict.fromkeys(test_type_pools.BOARDS, EMPTY), self.published("host1"))
        self._run_periodics()
        self.assertEqual({typed: four_gb_board(1), other: EMPTY}, self.published("host1"))
        self.assertEqual(dict.fromkeys(test_type_pools.BOARDS, EMPTY), self.published("host2"))

    def test_a_compute_started_again_publishes_its_boards_at_once(self):
        _host, typed, _vf = self.placed(self.boot(4, host="host1"))
        (other,) = set(test_type_pools.BOARDS) - {typed}
        # The computes share one CONF: point [vgpu] back at host1's.
        self.flags(
            sysfs_root=os.path.join(self.tmp, "host1", "sys"),
            state_dir=os.path.join(self.tmp, "host1", "state"),
            group="vgpu",
        )
        self.restart_compute_service("host1")
        # Its update at start, not a periodic one a minute later, publishes
        # the board it holds: until then the weigher would put it last.
        self.assertEqual({typed: four_gb_board(1), other: EMPTY}, self.published("host1"))


class NovaWeighersTests(BoardWeigherTestBase):
    """The same hosts with nova's weighers alone: they spread."""

    WEIGHERS = (NOVAS,)

    def test_nova_s_weighers_alone_send_the_vgpu_to_the_emptier_host(self):
        _typed, (host, _board, _vf) = self.second_four_gb_goes_to()
        self.assertEqual("host2", host)
