"""Allocation latency as domains grow, against Nova's per-spawn XML scan.

Nova decides which mdevs are free on every spawn by asking libvirt for every
defined domain, parsing each one's XML and collecting its mdev hostdevs, so
its cost grows with the number of domains.  This measures
:meth:`vgpu_driver.mdevs.MdevManager.allocate` (claims journal, domain
references, one GPU's sysfs) against that scan, timed in the same run on the
same host, with 50, 500 and 5000 defined domains and 500 claims.  The
targets are ``baseline / ours >= 20`` at 500 domains and
``ours(5000) / ours(50) <= 1.5``.

The domains are defined in libvirt's ``test:///default`` driver, so the
baseline pays libvirt's real ``listAllDomains`` and ``XMLDesc`` calls.  Our
side reads them through the package's index,
:class:`vgpu_driver.libvirt_host.LibvirtHost`, on its own connection to the
same driver: each domain's XML is parsed once, and libvirt's events keep the
index current.

Run ``python benchmarks/bench_allocation.py [--rounds N] [--json FILE]``.  It
reports and always exits 0 on correct results; only a wrong answer (the
timings would then mean nothing) exits 1.
"""

import cProfile
import os
import platform
import pstats
import statistics
import sys
import tempfile
import time
import uuid

try:
    import libvirt
except ImportError:  # pragma: no cover - depends on the environment
    sys.exit("bench_allocation needs libvirt-python (pip install -e '.[libvirt]')")
import common
import libvirt_domains

from vgpu_driver import claims as claims_mod
from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import guest
from vgpu_driver import inventory
from vgpu_driver import libvirt_host
from vgpu_driver import mdevs
from vgpu_driver.conf.mdev_types import MdevConfig
from vgpu_driver.conf.mdev_types import TypeConfig
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles

NODENAME = "bench-host"
TYPE_ID = "nvidia-222"  # T4-1B: at most 16 per GPU.
MDEVS_PER_GPU = 16
TARGET_USED = 15  # mdevs of the GPU allocated from that guests use; one stays free
OTHER_USED = 5  # per other GPU
CLAIMS = 500
SIZES = (50, 500, 5000)
RATIO_SIZE = 500

RATIO_TARGET = 20.0
FLAT_TARGET = 1.5


# -- the host and its guests ----------------------------------------------------


def host_profile():
    """``t4x8`` with every T4 full: 16 T4-1B each, UUIDs sorted per GPU.

    Returns ``(profile, {gpu address: [mdev uuids, sorted]})``.
    """
    profile = profiles.load("t4x8")
    by_gpu = {gpu["address"]: sorted(str(uuid.uuid4()) for _ in range(MDEVS_PER_GPU))
              for gpu in profile["gpus"]}
    profile["mdevs"] = [{"parent": address, "type": TYPE_ID, "uuid": u}
                        for address, uuids in by_gpu.items() for u in uuids]
    profile["description"] = (f"8 x T4 (t4x8), {MDEVS_PER_GPU} {TYPE_ID} mdevs on each "
                              f"({MDEVS_PER_GPU * len(by_gpu)} in all)")
    return profile, by_gpu


class Guests:
    """Who uses what: the same domains and claims for every size.

    50 *local* domains use host mdevs: the first 15 of the target GPU (the
    16th, last in name order, is the only free one there, so every
    allocation skips 15 used mdevs first) and the first 5 of each other
    GPU.  The rest stand for guests whose mdevs are not on this host right
    now (shut off, their mdevs gone); each costs the baseline a parse.
    The journal holds the same 500 ``attached`` claims at every size: those
    of the 50 local domains, and those of the next 450, recorded on the
    other GPUs (their mdevs are recreated when the guests start).
    """

    def __init__(self, by_gpu, target):
        self.target = target
        self.free = by_gpu[target][TARGET_USED]
        self.local = [(target, u) for u in by_gpu[target][:TARGET_USED]]
        others = [address for address in by_gpu if address != target]
        for address in others:
            self.local += [(address, u) for u in by_gpu[address][:OTHER_USED]]
        remote_count = max(SIZES) - len(self.local)
        self.remote = [str(uuid.uuid4()) for _ in range(remote_count)]
        self.domain_uuids = [str(uuid.uuid4()) for _ in range(max(SIZES))]
        self.claims = [(self.domain_uuids[i], mdev, gpu, claims_mod.ATTACHED)
                       for i, (gpu, mdev) in enumerate(self.local)]
        pending = CLAIMS - len(self.claims)
        self.claims += [(self.domain_uuids[len(self.local) + i], mdev,
                         others[i % len(others)], claims_mod.ATTACHED)
                        for i, mdev in enumerate(self.remote[:pending])]

    def mdev_of(self, index):
        if index < len(self.local):
            return self.local[index][1]
        return self.remote[index - len(self.local)]

    def domain_mdevs(self, count):
        """``{mdev uuid: domain uuid}`` of the first ``count`` domains."""
        return {self.mdev_of(i): self.domain_uuids[i] for i in range(count)}


def open_libvirt(guests, count):
    """The shared ``test:///default`` driver, holding the first ``count`` domains."""
    conn = libvirt_domains.open_empty()
    define_ms = libvirt_domains.define(
        conn, ((i, guests.domain_uuids[i], guests.mdev_of(i)) for i in range(count)))
    return conn, define_ms


# -- the two paths ------------------------------------------------------------------


def nova_scan(conn, host, parents):
    """What Nova does per spawn: every domain's XML, then a free mdev.

    Cheaper than Nova itself: an lxml parse and the package's
    :func:`~vgpu_driver.guest.mdev_uuids` instead of building the full guest
    config objects, and the one parent's sysfs directory instead of
    libvirt's node devices.  It writes no claim either.
    """
    used = set()
    for dom in conn.listAllDomains(0):
        used.update(guest.mdev_uuids(guest.parse(dom.XMLDesc(0))))
    for parent in parents:
        for mdev_uuid, type_id in host.parent_mdevs(parent):
            if type_id == TYPE_ID and mdev_uuid not in used:
                return mdev_uuid
    return None


class Ours:
    """One spawn's allocation, then (untimed) the guest's define and delete."""

    def __init__(self, manager, index, conn, provider):
        self.manager, self.index, self.conn = manager, index, conn
        self.rp_uuid = str(uuid.uuid4())
        self.providers = {self.rp_uuid: provider}
        self.allocations = {self.rp_uuid: {"resources": {provider.resource_class: 1}}}
        self.spawns = 0

    def allocate(self, instance_uuid):
        return self.manager.allocate(instance_uuid, self.allocations, self.providers)

    def guest_comes_and_goes(self, instance_uuid, mdev_uuid):
        """Define the guest, attach, undefine, release: state as before."""
        self.spawns += 1
        dom = self.conn.defineXML(libvirt_domains.domain_xml(
            0xF000000 + self.spawns, instance_uuid, mdev_uuid))
        libvirt_domains.wait_for(self.index, mdev_uuid, present=True)
        self.manager.mark_attached(instance_uuid)
        dom.undefine()
        libvirt_domains.wait_for(self.index, mdev_uuid, present=False)
        self.manager.release(instance_uuid)


# -- timing --------------------------------------------------------------------


def time_rounds(rounds, baseline, ours, expected):
    """Interleaved rounds (:func:`common.interleaved`), every answer checked.

    The wrong answers are returned with the samples.
    """
    wrong = []

    def one_baseline():
        common.settle()
        start = time.perf_counter()
        got = baseline()
        elapsed = (time.perf_counter() - start) * 1000
        if got != expected:
            wrong.append(f"baseline picked {got}, expected {expected}")
        return elapsed

    def one_ours():
        instance = str(uuid.uuid4())
        common.settle()
        start = time.perf_counter()
        try:
            got = ours.allocate(instance)
        except exception.VgpuDriverError as exc:
            got = f"{type(exc).__name__}: {exc}"
        elapsed = (time.perf_counter() - start) * 1000
        if got != [expected]:
            wrong.append(f"ours gave {got}, expected [{expected}]")
        if isinstance(got, list) and got:
            ours.guest_comes_and_goes(instance, got[0])
        return elapsed

    baseline_ms, ours_ms = common.interleaved(rounds, one_baseline, one_ours)
    return baseline_ms, ours_ms, wrong


def profile_ours(ours, rounds):
    """cProfile over ``rounds`` allocations (guest lifecycle not profiled)."""
    profiler = cProfile.Profile()
    for _ in range(rounds):
        instance = str(uuid.uuid4())
        common.settle()
        profiler.enable()
        got = ours.allocate(instance)
        profiler.disable()
        ours.guest_comes_and_goes(instance, got[0])
    stats = pstats.Stats(profiler)
    rows = []
    for (filename, line, func), (_cc, calls, tottime, cumtime, _) in stats.stats.items():
        where = _short(filename)
        rows.append({"function": f"{where}:{line}({func})", "calls": calls // rounds,
                     "tottime_ms": tottime * 1000 / rounds,
                     "cumtime_ms": cumtime * 1000 / rounds})
    return rows


def _short(filename):
    for marker in ("vgpu_driver" + os.sep, "benchmarks" + os.sep):
        if marker in filename:
            return filename[filename.index(marker):]
    return os.path.basename(filename) if filename.startswith(("/", "<frozen")) else filename


# -- checking and reporting ----------------------------------------------------


def check_state(journal, index, conn, guests, count):
    """Both sides see the same world: index == full scan, claims as made."""
    problems = []
    if not index.event_driven:
        problems.append("the index is not event-driven: every lookup would be a full scan")
    problems += libvirt_domains.index_problems(index, conn, guests.domain_mdevs(count))
    held = {c.mdev_uuid: c.instance_uuid for c in journal.claims()}
    if held != {mdev: inst for inst, mdev, _gpu, _state in guests.claims}:
        problems.append(f"the journal holds {len(held)} claims, expected {CLAIMS}")
    return problems


def print_setup(results):
    print(f"Host: {results['host']}")
    print(f"  allocating 1 x {TYPE_ID} on {results['gpu']}: {TARGET_USED} of its "
          f"{MDEVS_PER_GPU} mdevs are in use, the free one is last in name order")
    local = results["local_domains"]
    print(f"Journal: {CLAIMS} attached claims ({local} for guests on host mdevs, the "
          f"others on other GPUs); state dir on {results['state_fs']}")
    print(f"Domains: libvirt {results['libvirt']} test driver, each with a disk, an "
          f"interface and one mdev hostdev; {local} use host mdevs, the others mdevs "
          f"that are not on this host")
    print()
    print("Setup per size (untimed in the rounds)")
    print(f"  {'domains':>7} {'defineXML ms':>13} {'index build ms':>15} "
          f"{'index update ms':>16}")
    for size in results["sizes"]:
        print(f"  {size['domains']:>7} {size['define_ms']:>13.1f} "
              f"{size['index_build_ms']:>15.1f} {size['index_update_ms']:>16.3f}")
    print("  (index update: median handling of one define/undefine event)")
    print()


def print_timing(results):
    print(f"Timing: allocate 1 VGPU, {results['rounds']} interleaved rounds per size "
          f"(Python {platform.python_version()}, tree and journal under "
          f"{results['tmp_dir']})")
    print(f"  {'domains':>7} {'ours ms':>9} {'min':>7} {'baseline ms':>12} {'min':>8} "
          f"{'baseline/ours':>14}")
    for size in results["sizes"]:
        ours, base = size["ours_ms"], size["baseline_ms"]
        print(f"  {size['domains']:>7} {ours['median']:>9.3f} {ours['min']:>7.3f} "
              f"{base['median']:>12.2f} {base['min']:>8.2f} {size['ratio_median']:>14.1f}")
    print(f"  (medians; baseline/ours is the ratio of the medians; each timed window "
          f"follows {results['settle']})")
    print()
    targets = results["targets"]
    print("Targets")
    print(f"  [{common.mark(targets['ratio_ok'])}] baseline/ours at {RATIO_SIZE} domains "
          f"{targets['ratio_at_size']:.1f} >= {RATIO_TARGET:.0f}")
    print(f"  [{common.mark(targets['flat_ok'])}] ours({max(SIZES)}) / ours({min(SIZES)}) "
          f"{targets['flatness']:.2f} <= {FLAT_TARGET}")


# Parts of an allocation, as ``(label, [function suffixes whose cumulative times add up])``.
PROFILE_PARTS = (
    ("claims journal (claims.py, sqlite3)",
     ["claims.py(transaction)", "claims.py(claims)", "claims.py(add)"]),
    ("one GPU's sysfs (mdevs.py _gpu_states)", ["mdevs.py(_gpu_states)"]),
    ("domain references (the mdev_users() call itself)", ["(mdev_users)"]),
)


def _cum(rows, suffixes):
    total = 0.0
    for row in rows:
        function = row["function"]
        name = function[:function.index(":")] + function[function.index("("):]
        if any(name.endswith(suffix) for suffix in suffixes):
            total += row["cumtime_ms"]
    return total


def profile_parts(rows):
    """``[(label, ms)]``: the journal, the sysfs reads, the domain references, the rest."""
    total = max(r["cumtime_ms"] for r in rows)
    parts = [(label, _cum(rows, suffixes)) for label, suffixes in PROFILE_PARTS]
    parts.append(("the rest (planning, logging)", total - sum(ms for _, ms in parts)))
    return total, parts


def print_profile(rows, size, rounds):
    total, parts = profile_parts(rows)
    print()
    print(f"Where ours spends its time: cProfile over {rounds} allocations at {size} domains, "
          f"{total:.3f} ms each (profiled)")
    for label, ms in parts:
        print(f"  {ms:>7.3f} ms {100 * ms / total:>4.0f} %  {label}")
    print(f"  {'own ms':>7} {'cum ms':>7} {'calls':>5}  functions by own time")
    for row in sorted(rows, key=lambda r: r["tottime_ms"], reverse=True)[:10]:
        print(f"  {row['tottime_ms']:>7.3f} {row['cumtime_ms']:>7.3f} {row['calls']:>5}  "
              f"{row['function']}")


# -- one size, and the whole run --------------------------------------------------------


def run_size(args, count, host, journal, guests, config, provider, parents):
    conn, define_ms = open_libvirt(guests, count)
    start = time.perf_counter()
    index = libvirt_domains.TimedHost()
    build_ms = (time.perf_counter() - start) * 1000
    try:
        problems = check_state(journal, index, conn, guests, count)
        if problems:
            return None, problems, None
        manager = mdevs.MdevManager(host, journal, index, config)
        ours = Ours(manager, index, conn, provider)
        baseline_ms, ours_ms, wrong = time_rounds(
            args.rounds, lambda: nova_scan(conn, host, parents), ours, guests.free)
        problems = wrong + check_state(journal, index, conn, guests, count)
        profile = profile_ours(ours, args.rounds) if count == max(SIZES) else None
        base, mine = common.summary(baseline_ms), common.summary(ours_ms)
        size = {"domains": count, "define_ms": define_ms, "index_build_ms": build_ms,
                "index_update_ms": statistics.median(index.update_ms),
                "baseline_ms": base, "ours_ms": mine,
                "ratio_median": base["median"] / mine["median"],
                "ratio_min": base["min"] / mine["min"]}
        return size, problems, profile
    finally:
        index.close()
        conn.close()


def setup_host(tmp):
    """The fake host, its journal with the claims, and what allocation needs."""
    profile, by_gpu = host_profile()
    host = fakekernel.FakeKernel.build(os.path.join(tmp, "sys"), profile)
    target = sorted(by_gpu)[0]
    guests = Guests(by_gpu, target)
    journal = claims_mod.Journal(os.path.join(tmp, "state"))
    with journal.transaction() as txn:
        for instance, mdev_uuid, gpu, state in guests.claims:
            txn.add(instance, mdev_uuid, gpu, gpu, TYPE_ID, state)
    config = MdevConfig(types=(TypeConfig(TYPE_ID),), default_type=TYPE_ID)
    snapshot = discovery.discover(host)
    provider = inventory.compute(snapshot, config, NODENAME).by_gpu(target)
    parents = [p.name for p in snapshot.gpu(target).parents]
    return profile, host, journal, guests, config, provider, parents


def main(argv=None):
    args = common.parse_args(argv, __doc__.split("\n\n")[0],
                             'Timed rounds of each path per size',
                             "Where to write the fake tree and the claims journal "
                             "(default: the system's temp dir).")
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    libvirt_host.start_event_loop()
    sizes, problems, profile = [], [], None
    with tempfile.TemporaryDirectory(prefix="bench-allocation-", dir=args.tmpdir) as tmp:
        host_profile_, host, journal, guests, config, provider, parents = setup_host(tmp)
        local = len(guests.local)
        state_fs = common.fs_type(tmp)
        for count in SIZES:
            size, wrong, size_profile = run_size(args, count, host, journal, guests, config,
                                                 provider, parents)
            problems += [f"{count} domains: {p}" for p in wrong]
            if size is None:
                break
            sizes.append(size)
            profile = size_profile or profile
    if problems:
        print("WRONG RESULTS, the timings mean nothing:\n  " + "\n  ".join(problems[:20]))
        return 1
    by_size = {s["domains"]: s for s in sizes}
    flatness = by_size[max(SIZES)]["ours_ms"]["median"] / by_size[min(SIZES)]["ours_ms"][
        "median"]
    results = {
        "benchmark": "allocation", "host": host_profile_["description"],
        "gpu": provider.gpu, "claims": CLAIMS, "local_domains": local,
        "rounds": args.rounds, "settle": common.SETTLE,
        "python": platform.python_version(),
        "libvirt": libvirt_domains.libvirt_version(),
        "tmp_dir": os.path.dirname(tmp), "state_fs": state_fs, "sizes": sizes,
        "profile": {"domains": max(SIZES), "parts_ms": dict(profile_parts(profile)[1]),
                    "functions": sorted(profile, key=lambda r: r["tottime_ms"],
                                        reverse=True)[:40]},
        "targets": {"ratio": RATIO_TARGET, "ratio_at_size": by_size[RATIO_SIZE][
            "ratio_median"], "flat": FLAT_TARGET, "flatness": flatness},
    }
    results["targets"]["ratio_ok"] = results["targets"]["ratio_at_size"] >= RATIO_TARGET
    results["targets"]["flat_ok"] = flatness <= FLAT_TARGET
    print_setup(results)
    print_timing(results)
    print_profile(profile, max(SIZES), args.rounds)
    common.write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
