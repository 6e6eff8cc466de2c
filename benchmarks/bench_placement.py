"""Provider sync and allocation candidates against the real Placement, on sqlite and PostgreSQL.

nova-compute syncs each host's provider tree into Placement on every
resource update, and Nova's scheduler asks Placement for allocation
candidates on every boot.  This runs upstream Placement itself
(:class:`vgpu_driver.placement_service.EmbeddedPlacement`, served on
127.0.0.1 by a thread of this process) and measures:

(a) the requests and wall time of :class:`vgpu_driver.placement.ProviderSync`
    for the first sync and for a sync that changes nothing, on the large
    host of ``bench_discovery.py`` (8 A100 boards x 16 VFs + 8 T4s), on
    sqlite;
(b) 1000 hosts of 8 T4s each (one ``t4x8`` fake host, its tree computed
    under 1000 nodenames, half serving T4-1B and half T4-2Q) synced one
    after another into one Placement on a private PostgreSQL cluster
    (``tests/postgres.py``), then the latency of ``GET
    /allocation_candidates`` for a type trait and for ``limit=50``; the
    same queries on sqlite holding the same rows are the baseline.

Run ``python benchmarks/bench_placement.py [--hosts N] [--calls N] [--rounds N]
[--json FILE]``.  Part (b) needs root and PostgreSQL's server (bindep).  It
reports and exits 0 on correct results; only a wrong answer (a request
count, a provider, a candidate) exits 1.
"""

import argparse
import collections
import os
import platform
import sys
import tempfile
import threading
import time

import bench_discovery
import common

from vgpu_driver import discovery
from vgpu_driver import inventory
from vgpu_driver import placement
from vgpu_driver import sysfs
from vgpu_driver.conf.mdev_settings import MdevConfig
from vgpu_driver.conf.mdev_settings import TypeConfig
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles
from vgpu_driver.placement_service import EmbeddedPlacement

postgres = common.load_test_helper("postgres")

SQLITE = "sqlite://"
HOSTS = 1000
CALLS = 5
FIRST_SYNC_ROUNDS = 10
T4_1B, T4_2Q = "nvidia-222", "nvidia-231"
TRAIT_QUERY = "resources=VGPU:1&required=CUSTOM_VGPU_GRID_T4_1B"
LIMIT_QUERY = "resources=VGPU:1&limit=50"
LIMIT = 50
PROGRESS_EVERY = 100


# -- Placement and what it was asked -------------------------------------------------------


class RequestCounter:
    """WSGI middleware counting the requests Placement itself receives."""

    def __init__(self):
        self.counts = collections.Counter()
        self._lock = threading.Lock()

    def __call__(self, app):
        def counted(environ, start_response):
            with self._lock:
                self.counts[environ["REQUEST_METHOD"]] += 1
            return app(environ, start_response)

        return counted

    def snapshot(self):
        with self._lock:
            reads = self.counts["GET"]
            return reads, sum(self.counts.values()) - reads


def serve(database_url, counter):
    """Placement on ``database_url`` (each EmbeddedPlacement has its own engine)."""
    return EmbeddedPlacement(database_url, middleware=counter)


def get(conn, url):
    response = conn.placement.get(url, microversion=placement.MICROVERSION)
    if response.status_code != 200:
        raise SystemExit(f"GET {url}: HTTP {response.status_code} {response.text[:300]}")
    return response


def _timed(func, *args):
    start = time.perf_counter()
    result = func(*args)
    return result, (time.perf_counter() - start) * 1000


def first_reads(tree):
    """A first sync reads for the root, then looks each GPU provider's name
    up: it must not be held by a provider that is not ours."""
    return 1 + len(tree.providers)


def expected_writes(tree):
    """What a first sync of one host must write: its root, 3 per GPU, each
    custom trait and each custom resource class once."""
    traits = {t for p in tree.providers for t in p.traits}
    classes = {rc for p in tree.providers for rc in p.inventory() if rc.startswith("CUSTOM_")}
    return 1 + 3 * len(tree.providers) + len(traits) + len(classes)


# -- (a) one large host on sqlite -------------------------------------------------------------


def large_host(tmp):
    profile, a100_pfs = bench_discovery.large_host_profile()
    root = os.path.join(tmp, "large", "sys")
    bench_discovery.build_host(root, profile)
    config = bench_discovery.mdev_config(a100_pfs)
    snapshot = discovery.discover(sysfs.open_host(root))
    tree = inventory.compute(snapshot, config, bench_discovery.NODENAME)
    problems = bench_discovery.check_tree(tree, a100_pfs)
    return profile, snapshot, config, problems


def check_in_placement(conn, sync, tree):
    """Placement holds the tree: its providers, inventories and traits."""
    problems = []
    listed = get(conn, f"/resource_providers?in_tree={sync.root_uuid}").json()
    names = sorted(rp["name"] for rp in listed["resource_providers"])
    if names != sorted([tree.root_name, *(p.name for p in tree.providers)]):
        problems.append(f"{tree.root_name}: Placement has providers {names}")
    for provider in tree.providers:
        base = f"/resource_providers/{sync.known[provider.name].uuid}"
        inventories = get(conn, f"{base}/inventories").json()["inventories"]
        traits = sorted(get(conn, f"{base}/traits").json()["traits"])
        if inventories != provider.inventory() or traits != sorted(provider.traits):
            problems.append(f"{provider.name}: Placement has {inventories} {traits}")
    return problems


def _check_counts(label, report, counter_before, counter_after, expected):
    problems = []
    got = (report.reads, report.writes)
    seen = (counter_after[0] - counter_before[0], counter_after[1] - counter_before[1])
    if got != expected:
        problems.append(f"{label}: (reads, writes) {got}, expected {expected}")
    if seen != got:
        problems.append(f"{label}: Placement received (GET, other) {seen}, the report says {got}")
    return problems


def run_large(args, tmp):
    """First syncs under fresh nodenames, then no-change syncs of the last one."""
    profile, snapshot, config, problems = large_host(tmp)
    if problems:
        return None, [f"large host inventory: {p}" for p in problems]
    counter = RequestCounter()
    first_ms, again_ms = [], []
    with serve(SQLITE, counter) as service:
        conn = service.connection()
        client = placement.Client(conn)
        for index in range(FIRST_SYNC_ROUNDS):
            tree = inventory.compute(snapshot, config, f"{bench_discovery.NODENAME}-{index}")
            sync = placement.ProviderSync(client)
            before = counter.snapshot()
            common.settle()
            first, ms = _timed(sync.sync, tree)
            first_ms.append(ms)
            problems += _check_counts(
                f"first sync {index}",
                first,
                before,
                counter.snapshot(),
                (first_reads(tree), expected_writes(tree)),
            )
        problems += check_in_placement(conn, sync, tree)
        for index in range(args.rounds):
            before = counter.snapshot()
            common.settle()
            again, ms = _timed(sync.sync, tree)
            again_ms.append(ms)
            problems += _check_counts(
                f"no-change sync {index}", again, before, counter.snapshot(), (1, 0)
            )
    return {
        "host": profile["description"],
        "providers": len(tree.providers),
        "first": {"reads": first.reads, "writes": first.writes, "ms": common.summary(first_ms)},
        "no_change": {"reads": again.reads, "writes": again.writes, "ms": common.summary(again_ms)},
    }, problems


# -- (b) many hosts on PostgreSQL ---------------------------------------------------------------


def fleet_trees(tmp, hosts):
    """One t4x8 host's snapshot, as ``hosts`` nodes: even ones T4-1B, odd ones T4-2Q."""
    root = os.path.join(tmp, "t4x8", "sys")
    fakekernel.FakeKernel.build(root, profiles.load("t4x8"))
    snapshot = discovery.discover(sysfs.open_host(root))
    configs = [MdevConfig(types=(TypeConfig(t),), default_type=t) for t in (T4_1B, T4_2Q)]
    return [inventory.compute(snapshot, configs[i % 2], f"compute-{i:04d}") for i in range(hosts)]


def sync_fleet(conn, trees, counter):
    """Each tree with its own ProviderSync, one after another; the wall time too."""
    client = placement.Client(conn)
    syncs, reports, per_host_ms = [], [], []
    before = counter.snapshot()
    start = time.perf_counter()
    for index, tree in enumerate(trees, 1):
        sync = placement.ProviderSync(client)
        report, ms = _timed(sync.sync, tree)
        syncs.append(sync)
        reports.append(report)
        per_host_ms.append(ms)
        if index % PROGRESS_EVERY == 0 and index < len(trees):
            elapsed = time.perf_counter() - start
            print(f"  ... {index} hosts synced in {elapsed:.0f} s", flush=True)
    wall = time.perf_counter() - start
    after = counter.snapshot()
    reads, writes = sum(r.reads for r in reports), sum(r.writes for r in reports)
    problems = []
    # Each ProviderSync is new and knows no trait yet: each PUTs its type's two.
    expected = (
        sum(first_reads(tree) for tree in trees),
        sum(expected_writes(tree) for tree in trees),
    )
    if (reads, writes) != expected:
        problems.append(f"fleet sync: (reads, writes) {(reads, writes)}, expected {expected}")
    if (after[0] - before[0], after[1] - before[1]) != (reads, writes):
        problems.append(
            f"fleet sync: Placement received {after} - {before}, the reports say {(reads, writes)}"
        )
    return (
        syncs,
        {
            "hosts": len(trees),
            "wall_s": wall,
            "hosts_per_s": len(trees) / wall,
            "reads": reads,
            "writes": writes,
            "per_host_ms": common.summary(per_host_ms),
        },
        problems,
    )


def gpu_uuids(syncs, trees, type_id=None):
    return {
        sync.known[p.name].uuid
        for sync, tree in zip(syncs, trees, strict=True)
        for p in tree.providers
        if type_id in (None, p.type_id)
    }


def time_candidates(conn, query, calls):
    """Median of ``calls`` timed GETs after one untimed; the last answer and its size."""
    url = f"/allocation_candidates?{query}"
    get(conn, url)
    samples = []
    for _ in range(calls):
        common.settle()
        response, ms = _timed(get, conn, url)
        samples.append(ms)
    return response.json(), {"ms": common.summary(samples), "bytes": len(response.content)}


def candidate_rps(answer):
    return [rp for request in answer["allocation_requests"] for rp in request["allocations"]]


def check_candidates(label, answers, t4_1b, every_gpu):
    problems = []
    trait_rps = candidate_rps(answers[TRAIT_QUERY])
    if sorted(trait_rps) != sorted(t4_1b):
        problems.append(
            f"{label}: {len(trait_rps)} candidates for {TRAIT_QUERY} "
            f"({len(set(trait_rps) - t4_1b)} not T4-1B GPUs), expected "
            f"{len(t4_1b)}"
        )
    limit_rps = candidate_rps(answers[LIMIT_QUERY])
    wanted = min(LIMIT, len(every_gpu))
    if len(limit_rps) != wanted or not set(limit_rps) <= every_gpu:
        problems.append(
            f"{label}: {len(limit_rps)} candidates for {LIMIT_QUERY} "
            f"({len(set(limit_rps) - every_gpu)} unknown), expected {wanted}"
        )
    return problems


def candidates_on(conn, calls):
    answers, timings = {}, {}
    for query in (TRAIT_QUERY, LIMIT_QUERY):
        answers[query], timings[query] = time_candidates(conn, query, calls)
    return answers, timings


def count_rows(cluster):
    import psycopg2

    db = psycopg2.connect(cluster.dsn())
    try:
        with db.cursor() as cur:
            cur.execute("SELECT count(*) FROM resource_providers")
            count = cur.fetchone()[0]
            cur.execute(
                "SELECT current_setting('server_version'), current_setting('fsync'), "
                "current_setting('synchronous_commit'), "
                "current_setting('shared_buffers')"
            )
            settings = dict(
                zip(
                    ("version", "fsync", "synchronous_commit", "shared_buffers"),
                    cur.fetchone(),
                    strict=True,
                )
            )
    finally:
        db.close()
    return count, settings


def copy_rows(source_url, engine):
    """Every Placement table of ``source_url`` into ``engine``'s, replacing its rows."""
    import sqlalchemy

    source = sqlalchemy.create_engine(source_url)
    src_meta, dst_meta = sqlalchemy.MetaData(), sqlalchemy.MetaData()
    src_meta.reflect(source)
    dst_meta.reflect(engine)
    copied = 0
    try:
        with source.connect() as src, engine.begin() as dst:
            for table in reversed(dst_meta.sorted_tables):
                dst.execute(table.delete())
            for table in dst_meta.sorted_tables:
                if table.name == "alembic_version":
                    continue
                rows = [dict(r._mapping) for r in src.execute(src_meta.tables[table.name].select())]
                if rows:
                    dst.execute(table.insert(), rows)
                copied += len(rows)
    finally:
        source.dispose()
    return copied


def run_fleet(args, tmp):
    trees = fleet_trees(tmp, args.hosts)
    problems = []
    with postgres.private_cluster(parent=args.tmpdir) as cluster:
        counter = RequestCounter()
        with serve(cluster.url, counter) as service:
            print(
                f"Syncing {args.hosts} hosts into Placement on PostgreSQL ({service.endpoint}) ...",
                flush=True,
            )
            syncs, fleet, wrong = sync_fleet(service.connection(), trees, counter)
            problems += wrong
            t4_1b, every_gpu = gpu_uuids(syncs, trees, T4_1B), gpu_uuids(syncs, trees)
            pg_answers, pg_timings = candidates_on(service.connection(), args.calls)
            problems += check_candidates("PostgreSQL", pg_answers, t4_1b, every_gpu)
        rows, settings = count_rows(cluster)
        if rows != args.hosts * 9:
            problems.append(
                f"PostgreSQL holds {rows} resource providers, expected {args.hosts * 9}"
            )
        fleet["postgres"] = {**settings, "rows": rows, "data_fs": common.fs_type(cluster.workdir)}
        with serve(SQLITE, RequestCounter()) as service:
            from placement import db_api

            fleet["sqlite_rows_copied"] = copy_rows(cluster.url, db_api.get_placement_engine())
            sq_answers, sq_timings = candidates_on(service.connection(), args.calls)
            problems += check_candidates("sqlite", sq_answers, t4_1b, every_gpu)
    fleet["candidates"] = {
        query: {
            "postgres": pg_timings[query],
            "sqlite": sq_timings[query],
            "count": len(candidate_rps(pg_answers[query])),
            "ratio": pg_timings[query]["ms"]["median"] / sq_timings[query]["ms"]["median"],
        }
        for query in (TRAIT_QUERY, LIMIT_QUERY)
    }
    fleet["expected_trait_candidates"] = len(t4_1b)
    return fleet, problems


# -- reporting ---------------------------------------------------------------------------------


def _ms(summary):
    return f"{summary['median']:>9.1f} {summary['min']:>9.1f} {summary['max']:>9.1f}"


def print_large(large, rounds):
    print(f"(a) One large host on sqlite: {large['host']} -> {large['providers']} GPU providers")
    print(
        f"  {'sync':<22} {'reads':>6} {'writes':>6} {'median ms':>9} {'min ms':>9} "
        f"{'max ms':>9}  rounds"
    )
    for label, key, count in (
        ("first (new nodename)", "first", FIRST_SYNC_ROUNDS),
        ("no change", "no_change", rounds),
    ):
        part = large[key]
        print(f"  {label:<22} {part['reads']:>6} {part['writes']:>6} {_ms(part['ms'])}  {count}")
    print()


def print_fleet(fleet):
    pg = fleet["postgres"]
    print(
        f"(b) {fleet['hosts']} hosts x 8 T4 into one Placement on PostgreSQL "
        f"{pg['version']} (fsync={pg['fsync']}, synchronous_commit="
        f"{pg['synchronous_commit']}, shared_buffers={pg['shared_buffers']}, data on "
        f"{pg['data_fs']})"
    )
    per_host = fleet["per_host_ms"]
    print(
        f"  synced one after another in {fleet['wall_s']:.1f} s: "
        f"{fleet['hosts_per_s']:.2f} hosts/s; per host median {per_host['median']:.1f} ms, "
        f"max {per_host['max']:.1f} ms"
    )
    print(
        f"  requests: {fleet['reads'] + fleet['writes']} ({fleet['reads']} reads, "
        f"{fleet['writes']} writes); {pg['rows']} resource providers in the database"
    )
    print(
        f"  allocation candidates, median of {fleet['calls']} calls after one untimed "
        f"(sqlite: the same {fleet['sqlite_rows_copied']} rows, copied)"
    )
    print(
        f"  {'query':<52} {'found':>5} {'PG ms':>8} {'sqlite ms':>9} {'PG/sqlite':>9} {'bytes':>9}"
    )
    for query, result in fleet["candidates"].items():
        print(
            f"  {query:<52} {result['count']:>5} "
            f"{result['postgres']['ms']['median']:>8.1f} "
            f"{result['sqlite']['ms']['median']:>9.1f} {result['ratio']:>9.2f} "
            f"{result['postgres']['bytes']:>9}"
        )
    print()


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--hosts",
        type=int,
        default=HOSTS,
        help=f"Hosts of 8 GPUs synced into PostgreSQL (default: {HOSTS}).",
    )
    parser.add_argument(
        "--calls",
        type=int,
        default=CALLS,
        help=f"Timed calls per allocation-candidates query (default: {CALLS}).",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=30,
        help="Timed no-change syncs of the large host (default: 30).",
    )
    parser.add_argument("--json", metavar="FILE", help="Also write the numbers to FILE.")
    parser.add_argument(
        "--tmpdir",
        metavar="DIR",
        help="Where to write the fake trees and the PostgreSQL cluster "
        "(default: the system's temp dir; the postgres user must reach "
        "it).",
    )
    args = parser.parse_args(argv)
    for name in ("hosts", "calls", "rounds"):
        if getattr(args, name) < 2:
            parser.error(f"--{name} must be at least 2")
    return args


def main(argv=None):
    args = parse_args(argv)
    reason = postgres.unavailable()
    if reason:
        sys.exit(f"bench_placement needs PostgreSQL for part (b): {reason}")
    results = {"benchmark": "placement", "python": platform.python_version()}
    with tempfile.TemporaryDirectory(prefix="bench-placement-", dir=args.tmpdir) as tmp:
        large, problems = run_large(args, tmp)
        if not problems:
            print_large(large, args.rounds)
            fleet, wrong = run_fleet(args, tmp)
            fleet["calls"] = args.calls
            problems += wrong
    if problems:
        print("WRONG RESULTS, the timings mean nothing:\n  " + "\n  ".join(problems[:20]))
        return 1
    print_fleet(fleet)
    results.update(
        {
            "large_host": large,
            "fleet": fleet,
            "rounds": args.rounds,
            "first_sync_rounds": FIRST_SYNC_ROUNDS,
        }
    )
    common.write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
