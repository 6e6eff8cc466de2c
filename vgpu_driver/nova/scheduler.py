"""A nova scheduler filter that puts first, on each host, the board a
vGPU request fragments least (:mod:`vgpu_driver.board_choice`), and a
weigher that prefers the host whose best board fits it so
(:mod:`vgpu_driver.board_stats`).

nova's scheduler claims the first of the chosen host's allocation
candidates, in Placement's order, which among one host's boards is
arbitrary.  :class:`VGPUBoardFilter` passes every host and reorders its
candidates by the boards they take.

The boards' counts are read from Placement (one request per host: its
allocation candidates' provider summaries, in its tree only) when the
scheduler takes a host's first candidate, not when the filter runs: the
filter runs on every host that got this far, the scheduler claims on one
(and names two or three alternates), so the reads are paid for the hosts
used only.  So the filter must come **last** in
``[filter_scheduler] enabled_filters``: a filter after it that keeps only
some candidates (``PciPassthroughFilter``, ``NUMATopologyFilter``) hands the
scheduler a fresh list in Placement's order.  A read that fails leaves
Placement's order and is logged; scheduling never fails for it.
"""

from __future__ import annotations

import urllib.parse

import nova.conf
from keystoneauth1 import exceptions as ks_exceptions
from nova.scheduler import filters
from nova.scheduler import weights
from nova.scheduler.client import report
from oslo_log import log as logging

from vgpu_driver import board_choice
from vgpu_driver import board_stats
from vgpu_driver.conf import vgpu as vgpu_conf
from vgpu_driver.nova import compat

CONF = nova.conf.CONF
# The weigher's multiplier, in [vgpu], registered as the compute's are.
vgpu_conf.register_opts(CONF)

LOG = logging.getLogger(__name__)

# in_tree (1.31), and every class of every provider of a tree in the
# allocation candidates' provider summaries (1.27).
PLACEMENT_VERSION = "1.39"


def boards_of(candidate, host_uuid):
    """The providers of ``candidate`` other than the compute node that it
    asks vGPUs (or their size or framebuffer classes) of, sorted."""
    return tuple(
        sorted(
            rp_uuid
            for rp_uuid, allocation in candidate["allocations"].items()
            if rp_uuid != host_uuid
            and any(board_choice.is_vgpu_class(rc) for rc in allocation["resources"])
        )
    )


class PlacementCounts:
    """Each board's :class:`~vgpu_driver.board_choice.BoardCounts`, read from
    Placement through nova's own client (its auth, its retries)."""

    def __init__(self, client=None):
        self._client = client

    @property
    def client(self):
        if self._client is None:
            self._client = report.report_client_singleton()
        return self._client

    def _get(self, url):
        response = self.client.get(url, version=PLACEMENT_VERSION)
        if not response:
            raise LookupError(f"GET {url}: {response.status_code} {response.text[:200]}")
        return response.json()

    def read(self, boards, host_uuid=None, candidate=None):
        """``{board: BoardCounts}``, or None if any read failed.

        With the host and one of its candidates, one request reads them
        all: the host's allocation candidates for what that candidate asks
        of its first board, whose provider summaries give every provider of
        the host's tree; a board missing from them (it filled up meanwhile)
        is read on its own, its inventories and usages."""
        counts = {}
        try:
            if candidate is not None:
                counts = self._summaries(host_uuid, candidate, boards)
            for rp_uuid in boards:
                if rp_uuid not in counts:
                    counts[rp_uuid] = self._one(rp_uuid)
        except (LookupError, ks_exceptions.ClientException) as exc:
            LOG.warning("Boards keep Placement's order: %s", exc)
            return None
        return counts

    def _summaries(self, host_uuid, candidate, boards):
        asked = candidate["allocations"][boards_of(candidate, host_uuid)[0]]["resources"]
        query = urllib.parse.urlencode(
            {
                "resources": ",".join(f"{rc}:{n}" for rc, n in sorted(asked.items())),
                "in_tree": host_uuid,
                "limit": 1,
            }
        )
        summaries = self._get(f"/allocation_candidates?{query}")["provider_summaries"]
        return {
            rp_uuid: board_choice.counts_of_summary(summaries[rp_uuid])
            for rp_uuid in boards
            if rp_uuid in summaries
        }

    def _one(self, rp_uuid):
        base = f"/resource_providers/{rp_uuid}"
        return board_choice.counts_of(
            self._get(f"{base}/inventories")["inventories"],
            self._get(f"{base}/usages")["usages"],
        )


class BoardOrderedCandidates(list):
    """A host's allocation candidates, ordered by their boards the first
    time one is taken by index (the scheduler's ``[0]``), not before."""

    def __init__(self, candidates, host_uuid, counts):
        list.__init__(self, candidates)
        self._host_uuid = host_uuid
        self._counts = counts
        self._ordered = False

    def __getitem__(self, index):
        if not self._ordered:
            self._ordered = True
            self._order()
        return list.__getitem__(self, index)

    def _order(self):
        boards_by_candidate = [boards_of(c, self._host_uuid) for c in self]
        counts = self._counts.read(
            sorted({b for found in boards_by_candidate for b in found}),
            self._host_uuid,
            list.__getitem__(self, 0),
        )
        if counts is None:
            return
        shares = board_choice.demand(counts.values())
        keyed = [
            (tuple(board_choice.rank(counts[b], shares) for b in found), index, candidate)
            for index, (found, candidate) in enumerate(zip(boards_by_candidate, self, strict=True))
        ]
        keyed.sort(key=lambda item: item[:2])
        self[:] = [candidate for _key, _index, candidate in keyed]
        LOG.debug(
            "Host %s: candidates' boards in order %s",
            self._host_uuid,
            [boards_of(c, self._host_uuid) for c in self],
        )


class VGPUBoardFilter(filters.BaseHostFilter):
    """Passes every host; puts first the candidate whose vGPUs take the
    board they fragment least.  List it last in ``enabled_filters``."""

    # A rebuild keeps the instance's allocation: there is nothing to order.
    RUN_ON_REBUILD = False

    def __init__(self, counts=None):
        super().__init__()
        compat.check()  # the scheduler stops at start on a nova we do not support
        self._counts = counts or PlacementCounts()

    def host_passes(self, host_state, spec_obj):
        candidates = list(host_state.allocation_candidates or ())
        boards = {b for c in candidates for b in boards_of(c, host_state.uuid)}
        if len(boards) > 1:
            host_state.allocation_candidates = BoardOrderedCandidates(
                candidates, host_state.uuid, self._counts
            )
        return True


class VGPUBoardWeigher(weights.BaseHostWeigher):
    """Prefers the host whose best board for a request of vGPU size
    classes breaks the fewest large rooms, then leaves the least free
    room, from what each host publishes of its boards
    (:data:`vgpu_driver.board_stats.STAT`, as old as its last periodic
    update).  A host that publishes none, or none that fits, weighs least;
    a request without size classes weighs every host the same."""

    def __init__(self):
        super().__init__()
        compat.check()

    def weight_multiplier(self, host_state):
        return CONF.vgpu.board_weight_multiplier

    def _weigh_object(self, host_state, weight_properties):
        flavor = getattr(weight_properties, "flavor", None)
        wanted = board_stats.requested_sizes(getattr(flavor, "extra_specs", None) or {})
        if not wanted:
            return 0.0
        boards = board_stats.decode((host_state.stats or {}).get(board_stats.STAT))
        return board_stats.host_weight(boards.values(), wanted) or 0.0
