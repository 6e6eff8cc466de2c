"""The mixed-size and type-pool traces served through nova's own scheduler.

``bench_mixed_size.py`` serves its seeded traces through a real Placement,
the real planner and vendor-VFIO strategy, and chooses each request's board
with the scheduler filter's rule itself.  This serves the same traces
through nova: nova's API, conductor and scheduler, a real Placement, and
``vgpu_driver.nova.LibvirtVGPUDriver`` as nova-compute's driver on fake
hosts of L40S boards (nova's functional framework, as the nova lanes run
it), so what decides each board is what decides it in a cloud:

* ``--scheduler ours``: nova's filters and weighers plus the ones
  vgpu-driver ships (``VGPUBoardFilter`` orders each host's allocation
  candidates, ``VGPUBoardWeigher`` prefers the host whose best board fits
  the request best, from the stat each compute publishes at its periodic
  update);
* ``--scheduler nova``: nova's filters and weighers alone (nova claims
  each host's first candidate, in Placement's order).

Each boot waits for its server to be ACTIVE or in ERROR before the next
request, and each departure for its server to be gone, so requests come one
at a time; the computes run their periodic update every ``--periodic-every``
arrivals (nova runs it every minute).  A server in ERROR whose fault is
nova's "No valid host was found" is a rejection; any other end, or a build
a compute refused and nova rescheduled (an instance action event in
error), is a grant the board refused, which must not happen with requests
coming one at a time (the run exits 1).

The boards are ``--hosts`` hosts of ``--boards`` L40S each, in mixed-size
mode (``--shared mixed``) or type pools (``--shared pool``), every board
listed under the four types of the mix.  Reported against the static
splits of ``bench_mixed_size.py``'s count model for the same trace and
fleet: the best static split knowing the trace, and the operator's split
from the average mix.  Run ``python benchmarks/bench_nova_schedule.py
[--seed N] [--hosts N] [--boards N] [--arrivals N] [--load F] [--multi F]
[--shared mixed|pool] [--scheduler ours|nova] [--periodic-every N]
[--json FILE] [--tmpdir DIR]``.
"""

import os

# nova-compute's default since nova 34, as the functional-nova lane runs it.
os.environ.setdefault("OS_NOVA_DISABLE_EVENTLET_PATCHING", "1")

import argparse  # noqa: E402 - nova's concurrency mode is chosen first
import collections  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import unittest  # noqa: E402

import bench_mixed_size as traces  # noqa: E402
import common  # noqa: E402

sys.path.insert(0, common.REPO)  # nova's framework comes with our nova tests

from nova import conf as nova_conf  # noqa: E402
from nova.tests.functional.api import client as api_client  # noqa: E402

from tests.functional_nova import test_mixed_size  # noqa: E402
from tests.functional_nova import test_vgpu  # noqa: E402
from vgpu_driver.fake import fakekernel  # noqa: E402

CONF = nova_conf.CONF
FILTER = "vgpu_driver.nova.scheduler.VGPUBoardFilter"
WEIGHER = "vgpu_driver.nova.scheduler.VGPUBoardWeigher"
NOVAS_WEIGHERS = "nova.scheduler.weights.all_weighers"
HOSTS, BOARDS_PER_HOST, PERIODIC_EVERY = 2, 4, 10
NO_VALID_HOST = "No valid host was found"
POLL = 0.1  # seconds between two reads of a server's state
WAIT = 120  # seconds a boot or a delete may take before the run gives up
PROGRESS_EVERY = 50
SCHEDULERS = {"ours": "nova + VGPUBoardFilter + VGPUBoardWeigher", "nova": "nova alone"}


class TraceThroughNova(test_vgpu.VGPUDriverTestBase):
    """One trace through nova's services; ``args`` is set by :func:`main`."""

    ENABLED_TYPES = ",".join(type_id for type_id, _share in traces.MIX.values())
    args = None

    def _setup_scheduler_service(self):
        if self.args.scheduler == "ours":
            self.flags(
                available_filters=[*CONF.filter_scheduler.available_filters, FILTER],
                enabled_filters=[*CONF.filter_scheduler.enabled_filters, "VGPUBoardFilter"],
                weight_classes=[NOVAS_WEIGHERS, WEIGHER],
                group="filter_scheduler",
            )
        return super()._setup_scheduler_service()

    def setUp(self):
        super().setUp()
        # The trace's vGPUs are what runs out, not the hosts' CPUs or memory.
        self.flags(cpu_allocation_ratio=256.0, ram_allocation_ratio=64.0)
        self.flags(disk_allocation_ratio=64.0)
        self.flags(instances=-1, cores=-1, ram=-1, group="quota")
        if self.args.shared == "pool":
            self.flags(shared_board_mode="pool", group="devices")
        self.hostnames = [f"host{i + 1}" for i in range(self.args.hosts)]
        self.boards = {}  # host -> its boards' addresses
        for index, host in enumerate(self.hostnames):
            first_bus = 0xC1 + index * self.args.boards
            profile = traces.fleet_profile(self.args.boards, host, first_bus)
            self.boards[host] = [gpu["address"] for gpu in profile["gpus"]]
            self.kernels[host] = fakekernel.FakeKernel.build(
                os.path.join(self.tmp, host, "sys"), profile
            )
        every_board = [a for host in self.hostnames for a in self.boards[host]]
        for type_id, _share in traces.MIX.values():
            self.flags(device_addresses=every_board, group=f"mdev_{type_id}")
        for host in self.hostnames:
            if self.args.shared == "mixed":
                for board in self.boards[host]:
                    self.kernels[host].set_mixed_sizes(board, True)
            self.start_vgpu_compute(host)
        self.flavors = {
            (size, count): test_mixed_size.vgpu_flavor(self, type_id, size, count)
            for size, (type_id, _share) in traces.MIX.items()
            for count in (1, 2)
        }
        self.board_of_provider = {}
        for host in self.hostnames:
            for board in self.boards[host]:
                name = f"{host}_pci_" + board.replace(":", "_").replace(".", "_")
                self.board_of_provider[self._get_provider_uuid_by_name(name)] = (host, board)

    def test_trace(self):
        self._served = self.serve(self.args.requests)

    # -- serving -------------------------------------------------------------------------------

    def serve(self, requests):
        stats = collections.Counter()
        rejected_by_size = collections.Counter()
        servers = {}  # request id -> server id
        size_of_board, by_host = {}, collections.Counter()
        began, arrived = time.perf_counter(), 0
        for _tick, kind, request in traces.events(requests):
            if kind == "leave":
                if request.id in servers:
                    self.delete(servers.pop(request.id))
                continue
            arrived += 1
            server, fault = self.boot(request)
            if server["status"] == "ACTIVE":
                servers[request.id] = server["id"]
                stats["served"] += 1
                stats["rescheduled"] += self.refused_builds(server)
                host, board = self.board_of(server["id"])
                by_host[host] += 1
                if size_of_board.get(board, request.size) != request.size:
                    stats["retyped"] += 1
                size_of_board[board] = request.size
            elif NO_VALID_HOST in fault:
                stats["rejected"] += 1
                rejected_by_size[request.size] += 1
                self.delete(server["id"])
            else:
                stats["failed"] += 1
                print(f"request {request.id} ended in ERROR: {fault}", file=sys.stderr)
                self.delete(server["id"])
            if arrived % self.args.periodic_every == 0:
                self._run_periodics()
            if arrived % PROGRESS_EVERY == 0:
                print(
                    f"  {arrived} requests in {time.perf_counter() - began:.0f} s, "
                    f"{stats['rejected']} rejected",
                    file=sys.stderr,
                    flush=True,
                )
        for server_id in servers.values():
            self.delete(server_id)
        return {
            "stats": stats,
            "rejected_by_size": rejected_by_size,
            "served_by_host": by_host,
            "seconds": time.perf_counter() - began,
        }

    def boot(self, request):
        """``(server, fault message)`` once the server is ACTIVE or in ERROR."""
        body = self._build_server(
            name=f"r{request.id}",
            flavor_id=self.flavors[request.size, request.count],
            networks="none",
        )
        server = self.api.post_server({"server": body})
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            server = self.api.get_server(server["id"])
            if server["status"] in ("ACTIVE", "ERROR"):
                return server, server.get("fault", {}).get("message", "")
            time.sleep(POLL)
        self.fail(f"request {request.id}: its server still {server['status']} after {WAIT} s")

    def delete(self, server_id):
        self.api.delete_server(server_id)
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            try:
                self.api.get_server(server_id)
            except api_client.OpenStackApiNotFoundException:
                return
            time.sleep(POLL)
        self.fail(f"server {server_id} not gone after {WAIT} s")

    def board_of(self, server_id):
        """``(host, board)`` of the server's vGPUs, from its allocation."""
        held = self._get_allocations_by_server_uuid(server_id)
        (board,) = {self.board_of_provider[rp] for rp in held if rp in self.board_of_provider}
        return board

    def refused_builds(self, server):
        """Builds a compute refused before this server was ACTIVE (nova
        rescheduled each): its create action's events in error."""
        actions = self.api.get_instance_actions(server["id"])
        refused = 0
        for action in actions:
            if action["action"] != "create":
                continue
            detail = self.api.api_get(
                f"/servers/{server['id']}/os-instance-actions/{action['request_id']}"
            ).body["instanceAction"]
            refused += sum(
                1
                for event in detail.get("events", ())
                if event["event"] == "compute__do_build_and_run_instance"
                and event.get("result") == "Error"
            )
        return refused


def run(args):
    """Serve the trace through nova; ``(results, what went wrong)``."""
    boards = args.hosts * args.boards
    requests, mean_life = traces.trace(args.seed, args.arrivals, args.load, boards, args.multi)
    args.requests = requests
    per_board = traces.equal_size_max(traces.fleet_profile(1))
    split, best = traces.best_split(requests, boards, per_board)
    operator = traces.operator_split(boards)
    operator_rejected = traces.static_rejections(requests, operator, per_board)
    print(f"best static split: {traces._split_text(split)}, its model rejects {best}", flush=True)
    print(
        f"operator's split: {traces._split_text(operator)}, its model rejects {operator_rejected}",
        flush=True,
    )
    TraceThroughNova.args = args
    case = TraceThroughNova("test_trace")
    outcome = unittest.TestResult()
    case.run(outcome)
    wrong = [f"{test.id()} did not finish:\n{trace}" for test, trace in outcome.errors]
    wrong += [f"{test.id()} failed:\n{trace}" for test, trace in outcome.failures]
    wrong += [f"{test.id()} skipped: {why}" for test, why in outcome.skipped]
    results = {
        "mean_lifetime": mean_life,
        "split": split,
        "static_rejected": best,
        "operator_split": operator,
        "operator_rejected": operator_rejected,
    }
    served = getattr(case, "_served", None)
    if served is None:
        return results, wrong or ["the trace did not run"]
    stats = served["stats"]
    results.update(
        rejected=stats["rejected"],
        served=stats["served"],
        rejected_by_size={size: served["rejected_by_size"][size] for size in traces.MIX},
        served_by_host=dict(served["served_by_host"]),
        rescheduled=stats["rescheduled"],
        failed=stats["failed"],
        retyped=stats["retyped"],
        seconds=served["seconds"],
    )
    if stats["served"] + stats["rejected"] + stats["failed"] != len(requests):
        wrong.append(f"{stats['served']} served, {stats['rejected']} rejected of {len(requests)}")
    if stats["rescheduled"] or stats["failed"]:
        wrong.append(
            f"the boards refused {stats['rescheduled']} build(s) nova rescheduled and "
            f"{stats['failed']} server(s) ended in ERROR for another reason than no host"
        )
    return results, wrong


def report(results, args):
    print(
        f"\n{args.hosts} hosts x {args.boards} L40S boards ({args.shared}), {args.arrivals} "
        f"requests, seed {args.seed}, offered load {args.load:.0%} (mean lifetime "
        f"{results['mean_lifetime']:.1f} arrivals), {args.multi:.0%} ask two vGPUs; "
        f"scheduler: {SCHEDULERS[args.scheduler]}, "
        f"periodic update every {args.periodic_every} arrival(s)"
    )
    sizes = "/".join(str(results["rejected_by_size"][size]) for size in traces.MIX)
    print(
        f"rejected {results['rejected']} (of {'/'.join(map(str, traces.MIX))} GB: {sizes}), "
        f"served {results['served']} "
        f"({', '.join(f'{h} {n}' for h, n in sorted(results['served_by_host'].items()))}), "
        f"in {results['seconds']:.0f} s"
    )
    if args.shared == "pool":
        print(f"boards retyped (taken by another size than their last): {results['retyped']}")
    print(
        f"best static split {traces._split_text(results['split'])}: {results['static_rejected']} "
        f"rejected, ratio {results['ratio']:.2f}; operator's split "
        f"{traces._split_text(results['operator_split'])}: {results['operator_rejected']}, "
        f"ratio {results['ratio_operator']:.2f}"
    )


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=traces.SEED)
    parser.add_argument("--hosts", type=int, default=HOSTS)
    parser.add_argument("--boards", type=int, default=BOARDS_PER_HOST, help="L40S per host")
    parser.add_argument("--arrivals", type=int, default=traces.ARRIVALS)
    parser.add_argument("--load", type=float, default=traces.LOAD)
    parser.add_argument("--multi", type=float, default=traces.MULTI)
    parser.add_argument("--shared", choices=("mixed", "pool"), default="mixed")
    parser.add_argument(
        "--scheduler",
        choices=("ours", "nova"),
        default="ours",
        help="nova's filters and weighers with vgpu-driver's (default), or alone",
    )
    parser.add_argument(
        "--periodic-every",
        type=int,
        default=PERIODIC_EVERY,
        help="arrivals between two periodic updates of every compute (default 10)",
    )
    parser.add_argument("--json", metavar="FILE", help="Also write the numbers to FILE.")
    parser.add_argument("--tmpdir", metavar="DIR", help="Where to write the fake hosts.")
    args = parser.parse_args(argv)
    if min(args.hosts, args.boards, args.arrivals, args.periodic_every) < 1:
        parser.error("--hosts, --boards, --arrivals and --periodic-every must be at least 1")
    if args.load <= 0 or not 0 <= args.multi <= 1:
        parser.error("--load must be above 0 and --multi between 0 and 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.tmpdir:
        tempfile.tempdir = args.tmpdir  # nova's harness and ours write there
    results, wrong = run(args)
    if wrong:
        print("WRONG RESULTS:\n  " + "\n  ".join(wrong))
        return 1
    results["ratio"] = traces._ratio(results["rejected"], results["static_rejected"])
    results["ratio_operator"] = traces._ratio(results["rejected"], results["operator_rejected"])
    results.update(
        benchmark="nova_schedule",
        seed=args.seed,
        hosts=args.hosts,
        boards_per_host=args.boards,
        arrivals=args.arrivals,
        load=args.load,
        multi=args.multi,
        shared=args.shared,
        scheduler=args.scheduler,
        periodic_every=args.periodic_every,
        python=platform.python_version(),
    )
    report(results, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
