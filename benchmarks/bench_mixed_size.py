"""Mixed-size boards against the best static equal-size split, on one seeded trace.

A fleet of L40S boards (48 GB, Ada, 16 VFs each, vendor-specific VFIO) on
one fake host serves a seeded trace of vGPU requests of several sizes that
arrive and leave.  The same trace is served twice, each time through a real
Placement (:class:`vgpu_driver.placement_service.EmbeddedPlacement` on
127.0.0.1), the real provider sync, the real planner and vendor-VFIO
strategy writing each VF's type on the fake board:

(a) **static**: each board serves one type in equal-size mode (the product
    as it ships: ``inventory.compute`` makes one VGPU inventory per board).
    The split of boards among the sizes is the best there is for this trace:
    every split is tried on a count model (an equal-size board holds the
    type's maximum), and the real run must reject what the model said;
(b) **mixed**: every board in mixed-size mode (switched through NVML) and
    listed under every type of the mix, one ``CUSTOM_VGPU_FRAMEBUFFER_MIB``
    inventory and one per vGPU size per board from ``inventory.compute``,
    each request asking for its MiB, its size class and its type's trait
    (:func:`vgpu_driver.size_classes.flavor_spec`).

With ``--shared pool``, side (b) is instead every board a **type pool**
of every type of the mix (``[devices] shared_board_mode = pool``,
:mod:`vgpu_driver.inventory.pool`): left in equal-size mode, an empty
board offers every size, its first vGPU fixes the size until its last one
goes; same flavors and encoding as (b).  Also reported, on the static
side's count model: (c) the **operator's split**, boards divided among the
sizes from the average mix alone (:func:`operator_split` says the rule).

A share of the requests (``--multi``, 15 % by default) asks two vGPUs of
its size, as a flavor of two vGPUs does: both on one board.

Each request goes to the board :func:`vgpu_driver.board_choice.order`
puts first among Placement's candidates, from their provider summaries, as
nova's scheduler with ``VGPUBoardFilter`` takes it (``--choose fit``), or
to the first board by address (``--choose first``: Placement's own order
among one host's providers varies between processes).  ``--static model``
takes the static side's count from its model without serving it (the
real run has matched the model in every run so far).  After every change
the changed board's inventory is computed again and synced, so requests
come one at a time: Placement granting what the board then refuses is
counted (it must not happen outside a concurrent window).

Reported per side: requests rejected, and of each size; framebuffer in
use at the first rejection; grants the board refused; on pools, how many
times a board was retyped (emptied, then taken by another size).  Goal:
mixed-size rejects at most half as many requests as the best static
split; type pools at most 1.1 times the best static split's and at most
0.9 times the operator's split's.  Run
``python benchmarks/bench_mixed_size.py [--seed N] [--boards N]
[--arrivals N] [--load F] [--mix GB:SHARE,...] [--choose fit|first]
[--static real|model] [--shared mixed|pool] [--json FILE]``; it exits
1 only on a wrong result (the real static run disagreeing with its
model, a grant the board refused, a request neither served nor
rejected).
"""

import abc
import argparse
import collections
import copy
import dataclasses
import heapq
import itertools
import os
import platform
import random
import sys
import tempfile
import time
import uuid
from types import MappingProxyType

from vgpu_driver import board_choice
from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import framebuffer
from vgpu_driver import inventory
from vgpu_driver import nvml
from vgpu_driver import placement
from vgpu_driver import size_classes
from vgpu_driver.conf.mdev_settings import MdevConfig
from vgpu_driver.conf.mdev_settings import TypeConfig
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import nvml as fake_nvml
from vgpu_driver.fake import profiles
from vgpu_driver.fake.domains import InProcessDomains
from vgpu_driver.mdevs import planner
from vgpu_driver.mdevs import strategies
from vgpu_driver.placement_service import EmbeddedPlacement

NODENAME = "mixed-bench"
BOARD_SLOTS = 48
# The request mix: {vGPU size in GB: (L40S type, share of requests)}.
MIX = {
    4: ("nvidia-1155", 0.4),
    8: ("nvidia-1156", 0.3),
    12: ("nvidia-1157", 0.2),
    24: ("nvidia-1159", 0.1),
}
SEED, BOARDS, ARRIVALS, LOAD, MULTI = 20261125, 8, 600, 0.9, 0.15
PROGRESS_EVERY = 200
PROJECT = USER = "0" * 32
GOAL = 0.5  # mixed / static
# Type pools: at most 1.1 x the best static split's rejections, and at most
# 0.9 x the operator's split's (clearly below it).
POOL_GOAL, POOL_OPERATOR_GOAL = 1.1, 0.9


@dataclasses.dataclass(frozen=True)
class Request:
    id: int
    size: int  # GB
    arrives: int  # tick
    leaves: int  # tick
    count: int = 1  # vGPUs, all on one board

    @property
    def gb(self):
        return self.size * self.count


def parse_mix(text):
    """``4:0.4,8:0.6`` -> :data:`MIX`'s shape, over the sizes an L40S offers."""
    offered = {
        t["framebuffer_mb"] // 1024: t["id"] for t in profiles.load("l40s-vfio")["gpus"][0]["types"]
    }
    mix = {}
    for part in text.split(","):
        size, _colon, share = part.partition(":")
        try:
            size, share = int(size), float(share)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not SIZE_GB:SHARE") from None
        if size not in offered or share <= 0 or size in mix:
            raise argparse.ArgumentTypeError(
                f"{part!r}: each size once, among {sorted(offered)} GB, with a share above 0"
            )
        mix[size] = (offered[size], share)
    total = sum(share for _type, share in mix.values())
    return {size: (type_id, share / total) for size, (type_id, share) in sorted(mix.items())}


def trace(seed, arrivals, load, boards, multi=0.0):
    """One request per tick, sizes by :data:`MIX`, two vGPUs in a share
    ``multi`` of them, exponential lifetimes whose mean puts the
    framebuffer asked for at ``load`` of the fleet's."""
    rng = random.Random(seed)
    sizes, shares = list(MIX), [share for _type, share in MIX.values()]
    mean_size = sum(size * share for size, (_type, share) in MIX.items()) * (1 + multi)
    mean_life = load * boards * BOARD_SLOTS / mean_size
    requests = []
    for tick in range(arrivals):
        size = rng.choices(sizes, shares)[0]
        life = max(1, round(rng.expovariate(1 / mean_life)))
        count = 2 if multi and rng.random() < multi else 1
        requests.append(Request(tick, size, tick, tick + life, count))
    return requests, mean_life


def events(requests):
    """``(tick, "leave"|"arrive", request)`` in order: a tick's departures first."""
    heap = []
    for request in requests:
        heapq.heappush(heap, (request.arrives, 1, request.id, "arrive", request))
        heapq.heappush(heap, (request.leaves, 0, request.id, "leave", request))
    while heap:
        tick, _order, _id, kind, request = heapq.heappop(heap)
        yield tick, kind, request


# -- the fleet ---------------------------------------------------------------------------------


def fleet_profile(boards, hostname=NODENAME, first_bus=0xC1):
    """``boards`` copies of the l40s-vfio board, one per bus from ``first_bus``."""
    one = profiles.load("l40s-vfio")
    copies = []
    for index in range(boards):
        board = copy.deepcopy(one)
        board["gpus"][0]["address"] = f"0000:{first_bus + index:02x}:00.0"
        copies.append(board)
    return profiles.combine(hostname, *copies, description=f"{boards} x L40S (48 GB, 16 VFs)")


def equal_size_max(profile):
    """``{size GB: vGPUs of it an equal-size board holds}`` (the type's maximum)."""
    specs = {t["id"]: t for t in profile["gpus"][0]["types"]}
    return {size: specs[type_id]["max"] for size, (type_id, _share) in MIX.items()}


# -- (a) the best static split, found on a count model ---------------------------------------


def static_rejections(requests, split, per_board):
    """What an equal-size split (``{size: boards}``) rejects: a type's
    boards are interchangeable, so only how full each is matters; a
    request of two vGPUs needs both on one board (the first that has
    room, as Placement's first candidate by address)."""
    boards = {size: [0] * split.get(size, 0) for size in MIX}
    rejected, held = 0, {}
    for _tick, kind, request in events(requests):
        if kind == "leave":
            if request.id in held:
                boards[request.size][held.pop(request.id)] -= request.count
            continue
        room = [
            i
            for i, used in enumerate(boards[request.size])
            if used + request.count <= per_board[request.size]
        ]
        if room:
            boards[request.size][room[0]] += request.count
            held[request.id] = room[0]
        else:
            rejected += 1
    return rejected


def best_split(requests, boards, per_board):
    """The split of ``boards`` among the sizes that rejects the fewest."""
    sizes = sorted(MIX)
    best = None
    for cut in itertools.combinations(range(boards + len(sizes) - 1), len(sizes) - 1):
        bounds = (-1, *cut, boards + len(sizes) - 1)
        counts = [bounds[i + 1] - bounds[i] - 1 for i in range(len(sizes))]
        split = dict(zip(sizes, counts, strict=True))
        rejected = static_rejections(requests, split, per_board)
        if best is None or rejected < best[0]:
            best = (rejected, split)
    return best[1], best[0]


def operator_split(boards):
    """The split an operator makes from the average mix alone: boards in
    proportion to each size's framebuffer demand.

    Each size's weight is its share of requests times its GB (the mean
    framebuffer it holds is that times the mean number of requests alive,
    the same for every size: lifetimes and two-vGPU requests do not depend
    on the size).  Its quota is ``boards * weight / sum of weights``; each
    size gets the whole part of its quota but at least one board; boards
    still free go one at a time to the size with the largest quota less
    boards given (the smaller size on a tie), boards over go one at a time
    from the size with the most boards given over its quota among those
    with two or more (the larger size on a tie).  With fewer boards than
    sizes, the sizes of the largest weight get one each."""
    weight = {size: round(share * size, 9) for size, (_type, share) in MIX.items()}
    if boards < len(weight):
        heaviest = sorted(weight, key=lambda size: (-weight[size], size))[:boards]
        return {size: int(size in heaviest) for size in MIX}
    total = sum(weight.values())
    quota = {size: boards * w / total for size, w in weight.items()}
    split = {size: max(1, int(q)) for size, q in quota.items()}
    while sum(split.values()) < boards:
        size = min(split, key=lambda s: (-(quota[s] - split[s]), s))
        split[size] += 1
    while sum(split.values()) > boards:
        size = min((s for s in split if split[s] > 1), key=lambda s: (quota[s] - split[s], -s))
        split[size] -= 1
    return split


# -- serving a trace ---------------------------------------------------------------------------


class Side(abc.ABC):
    """One way of serving the fleet: its inventories, its requests.

    A side sets ``config`` (the :class:`MdevConfig` its planner reads)."""

    label = None
    config = None
    policy = "first"

    def __init__(self, kernel, client, pfs):
        self.kernel, self.client, self.pfs = kernel, client, pfs
        self.sync = placement.ProviderSync(client)
        self.domains = InProcessDomains()
        self.providers = {}
        self.vgpus = {}  # request id -> (VF, board)
        self.stats = collections.Counter()
        self.first_rejection_used = None
        self.rejected_by_size = collections.Counter()
        self.sizes_by_board = collections.defaultdict(set)  # board -> sizes it served
        self.size_of_board = {}  # board -> the size it last served

    @abc.abstractmethod
    def board_providers(self, snapshot, boards):
        """``{board: GpuProvider}`` of ``boards``, from one read of the host."""

    @abc.abstractmethod
    def candidates_query(self, size, count):
        """Placement's query parameters for ``count`` vGPUs of ``size`` GB."""

    def resync(self, boards):
        self.providers.update(self.board_providers(discovery.discover(self.kernel), boards))
        tree = inventory.ProviderTree(
            root_name=NODENAME,
            providers=tuple(self.providers[pf] for pf in self.pfs),
            mdev_classes=frozenset(p.resource_class for p in self.providers.values()),
        )
        self.sync.sync(tree)

    def _board_of(self, rp_uuid):
        for pf in self.providers:
            if self._uuid_of(pf) == rp_uuid:
                return pf
        raise SystemExit(f"{self.label}: a candidate on provider {rp_uuid}, not a board")

    def arrive(self, request, used_gb):
        found = self.client.request(
            "GET",
            placement.query_url(
                "/allocation_candidates", **self.candidates_query(request.size, request.count)
            ),
        )
        if not found["allocation_requests"]:
            self._reject(request, used_gb)
            return
        pf, allocations = self.choose(found)
        consumer = str(uuid.UUID(int=request.id + 1))
        self.client.request(
            "PUT",
            f"/allocations/{consumer}",
            {
                "allocations": allocations,
                "project_id": PROJECT,
                "user_id": USER,
                "consumer_generation": None,
                "consumer_type": "INSTANCE",
            },
        )
        try:
            vfs = self._create(consumer, pf, allocations, {type_trait(request.size)})
        except exception.AllocationError:
            # Placement granted what the board refused: the allocation goes.
            self.stats["granted_then_refused"] += 1
            self.client.request("DELETE", f"/allocations/{consumer}")
            self._reject(request, used_gb)
            self.resync([pf])
            return
        self.vgpus[request.id] = (vfs, pf)
        self.stats["served"] += 1
        self._count_size(pf, request.size)
        self.resync([pf])

    def _count_size(self, pf, size):
        """A board taking another size than its last vGPU's: on a pool
        board, one emptied and taken by another size (``retyped``)."""
        if self.size_of_board.get(pf, size) != size:
            self.stats["retyped"] += 1
        self.size_of_board[pf] = size
        self.sizes_by_board[pf].add(size)

    def choose(self, found):
        """``(board, allocations)`` of the candidate taken.  ``first``: the
        first board by address (Placement's own order among one host's
        providers varies from one process to the next); ``fit``: the board
        :func:`vgpu_driver.board_choice.order` puts first, from Placement's
        provider summaries, ties by address."""
        by_board = {
            self._board_of(rp_uuid): candidate["allocations"]
            for candidate in found["allocation_requests"]
            for rp_uuid in candidate["allocations"]
        }
        boards = sorted(by_board)
        if self.policy == "fit":
            summaries = found["provider_summaries"]
            counts = {
                pf: board_choice.counts_of_summary(summaries[self._uuid_of(pf)]) for pf in boards
            }
            boards = board_choice.order(counts, boards)
        return boards[0], by_board[boards[0]]

    def _uuid_of(self, pf):
        return self.sync.known[self.providers[pf].name].uuid

    def _reject(self, request, used_gb):
        self.stats["rejected"] += 1
        self.rejected_by_size[request.size] += 1
        if self.first_rejection_used is None:
            self.first_rejection_used = used_gb

    def _create(self, consumer, pf, allocations, type_traits):
        """The real planner and vendor-VFIO strategy: the allocation's
        request (its type named by the flavor's trait), free VFs, typed."""
        by_uuid = {self.sync.known[p.name].uuid: p for p in self.providers.values()}
        (request,) = planner.requests_of(
            consumer, allocations, by_uuid, self.config.mdev_classes, type_traits
        )
        gpu = discovery.discover(self.kernel).gpu(pf)
        strategy = strategies.VendorVfioStrategy(self.kernel, self.domains, self.config)
        users = self.domains.mdev_users()
        state = strategy.gpu_state(consumer, gpu, request.type_id, users)
        items = planner.plan_gpu(consumer, request, state, {}, users)
        made = []
        try:
            for item in items:
                strategy.create(consumer, item)
                made.append(item.mdev_uuid)
        except exception.AllocationError:
            for vf in made:
                strategy.destroy(vf, timeout=5)
            raise
        self.domains.define(consumer, made)
        return made

    def leave(self, request):
        held = self.vgpus.pop(request.id, None)
        if held is None:
            return
        vfs, pf = held
        consumer = str(uuid.UUID(int=request.id + 1))
        self.domains.undefine(consumer)
        for vf in vfs:
            strategies.VendorVfioStrategy(self.kernel, self.domains, self.config).destroy(
                vf, timeout=5
            )
        self.client.request("DELETE", f"/allocations/{consumer}")
        self.resync([pf])


class StaticSide(Side):
    """Each board one type, equal-size: the inventory nova-compute reports."""

    label = "static"

    def __init__(self, kernel, client, pfs, split):
        super().__init__(kernel, client, pfs)
        boards = iter(pfs)
        type_configs = tuple(
            TypeConfig(MIX[size][0], device_addresses=tuple(next(boards) for _ in range(count)))
            for size, count in sorted(split.items())
            if count
        )
        self.config = MdevConfig(
            types=type_configs,
            by_address=MappingProxyType(
                {a: t.type_id for t in type_configs for a in t.device_addresses}
            ),
        )

    def board_providers(self, snapshot, boards):
        tree = inventory.compute(
            snapshot,
            self.config,
            NODENAME,
            rooms=inventory.read_rooms(self.kernel, snapshot, self.config),
        )
        return {pf: tree.by_gpu(pf) for pf in boards}

    def candidates_query(self, size, count):
        return {"resources": f"VGPU:{count}", "required": type_trait(size)}


class MixedSide(Side):
    """Every board mixed-size, listed under every type of the mix: one
    framebuffer inventory each, as nova-compute reports it."""

    label = "mixed"
    pools = False

    def __init__(self, kernel, client, pfs, policy, bindings=None):
        super().__init__(kernel, client, pfs)
        self.policy = policy
        types = tuple(t for t, _share in MIX.values())
        self.config = MdevConfig(
            types=tuple(TypeConfig(t, device_addresses=tuple(pfs)) for t in types),
            mixed_by_address=MappingProxyType(dict.fromkeys(pfs, types)),
            pools=self.pools,
        )
        if not self.pools:
            for pf in pfs:
                nvml.set_heterogeneous_mode(pf, True, bindings)

    def board_providers(self, snapshot, boards):
        tree = inventory.compute(
            snapshot,
            self.config,
            NODENAME,
            boards=inventory.read_boards(self.kernel, snapshot, self.config),
        )
        return {pf: tree.by_gpu(pf) for pf in boards}

    def candidates_query(self, size, count):
        specs = size_classes.flavor_spec(
            type_trait(size), size, size * framebuffer.SLOT_MIB, count, framebuffer.RESOURCE_CLASS
        )
        return size_classes.candidates_query(specs)


class PoolSide(MixedSide):
    """Every board a type pool of every type of the mix
    (``[devices] shared_board_mode = pool``): left in equal-size mode,
    each taking the size of its first vGPU until its last one goes,
    served in the mixed-size encoding (:mod:`vgpu_driver.inventory.pool`)."""

    label = "pool"
    pools = True


def type_trait(size):
    """The trait a flavor of that size requires: its type's (every GPU
    provider carries ``CUSTOM_MDEV_<type>``, :func:`inventory.type_traits`)."""
    return inventory.type_traits(MIX[size][0], None)[0]


def serve_trace(side, requests):
    """Run the events through ``side``; its counters, and the wall time."""
    # Every flavor's trait exists, whether a board carries it or not.
    for size in MIX:
        side.client.request("PUT", f"/traits/{type_trait(size)}")
    side.resync(side.pfs)
    live_gb, began, arrived = 0, time.perf_counter(), 0
    for _tick, kind, request in events(requests):
        if kind == "leave":
            if request.id in side.vgpus:
                live_gb -= request.gb
            side.leave(request)
            continue
        side.arrive(request, live_gb)
        if request.id in side.vgpus:
            live_gb += request.gb
        arrived += 1
        if arrived % PROGRESS_EVERY == 0:
            print(
                f"  {side.label}: {arrived} requests in {time.perf_counter() - began:.0f} s, "
                f"{side.stats['rejected']} rejected",
                flush=True,
            )
    return side.stats, time.perf_counter() - began


def run(args, tmp):
    profile = fleet_profile(args.boards)
    pfs = tuple(gpu["address"] for gpu in profile["gpus"])
    requests, mean_life = trace(args.seed, args.arrivals, args.load, args.boards, args.multi)
    per_board = equal_size_max(profile)
    split, model_rejected = best_split(requests, args.boards, per_board)
    print(
        f"best static split: {_split_text(split)}, the model rejects {model_rejected}", flush=True
    )
    operator = operator_split(args.boards)
    operator_rejected = static_rejections(requests, operator, per_board)
    print(
        f"operator's split from the average mix: {_split_text(operator)}, "
        f"the model rejects {operator_rejected}",
        flush=True,
    )
    results, wrong = (
        {
            "mean_lifetime": mean_life,
            "split": split,
            "model_rejected": model_rejected,
            "operator_split": operator,
            "operator_rejected": operator_rejected,
        },
        [],
    )
    labels = ("static", args.shared) if args.static == "real" else (args.shared,)
    if args.static == "model":
        results["static"] = _model_only(model_rejected)
    for label in labels:
        root = os.path.join(tmp, label, "sys")
        kernel = fakekernel.FakeKernel.build(root, profile)
        with EmbeddedPlacement() as service:
            client = placement.Client(service.connection())
            if label == "static":
                side = StaticSide(kernel, client, pfs, split)
            elif label == "mixed":
                side = MixedSide(kernel, client, pfs, args.choose, fake_nvml.Bindings(root))
            else:
                side = PoolSide(kernel, client, pfs, args.choose)
            stats, seconds = serve_trace(side, requests)
        capacity = args.boards * BOARD_SLOTS
        results[label] = {
            "rejected": stats["rejected"],
            "served": stats["served"],
            "granted_then_refused": stats["granted_then_refused"],
            "rejected_by_size": {size: side.rejected_by_size[size] for size in MIX},
            "used_at_first_rejection_gb": side.first_rejection_used,
            "used_at_first_rejection": (
                None if side.first_rejection_used is None else side.first_rejection_used / capacity
            ),
            "seconds": seconds,
            "retyped": stats["retyped"],
            "sizes_by_board": {pf: sorted(side.sizes_by_board[pf]) for pf in pfs},
        }
        if label == "pool":
            switched = [pf for pf in pfs if kernel.mixed_sizes(pf)]
            results[label]["boards_in_mixed_size_mode"] = len(switched)
            if switched:
                wrong.append(f"pool: {', '.join(switched)} in mixed-size mode")
        if stats["served"] + stats["rejected"] != len(requests):
            wrong.append(
                f"{label}: {stats['served']} served and {stats['rejected']} rejected "
                f"of {len(requests)} requests"
            )
        if stats["granted_then_refused"]:
            wrong.append(
                f"{label}: the board refused {stats['granted_then_refused']} "
                "grant(s) with requests coming one at a time"
            )
    if args.static == "real" and results["static"]["rejected"] != model_rejected:
        wrong.append(
            f"static: the real run rejected {results['static']['rejected']}, "
            f"its model {model_rejected}"
        )
    return results, wrong


def _model_only(rejected):
    """The static side's row when only its count model ran."""
    return {
        "rejected": rejected,
        "served": None,
        "granted_then_refused": 0,
        "rejected_by_size": None,
        "used_at_first_rejection_gb": None,
        "used_at_first_rejection": None,
        "seconds": None,
    }


def _split_text(split):
    return ", ".join(f"{count} x {size} GB" for size, count in sorted(split.items()) if count)


def report(results, args):
    print(
        f"\n{args.boards} L40S boards (48 GB, 16 VFs), {args.arrivals} requests, seed "
        f"{args.seed}, offered load {args.load:.0%} of the fleet's framebuffer "
        f"(mean lifetime {results['mean_lifetime']:.1f} arrivals)"
    )
    print(
        "mix: "
        + ", ".join(f"{size} GB {share:.0%}" for size, (_t, share) in MIX.items())
        + f"; {args.multi:.0%} of requests ask two vGPUs"
    )
    print(f"static split (best of every split, by its model): {_split_text(results['split'])}")
    print(f"operator's split (from the average mix): {_split_text(results['operator_split'])}")
    print(f"{args.shared} side's choice of board: {args.choose}")
    by_size = "/".join(str(size) for size in MIX)
    print(
        f"{'':8} {'rejected':>9} {f'of {by_size} GB':>16} {'served':>7} "
        f"{'used at 1st rejection':>22} {'grants refused':>15} {'seconds':>8}"
    )
    print(f"{'operator':8} {results['operator_rejected']:>9} {'(its count model only)':>40}")
    for label in ("static", args.shared):
        row = results[label]
        first = row["used_at_first_rejection"]
        first_text = (
            "-" if first is None else (f"{row['used_at_first_rejection_gb']} GB ({first:.0%})")
        )
        if row["served"] is None:
            print(f"{label:8} {row['rejected']:>9} {'(its count model only)':>40}")
            continue
        sizes = "/".join(str(row["rejected_by_size"][size]) for size in MIX)
        print(
            f"{label:8} {row['rejected']:>9} {sizes:>16} {row['served']:>7} "
            f"{first_text:>22} {row['granted_then_refused']:>15} {row['seconds']:>8.1f}"
        )
    if args.shared == "pool":
        print(f"boards retyped (emptied, then taken by another size): {results['pool']['retyped']}")
    verdict = "PASS" if results["goal_ok"] else "MISS"
    if args.shared == "mixed":
        print(f"mixed / static rejections: {results['ratio']:.2f} (goal <= {GOAL}): {verdict}")
        return
    print(
        f"pool / static rejections: {results['ratio']:.2f} (goal <= {POOL_GOAL}), "
        f"pool / operator: {results['ratio_operator']:.2f} (goal <= {POOL_OPERATOR_GOAL}): "
        f"{verdict}"
    )


def _ratio(ours, theirs):
    return ours / theirs if theirs else (0.0 if not ours else float("inf"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--boards", type=int, default=BOARDS)
    parser.add_argument("--arrivals", type=int, default=ARRIVALS)
    parser.add_argument(
        "--load",
        type=float,
        default=LOAD,
        help="framebuffer asked for, as a share of the fleet's (default 0.9)",
    )
    parser.add_argument(
        "--mix",
        type=parse_mix,
        default=None,
        metavar="GB:SHARE,...",
        help="the sizes asked for and their shares (default 4:0.4,8:0.3,12:0.2,24:0.1)",
    )
    parser.add_argument(
        "--multi",
        type=float,
        default=MULTI,
        help="the share of requests asking two vGPUs (default 0.15)",
    )
    parser.add_argument(
        "--choose",
        choices=("fit", "first"),
        default="fit",
        help="side (b)'s choice among Placement's candidates: the board "
        "vgpu_driver.board_choice puts first (default), or the first by address",
    )
    parser.add_argument(
        "--static",
        choices=("real", "model"),
        default="real",
        help="serve the static split for real and check it against its count "
        "model (default), or take the model's count alone",
    )
    parser.add_argument(
        "--shared",
        choices=("mixed", "pool"),
        default="mixed",
        help="side (b)'s boards: in mixed-size mode (default), or type pools "
        "left in equal-size mode, each taking the size of its first vGPU",
    )
    parser.add_argument("--json", metavar="FILE", help="Also write the numbers to FILE.")
    parser.add_argument("--tmpdir", metavar="DIR", help="Where to write the fake trees.")
    args = parser.parse_args(argv)
    if args.boards < 1 or args.arrivals < 1 or args.load <= 0 or not 0 <= args.multi <= 1:
        parser.error(
            "--boards and --arrivals must be at least 1, --load above 0, --multi between 0 and 1"
        )
    if args.mix is not None:
        global MIX
        MIX = args.mix
    with tempfile.TemporaryDirectory(prefix="bench-mixed-", dir=args.tmpdir) as tmp:
        results, wrong = run(args, tmp)
    if wrong:
        print("WRONG RESULTS:\n  " + "\n  ".join(wrong))
        return 1
    static, shared = results["static"]["rejected"], results[args.shared]["rejected"]
    operator = results["operator_rejected"]
    results["ratio"] = _ratio(shared, static)
    results["ratio_operator"] = _ratio(shared, operator)
    if args.shared == "mixed":
        results["goal_ok"] = shared <= GOAL * static
    else:
        results["goal_ok"] = (
            shared <= POOL_GOAL * static and shared <= POOL_OPERATOR_GOAL * operator
        )
    results.update(
        benchmark="mixed_size",
        seed=args.seed,
        boards=args.boards,
        arrivals=args.arrivals,
        load=args.load,
        multi=args.multi,
        choose=args.choose,
        shared=args.shared,
        static_side=args.static,
        python=platform.python_version(),
        mix={size: share for size, (_t, share) in MIX.items()},
    )
    report(results, args)
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
