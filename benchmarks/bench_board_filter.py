"""The scheduler latency ``VGPUBoardFilter`` and ``VGPUBoardWeigher`` add, at
1000 hosts, against nova's own.

nova's scheduler, for each boot, asks Placement for allocation candidates,
builds a ``HostState`` per host named, runs its filters over them and claims
the first candidate of the host its weighers put first (with two alternates
by default).  ``vgpu_driver.nova.scheduler.VGPUBoardFilter`` adds two costs:
its ``host_passes`` on every host (it wraps a host's candidates when they
name more than one board), and the boards' read from Placement (one
allocation-candidates request in the host's tree) when the scheduler takes
``[0]`` of a wrapped host.  ``VGPUBoardWeigher`` adds its weighing of every
host that passed, from the boards each host publishes in its compute node's
stats (``board_stats.STAT``).

The fleet: ``--hosts`` hosts of 4 L40S boards in mixed-size mode (one fake
host, built and read once per usage pattern, its tree computed under each
nodename, as ``bench_placement.py`` part (b) does), synced one after another
into one upstream Placement on a private PostgreSQL cluster
(``tests/postgres.py``).  Each compute node has ``VCPU``, ``MEMORY_MB`` and
``DISK_GB``; on two boards of every host vGPUs are held (typed on the fake
board, so the inventory counts them, and allocated in Placement), on
different boards for even and odd hosts.  Each ``HostState``'s compute node
carries the stat its host would publish: ``board_stats.encode`` of its tree,
whose typed VFs count as held (its 4 boards, 1.2 KB of JSON).

The request: one 4 GB vGPU (``size_classes.flavor_spec``) with
``VCPU:1,MEMORY_MB:512,DISK_GB:1``, as a nova ``RequestSpec`` of that
flavor.  Each round, timed apart:

* **nova: candidates**: ``SchedulerReportClient.get_allocation_candidates``
  for the ``ResourceRequest`` nova builds from the request spec
  (``[scheduler] max_placement_results`` raised so that every host is named);
* **nova: filters**: each host's candidates copied onto its ``HostState``
  (``alloc_reqs_by_rp_uuid[host.uuid]``, as ``_schedule`` does) and nova's
  default ``enabled_filters`` through ``HostFilterHandler``;
* **nova: weighers**: nova's default ``weight_classes`` through
  ``HostWeightHandler`` on the hosts that passed;
* **ours: filter**: ``VGPUBoardFilter`` through ``HostFilterHandler`` on
  the same hosts;
* **ours: weigher**: ``VGPUBoardWeigher`` through ``HostWeightHandler`` on
  the hosts ours passed;
* **ours: reads**: ``allocation_candidates[0]`` of 3 wrapped hosts (the one
  claimed and 2 alternates: the weigher's first 3), the boards read through
  ``PlacementCounts`` with nova's own ``SchedulerReportClient``, its
  ``[placement]`` options set to the embedded Placement (``auth_type =
  admin_token``).

Every host must pass both, and the first candidate of each wrapped host must
be on a board ``board_choice.order`` puts first, from the counts set up here
(the tree's inventories less the allocations made), and the weigher must
put first exactly the hosts whose best board ranks best by the same counts;
otherwise it exits 1.
Run ``python benchmarks/bench_board_filter.py [--hosts N] [--rounds N]
[--json FILE] [--tmpdir DIR]``; it needs root and PostgreSQL's server.
"""

import argparse
import copy
import datetime
import os
import platform
import sys
import tempfile
import time
import uuid
from types import MappingProxyType

import bench_mixed_size
import bench_placement
import common

from vgpu_driver import board_choice
from vgpu_driver import board_stats
from vgpu_driver import discovery
from vgpu_driver import framebuffer
from vgpu_driver import inventory
from vgpu_driver import nvml
from vgpu_driver import placement
from vgpu_driver import size_classes
from vgpu_driver.conf.mdev_settings import MdevConfig
from vgpu_driver.conf.mdev_settings import TypeConfig
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import nvml as fake_nvml
from vgpu_driver.placement_service import ADMIN_TOKEN

postgres = common.load_test_helper("postgres")

HOSTS, ROUNDS, BOARDS, CLAIMED = 1000, 10, 4, 3
SIZE_GB = 4
COMPUTE = {"VCPU": 64, "MEMORY_MB": 262144, "DISK_GB": 2048}
# vGPUs held on each host, by pattern (even hosts, odd hosts): {board: [GB, ...]}.
# Each pattern has one board the rule puts first (2, then 3), so that the
# check tells the rule's choice from any other.
PATTERNS = ({1: [12], 2: [4, 4, 4]}, {3: [8, 4], 0: [4]})
PROJECT = USER = "0" * 32


# -- the fleet ---------------------------------------------------------------------------------


def _type_of(gb):
    return bench_mixed_size.MIX[gb][0]


def template(tmp, index, pattern):
    """One fake host of :data:`BOARDS` mixed-size L40S boards holding
    ``pattern``'s vGPUs: its snapshot, boards' reading and config."""
    root = os.path.join(tmp, f"pattern-{index}", "sys")
    profile = bench_mixed_size.fleet_profile(BOARDS)
    kernel = fakekernel.FakeKernel.build(root, profile)
    pfs = tuple(gpu["address"] for gpu in profile["gpus"])
    bindings = fake_nvml.Bindings(root)
    for pf in pfs:
        nvml.set_heterogeneous_mode(pf, True, bindings)
    types = tuple(t for t, _share in bench_mixed_size.MIX.values())
    config = MdevConfig(
        types=tuple(TypeConfig(t, device_addresses=pfs) for t in types),
        mixed_by_address=MappingProxyType(dict.fromkeys(pfs, types)),
    )
    snapshot = discovery.discover(kernel)
    for board, sizes in pattern.items():
        vfs = snapshot.gpu(pfs[board]).parents
        for vf, gb in zip(vfs, sizes, strict=False):
            attr = os.path.join(kernel.paths.vendor_vfio_dir(vf.name), "current_vgpu_type")
            kernel.write_attr(attr, _type_of(gb).split("-")[1])
    snapshot = discovery.discover(kernel)
    return pfs, snapshot, config, inventory.read_boards(kernel, snapshot, config)


def fleet_trees(tmp, hosts):
    """``[(tree, pattern)]``: host ``i`` holds :data:`PATTERNS` ``[i % 2]``."""
    templates = [template(tmp, i, p) for i, p in enumerate(PATTERNS)]
    found = []
    for index in range(hosts):
        pfs, snapshot, config, boards = templates[index % len(PATTERNS)]
        tree = inventory.compute(snapshot, config, f"compute-{index:04d}", boards=boards)
        found.append((tree, pfs, PATTERNS[index % len(PATTERNS)]))
    return found


def held_resources(sizes):
    """What Placement counts of ``sizes`` (GB) held on one board."""
    resources = {framebuffer.RESOURCE_CLASS: 0}
    for gb in sizes:
        resources[framebuffer.RESOURCE_CLASS] += gb * framebuffer.SLOT_MIB
        rc = size_classes.class_name(gb)
        resources[rc] = resources.get(rc, 0) + 1
    return resources


def furnish(client, syncs, fleet):
    """Each compute node's own inventory, and the held vGPUs' allocations."""
    for index, (sync, (tree, pfs, pattern)) in enumerate(zip(syncs, fleet, strict=True), 1):
        root = sync.known[tree.root_name]
        client.request(
            "PUT",
            f"/resource_providers/{root.uuid}/inventories",
            {
                "resource_provider_generation": root.generation,
                "inventories": {rc: {"total": total} for rc, total in COMPUTE.items()},
            },
        )
        for board, sizes in pattern.items():
            rp_uuid = sync.known[tree.by_gpu(pfs[board]).name].uuid
            client.request(
                "PUT",
                f"/allocations/{uuid.uuid4()}",
                {
                    "allocations": {rp_uuid: {"resources": held_resources(sizes)}},
                    "project_id": PROJECT,
                    "user_id": USER,
                    "consumer_generation": None,
                    "consumer_type": "INSTANCE",
                },
            )
        if index % bench_placement.PROGRESS_EVERY == 0 and index < len(fleet):
            print(f"  ... {index} hosts given compute inventories and vGPUs", flush=True)


def _ranks(syncs, fleet):
    """``{compute node uuid: {board rp uuid: rank}}`` by ``board_choice.rank``,
    from the tree's inventories less the allocations :func:`furnish` made."""
    ranks = {}
    for sync, (tree, pfs, pattern) in zip(syncs, fleet, strict=True):
        counts = {}
        for board, pf in enumerate(pfs):
            provider = tree.by_gpu(pf)
            used = held_resources(pattern.get(board, ()))
            counts[sync.known[provider.name].uuid] = board_choice.counts_of(
                provider.inventory(), used
            )
        shares = board_choice.demand(counts.values())
        ranks[sync.root_uuid] = {
            rp: board_choice.rank(board_counts, shares) for rp, board_counts in counts.items()
        }
    return ranks


def expected_firsts(syncs, fleet):
    """``({compute node uuid: {board rp uuid, ...}}, {compute node uuid,
    ...})``: the boards ``board_choice.order`` ranks first on each host
    (ties: any of them), and the hosts whose first board ranks best, which
    the weigher must put first."""
    ranks = _ranks(syncs, fleet)
    best = {node: min(boards.values()) for node, boards in ranks.items()}
    top = min(best.values())
    boards = {
        node: {rp for rp, rank in by_board.items() if rank == best[node]}
        for node, by_board in ranks.items()
    }
    return boards, {node for node, rank in best.items() if rank == top}


# -- nova's side ------------------------------------------------------------------------------


def configure_nova(tmp, endpoint, hosts):
    """nova's config: ``[placement]`` reaching the embedded Placement as
    nova's report client does (keystoneauth's ``admin_token`` plugin), and
    every host's candidates in one answer."""
    import nova.conf
    from nova import objects

    path = os.path.join(tmp, "nova.conf")
    with open(path, "w") as f:
        f.write(
            f"[placement]\nauth_type = admin_token\nendpoint = {endpoint}\n"
            f"token = {ADMIN_TOKEN}\n"
            f"[scheduler]\nmax_placement_results = {hosts * BOARDS}\n"
        )
    nova.conf.CONF(["--config-file", path], project="nova", default_config_files=[])
    objects.register_all()
    return nova.conf.CONF


def request_spec():
    from nova import objects

    specs = size_classes.flavor_spec(
        bench_mixed_size.type_trait(SIZE_GB),
        SIZE_GB,
        SIZE_GB * framebuffer.SLOT_MIB,
        1,
        framebuffer.RESOURCE_CLASS,
    )
    flavor = objects.Flavor(
        id=1,
        flavorid="vgpu-4g",
        name="vgpu-4g",
        vcpus=1,
        memory_mb=512,
        root_gb=1,
        ephemeral_gb=0,
        swap=0,
        extra_specs=specs,
    )
    return objects.RequestSpec(
        flavor=flavor,
        image=objects.ImageMeta.from_dict({"properties": {}}),
        num_instances=1,
        project_id=PROJECT,
        user_id=USER,
        instance_group=None,
        scheduler_hints={},
        is_bfv=False,
        requested_resources=[],
        force_hosts=None,
        force_nodes=None,
        ignore_hosts=None,
    ), specs


def host_states(syncs, fleet):
    """A nova ``HostState`` per compute node, updated from a ``ComputeNode``
    and a live service as ``HostManager`` updates it."""
    from nova import objects
    from nova.scheduler import host_manager

    now = datetime.datetime.now(datetime.UTC)
    service = {
        "host": None,
        "binary": "nova-compute",
        "disabled": False,
        "forced_down": False,
        "created_at": now,
        "updated_at": now,
        "last_seen_up": now,
    }
    states = []
    for sync, (tree, _pfs, _pattern) in zip(syncs, fleet, strict=True):
        name = tree.root_name
        published = board_stats.encode(tree)
        if published is None:
            raise SystemExit(f"{name} publishes no boards")
        node = objects.ComputeNode(
            uuid=sync.root_uuid,
            host=name,
            hypervisor_hostname=name,
            vcpus=COMPUTE["VCPU"],
            vcpus_used=0,
            memory_mb=COMPUTE["MEMORY_MB"],
            free_ram_mb=COMPUTE["MEMORY_MB"],
            local_gb=COMPUTE["DISK_GB"],
            local_gb_used=0,
            free_disk_gb=COMPUTE["DISK_GB"],
            disk_available_least=None,
            updated_at=now,
            numa_topology=None,
            pci_device_pools=None,
            host_ip="192.0.2.1",
            hypervisor_type="QEMU",
            hypervisor_version=9002000,
            cpu_info="{}",
            supported_hv_specs=[],
            stats={board_stats.STAT: published},
            metrics="[]",
            cpu_allocation_ratio=1.0,
            ram_allocation_ratio=1.0,
            disk_allocation_ratio=1.0,
        )
        state = host_manager.HostState(name, name, str(uuid.UUID(int=1)))
        state.update(compute=node, service={**service, "host": name}, aggregates=[], inst_dict={})
        states.append(state)
    return states


def nova_filters(conf):
    """nova's default ``enabled_filters``, and ours, as the scheduler loads them."""
    from nova.scheduler import filters

    handler = filters.HostFilterHandler()
    classes = {
        cls.__name__: cls
        for cls in handler.get_matching_classes(
            [*conf.filter_scheduler.available_filters, "vgpu_driver.nova.scheduler.VGPUBoardFilter"]
        )
    }
    defaults = [classes[name]() for name in conf.filter_scheduler.enabled_filters]
    return handler, defaults, [classes["VGPUBoardFilter"]()]


def nova_weighers(conf):
    """nova's default ``weight_classes``, and ours, as the scheduler loads them."""
    from nova.scheduler import weights

    handler = weights.HostWeightHandler()
    defaults = [cls() for cls in handler.get_matching_classes(conf.filter_scheduler.weight_classes)]
    ours = handler.get_matching_classes(["vgpu_driver.nova.scheduler.VGPUBoardWeigher"])
    return handler, defaults, [cls() for cls in ours]


class Scheduler:
    """One boot's scheduling, in nova's steps, each timed apart."""

    def __init__(self, conf, states, spec):
        from nova import context as nova_context
        from nova.scheduler import utils as scheduler_utils
        from nova.scheduler.client import report

        self.context = nova_context.get_admin_context()
        self.client = report.report_client_singleton()
        self.resources = scheduler_utils.ResourceRequest.from_request_spec(spec)
        self.handler, self.defaults, self.ours = nova_filters(conf)
        self.weighing, self.nova_weighers, self.our_weighers = nova_weighers(conf)
        self.states, self.spec = states, spec
        self.candidates = None

    def heartbeat(self):
        """Every host's service seen up now, as ``HostManager`` reads the
        services at each request: ``ComputeFilter`` refuses a host last seen
        longer ago than ``[DEFAULT] service_down_time`` (60 s), which a run
        of 1000 hosts on a busy machine outlasts."""
        now = datetime.datetime.now(datetime.UTC)
        for state in self.states:
            state.update(service={**state.service, "updated_at": now, "last_seen_up": now})

    def ask_placement(self):
        """nova's ``get_allocation_candidates``, grouped by compute node as
        ``_schedule`` groups them."""
        found, _summaries, _version = self.client.get_allocation_candidates(
            self.context, self.resources
        )
        if found is None:
            raise SystemExit("Placement refused nova's allocation-candidates request")
        by_node = {}
        for candidate in found:
            for rp_uuid in candidate["allocations"]:
                by_node.setdefault(rp_uuid, []).append(candidate)
        self.candidates = by_node
        return found

    def nova_filters(self):
        for state in self.states:
            state.allocation_candidates = copy.deepcopy(self.candidates.get(state.uuid, []))
        return self.handler.get_filtered_objects(self.defaults, self.states, self.spec)

    def our_filter(self, hosts):
        return self.handler.get_filtered_objects(self.ours, hosts, self.spec)

    def nova_weigh(self, hosts):
        return self.weighing.get_weighed_objects(self.nova_weighers, hosts, self.spec)

    def our_weigh(self, hosts):
        return self.weighing.get_weighed_objects(self.our_weighers, hosts, self.spec)

    @staticmethod
    def first_candidates(hosts):
        return [host.allocation_candidates[0] for host in hosts]


def _timed(func, *args):
    common.settle()
    start = time.perf_counter()
    result = func(*args)
    return result, (time.perf_counter() - start) * 1000


def check_weighing(label, weighed, top):
    """The weigher's first hosts are exactly ``top``, each weighing more
    than every other host."""
    first = {host.obj.uuid for host in weighed[: len(top)]}
    rest = [host.weight for host in weighed[len(top) :]]
    if first != top or (rest and min(h.weight for h in weighed[: len(top)]) <= max(rest)):
        return [
            f"{label}: the weigher put first {len(first & top)} of the {len(top)} hosts "
            "whose best board ranks best"
        ]
    return []


def check_round(label, scheduler, passed, ours, claimed, firsts, wanted):
    from vgpu_driver.nova import scheduler as board_filter

    problems = []
    hosts = len(scheduler.states)
    if sum(1 for state in scheduler.states if state.allocation_candidates) != hosts:
        problems.append(f"{label}: Placement named {len(scheduler.candidates)} of {hosts} hosts")
    if len(passed) != hosts or len(ours) != hosts:
        problems.append(
            f"{label}: nova's filters passed {len(passed)}, ours {len(ours)} of {hosts} hosts"
        )
    for host, first in zip(claimed, firsts, strict=True):
        if not isinstance(host.allocation_candidates, board_filter.BoardOrderedCandidates):
            problems.append(f"{label}: {host.host}'s candidates were not wrapped")
        boards = set(board_filter.boards_of(first, host.uuid))
        if len(boards) != 1 or not boards <= wanted[host.uuid]:
            problems.append(
                f"{label}: {host.host}'s first candidate is on {sorted(boards)}, "
                f"expected one of {sorted(wanted[host.uuid])}"
            )
    return problems


def measure(args, scheduler, expected):
    """``--rounds`` boots' steps (after one untimed), their samples."""
    wanted, top = expected
    samples = {key: [] for key in LABELS}
    problems = []
    for index in range(args.rounds + 1):
        ms = {}
        scheduler.heartbeat()
        found, ms["candidates"] = _timed(scheduler.ask_placement)
        passed, ms["nova_filters"] = _timed(scheduler.nova_filters)
        _weighed, ms["nova_weighers"] = _timed(scheduler.nova_weigh, passed)
        ours, ms["our_filter"] = _timed(scheduler.our_filter, passed)
        weighed, ms["our_weigher"] = _timed(scheduler.our_weigh, ours)
        claimed = [host.obj for host in weighed[:CLAIMED]]
        firsts, ms["our_reads"] = _timed(scheduler.first_candidates, claimed)
        label = f"round {index}"
        problems += check_round(label, scheduler, passed, ours, claimed, firsts, wanted)
        problems += check_weighing(label, weighed, top)
        if index:
            for key, values in samples.items():
                values.append(ms[key])
    return samples, len(found), problems


def _stats(samples):
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
    return {**common.summary(samples), "p90": p90}


def run(args, tmp):
    from nova.scheduler.client import report

    fleet = fleet_trees(tmp, args.hosts)
    problems = []
    with postgres.private_cluster(parent=args.tmpdir) as cluster:
        counter = bench_placement.RequestCounter()
        with bench_placement.serve(cluster.url, counter) as service:
            print(
                f"Syncing {args.hosts} hosts x {BOARDS} L40S into Placement on PostgreSQL "
                f"({service.endpoint}) ...",
                flush=True,
            )
            conn = service.connection()
            syncs, synced, wrong = bench_placement.sync_fleet(
                conn, [tree for tree, _pfs, _pattern in fleet], counter
            )
            problems += wrong
            client = placement.Client(conn)
            for gb in bench_mixed_size.MIX:
                client.request("PUT", f"/traits/{bench_mixed_size.type_trait(gb)}")
            furnish(client, syncs, fleet)
            conf = configure_nova(tmp, service.endpoint, args.hosts)
            report.PLACEMENTCLIENT = None
            spec, specs = request_spec()
            scheduler = Scheduler(conf, host_states(syncs, fleet), spec)
            before = counter.snapshot()
            samples, found, wrong = measure(args, scheduler, expected_firsts(syncs, fleet))
            problems += wrong
            gets = counter.snapshot()[0] - before[0]
        rows, settings = bench_placement.count_rows(cluster)
        data_fs = common.fs_type(cluster.workdir)
    parts = {key: _stats(values) for key, values in samples.items()}
    baseline = sum(parts[key]["median"] for key in ("candidates", "nova_filters", "nova_weighers"))
    added = parts["our_filter"]["median"] + parts["our_reads"]["median"]
    weigher = parts["our_weigher"]["median"]
    return {
        "hosts": args.hosts,
        "boards_per_host": BOARDS,
        "rounds": args.rounds,
        "candidates_found": found,
        "claimed_hosts": CLAIMED,
        "flavor_extra_specs": specs,
        "query": scheduler.resources.to_querystring(),
        "placement_gets_per_round": gets / (args.rounds + 1),
        "sync": synced,
        "postgres": {**settings, "rows": rows, "data_fs": data_fs},
        "ms": parts,
        "baseline_ms": baseline,
        "added_ms": added,
        "ratio": added / baseline,
        "weigher_ms": weigher,
        "weigher_ratio": weigher / baseline,
    }, problems


# -- reporting ---------------------------------------------------------------------------------


LABELS = {
    "candidates": "nova: GET /allocation_candidates",
    "nova_filters": "nova: candidates copied + default filters",
    "nova_weighers": "nova: default weighers",
    "our_filter": "ours: VGPUBoardFilter on every host",
    "our_weigher": "ours: VGPUBoardWeigher on every host",
    "our_reads": f"ours: [0] of {CLAIMED} hosts (board reads)",
}


def report_numbers(results):
    pg = results["postgres"]
    print(
        f"\n{results['hosts']} hosts x {results['boards_per_host']} mixed-size L40S in one "
        f"Placement on PostgreSQL {pg['version']} (fsync={pg['fsync']}, data on "
        f"{pg['data_fs']}); synced in {results['sync']['wall_s']:.0f} s"
    )
    print(
        f"  one 4 GB vGPU: {results['candidates_found']} candidates; "
        f"{results['placement_gets_per_round']:.0f} Placement GETs per boot; "
        f"median and p90 of {results['rounds']} boots"
    )
    print(f"  {'step':<46} {'median ms':>10} {'p90 ms':>10}")
    for key, label in LABELS.items():
        part = results["ms"][key]
        print(f"  {label:<46} {part['median']:>10.1f} {part['p90']:>10.1f}")
    print(
        f"  nova's own {results['baseline_ms']:.1f} ms, the filter adds "
        f"{results['added_ms']:.1f} ms: added / nova = {results['ratio']:.3f}"
    )
    print(
        f"  the weigher adds {results['weigher_ms']:.1f} ms: "
        f"weigher / nova = {results['weigher_ratio']:.3f}"
    )


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--hosts", type=int, default=HOSTS, help=f"Compute nodes (default: {HOSTS})."
    )
    parser.add_argument(
        "--rounds", type=int, default=ROUNDS, help=f"Timed boots (default: {ROUNDS})."
    )
    parser.add_argument("--json", metavar="FILE", help="Also write the numbers to FILE.")
    parser.add_argument(
        "--tmpdir",
        metavar="DIR",
        help="Where to write the fake hosts and the PostgreSQL cluster (default: the "
        "system's temp dir; the postgres user must reach it).",
    )
    args = parser.parse_args(argv)
    if args.hosts < CLAIMED or args.rounds < 1:
        parser.error(f"--hosts must be at least {CLAIMED} and --rounds at least 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    reason = postgres.unavailable()
    if reason:
        sys.exit(f"bench_board_filter needs PostgreSQL: {reason}")
    with tempfile.TemporaryDirectory(prefix="bench-board-filter-", dir=args.tmpdir) as tmp:
        results, problems = run(args, tmp)
    if problems:
        print("WRONG RESULTS, the timings mean nothing:\n  " + "\n  ".join(problems[:20]))
        return 1
    report_numbers(results)
    results.update({"benchmark": "board_filter", "python": platform.python_version()})
    common.write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
