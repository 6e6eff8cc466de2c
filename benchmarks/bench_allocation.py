"""Allocation latency in nova-compute as domains grow, against nova's own scan.

nova decides which mdevs are free on every spawn with
``LibvirtDriver._get_all_assigned_mediated_devices``: every defined domain
from libvirt, each one's XML parsed into nova's guest config objects, so its
cost grows with the number of domains.  This measures the class that ships,
:class:`vgpu_driver.nova.LibvirtVGPUDriver`, built as nova-compute builds it
(``load_compute_driver`` with nova's config), allocating one VGPU through its
``_allocate_mdevs`` as nova's spawn calls it: the domain index fed by nova's
own ``Host`` (its connection, its event loop, its callbacks), then the claims
journal on disk.  The baseline is nova's method itself, called on the same
driver object, so both talk to the same private, real ``libvirtd``
(``tests/libvirtd.py``) holding 50, 500 and 5000 defined domains.  The
targets are ``baseline / ours >= 20`` at 500 domains and
``ours(5000) / ours(50) <= 1.5``.

Run ``python benchmarks/bench_allocation.py [--rounds N] [--json FILE]`` as
root (the qemu:///system daemon needs it).  It reports and always exits 0 on
correct results; only a wrong answer (the timings would then mean nothing)
exits 1.
"""

import cProfile
import os
import platform
import pstats
import sys
import tempfile
import textwrap
import time
import traceback
import uuid

try:
    import libvirt
    from nova import config as nova_config
    from nova.compute import provider_tree as nova_provider_tree
    from nova.virt import driver as virt_driver
    from nova.virt import fake as fake_virt
    from nova.virt.libvirt import driver as libvirt_driver
except ImportError:  # pragma: no cover - depends on the environment
    sys.exit("bench_allocation needs nova and libvirt-python (the nova venv)")
import common
import libvirt_domains

from vgpu_driver import claims as claims_mod
from vgpu_driver import claims_journal
from vgpu_driver import driver as core
from vgpu_driver import nova_alias
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles

private_libvirtd = common.load_test_helper("libvirtd")

NODENAME = "bench-host"
TYPE_ID = "nvidia-222"  # T4-1B: at most 16 per GPU.
MDEVS_PER_GPU = 16
TARGET_USED = 15  # mdevs of the GPU allocated from that guests use; one stays free
OTHER_USED = 5  # per other GPU
CLAIMS = 500
SIZES = (50, 500, 5000)
RATIO_SIZE = 500
# nova's scan of 5000 domains takes seconds: fewer rounds of it there.
BASELINE_ROUNDS_CAP = {5000: 7}

RATIO_TARGET = 20.0
FLAT_TARGET = 1.5


# -- the host and its guests ----------------------------------------------------


def host_profile():
    """``t4x8`` with every T4 full: 16 T4-1B each, UUIDs sorted per GPU.

    Returns ``(profile, {gpu address: [mdev uuids, sorted]})``.
    """
    profile = profiles.load("t4x8")
    by_gpu = {
        gpu["address"]: sorted(str(uuid.uuid4()) for _ in range(MDEVS_PER_GPU))
        for gpu in profile["gpus"]
    }
    profile["mdevs"] = [
        {"parent": address, "type": TYPE_ID, "uuid": u}
        for address, uuids in by_gpu.items()
        for u in uuids
    ]
    profile["description"] = (
        f"8 x T4 (t4x8), {MDEVS_PER_GPU} {TYPE_ID} mdevs on each "
        f"({MDEVS_PER_GPU * len(by_gpu)} in all)"
    )
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
        self.claims = [
            (self.domain_uuids[i], mdev, gpu, claims_mod.ATTACHED)
            for i, (gpu, mdev) in enumerate(self.local)
        ]
        pending = CLAIMS - len(self.claims)
        self.claims += [
            (
                self.domain_uuids[len(self.local) + i],
                mdev,
                others[i % len(others)],
                claims_mod.ATTACHED,
            )
            for i, mdev in enumerate(self.remote[:pending])
        ]

    def mdev_of(self, index):
        if index < len(self.local):
            return self.local[index][1]
        return self.remote[index - len(self.local)]

    def domain_mdevs(self, count):
        """``{mdev uuid: domain uuid}`` of the first ``count`` domains."""
        return {self.mdev_of(i): self.domain_uuids[i] for i in range(count)}


def domain_xml(index, dom_uuid, mdev_uuid):
    """A KVM guest as nova-compute defines it, with one mdev hostdev."""
    return libvirt_domains.domain_xml(index, dom_uuid, mdev_uuid, hypervisor="kvm")


def define(conn, guests, start, stop):
    """Define domains ``start`` .. ``stop - 1``; returns the ms it took."""
    began = time.perf_counter()
    for i in range(start, stop):
        conn.defineXML(domain_xml(i, guests.domain_uuids[i], guests.mdev_of(i)))
    return (time.perf_counter() - began) * 1000


# -- nova-compute's driver -------------------------------------------------------------


def nova_conf(tmp, uri):
    """The nova.conf of this host: nova's libvirt on the private daemon, our
    journal and the fake tree."""
    path = os.path.join(tmp, "nova.conf")
    with open(path, "w") as f:
        f.write(
            textwrap.dedent(f"""
            [DEFAULT]
            host = {NODENAME}
            state_path = {tmp}/nova
            instances_path = {tmp}/nova/instances
            [libvirt]
            virt_type = kvm
            connection_uri = {uri}
            [devices]
            enabled_mdev_types = {TYPE_ID}
            [vgpu]
            state_dir = {tmp}/state
            sysfs_root = {tmp}/sys
            """)
        )
    return path


class _NoPlacement:
    """nova-compute's report client, where no Placement runs: the provider
    tree is built once, before nova's tree holds our providers, so nothing
    is asked of Placement; a question would be a change in what is measured."""

    def __getattr__(self, name):
        raise AssertionError(f"the benchmark runs no Placement, yet reportclient.{name} was used")


class _VirtAPI(fake_virt.FakeVirtAPI):
    """nova's fake virt API with the ``reportclient`` nova-compute's has."""

    reportclient = _NoPlacement()


def compute_driver(conf_file, kernel):
    """``LibvirtVGPUDriver`` as nova-compute loads and starts it.

    The one difference: its core driver reads the fake kernel (no GPU here)
    instead of ``/sys``.  nova's ``init_host`` runs in full (its event loop,
    its callbacks); ours then turns the index event-driven, as its
    ``init_host`` does, without the reboot restore (no guest runs here).
    """
    nova_alias.install()  # as vgpu-nova-compute does before nova-compute runs
    nova_config.parse_args([], default_config_files=[conf_file])
    drv = virt_driver.load_compute_driver(_VirtAPI(), "vgpu_driver.nova.LibvirtVGPUDriver")
    # nova-compute's handler records the connection in nova's database through
    # the conductor; neither runs here.
    drv._host._conn_event_handler = None
    drv._vgpu = core.VGPUDriver(libvirt_driver.CONF, drv._domains, host=kernel)
    libvirt_driver.LibvirtDriver.init_host(drv, NODENAME)
    drv.vgpu.domains.event_driven = True
    return drv


def nova_tree(drv):
    """nova's provider tree after our GPU part of an update, as the resource
    tracker leaves it in the driver."""
    tree = nova_provider_tree.ProviderTree()
    tree.new_root(NODENAME, str(uuid.uuid4()))
    drv._update_provider_tree_for_vgpu(tree, NODENAME)
    drv.provider_tree = tree
    return tree


# -- the two paths ------------------------------------------------------------------


class Ours:
    """One spawn's allocation as nova's spawn reaches it, then (untimed) the
    guest's define, the driver's instance_defined, undefine, release."""

    def __init__(self, drv, conn, allocations):
        self.drv, self.conn, self.allocations = drv, conn, allocations
        self.index = drv.vgpu.domains
        self.spawns = 0

    def allocate(self, instance_uuid):
        with self.drv._operating_on(_Instance(instance_uuid)):
            return self.drv._allocate_mdevs(self.allocations)

    def guest_comes_and_goes(self, instance_uuid, mdev_uuid):
        self.spawns += 1
        dom = self.conn.defineXML(domain_xml(0xF000000 + self.spawns, instance_uuid, mdev_uuid))
        libvirt_domains.wait_for(self.index, mdev_uuid, present=True)
        self.drv.vgpu.instance_defined(instance_uuid)
        dom.undefine()
        libvirt_domains.wait_for(self.index, mdev_uuid, present=False)
        self.drv.vgpu.release(instance_uuid)


class _Instance:
    """What ``_operating_on`` reads of nova's Instance."""

    def __init__(self, instance_uuid):
        self.uuid = instance_uuid


def nova_scan(drv):
    """nova's own per-spawn scan, not our override (which adds our claims)."""
    return libvirt_driver.LibvirtDriver._get_all_assigned_mediated_devices(drv)


# -- timing --------------------------------------------------------------------


def time_rounds(rounds, baseline, baseline_expected, ours, expected):
    """Interleaved rounds (:func:`common.interleaved`), every answer checked.

    The wrong answers are returned with the samples.
    """
    wrong = []

    def one_baseline():
        common.settle()
        start = time.perf_counter()
        got = baseline()
        elapsed = (time.perf_counter() - start) * 1000
        if got != baseline_expected:
            wrong.append(f"nova found {len(got)} assigned mdevs, expected {len(baseline_expected)}")
        return elapsed

    def one_ours():
        instance = str(uuid.uuid4())
        common.settle()
        start = time.perf_counter()
        try:
            got = ours.allocate(instance)
        except Exception as exc:  # noqa: BLE001 - reported as a wrong answer
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
        rows.append(
            {
                "function": f"{where}:{line}({func})",
                "calls": calls // rounds,
                "tottime_ms": tottime * 1000 / rounds,
                "cumtime_ms": cumtime * 1000 / rounds,
            }
        )
    return rows


def _short(filename):
    for marker in ("vgpu_driver" + os.sep, "benchmarks" + os.sep):
        if marker in filename:
            return filename[filename.index(marker) :]
    return os.path.basename(filename) if filename.startswith(("/", "<frozen")) else filename


# -- checking and reporting ----------------------------------------------------


def print_setup(results):
    print(f"Host: {results['host']}")
    print(
        f"  allocating 1 x {TYPE_ID} on {results['gpu']}: {TARGET_USED} of its "
        f"{MDEVS_PER_GPU} mdevs are in use, the free one is last in name order"
    )
    local = results["local_domains"]
    print(
        f"Journal: {CLAIMS} attached claims ({local} for guests on host mdevs, the "
        f"others on other GPUs); state dir on {results['state_fs']}"
    )
    print(
        f"Domains: a private libvirtd ({results['daemon']}, libvirt "
        f"{results['libvirt']}), KVM guests each with a disk, an interface and one "
        f"mdev hostdev; {local} use host mdevs, the others mdevs not on this host"
    )
    print(
        "Ours: LibvirtVGPUDriver._allocate_mdevs inside nova's spawn context, index fed "
        "by nova's Host events; baseline: nova's "
        "LibvirtDriver._get_all_assigned_mediated_devices on the same driver"
    )
    print()
    print("Setup per size (untimed in the rounds)")
    print(f"  {'domains':>7} {'defineXML ms':>13} {'index build ms':>15} {'rounds':>7}")
    for size in results["sizes"]:
        print(
            f"  {size['domains']:>7} {size['define_ms']:>13.1f} "
            f"{size['index_build_ms']:>15.1f} {size['rounds']:>7}"
        )
    print("  (defineXML: the domains added for this size; index build: one full re-read,")
    print("   which the index repeats at most once per max_staleness)")
    print()


def print_timing(results):
    print(
        f"Timing: allocate 1 VGPU, interleaved rounds (above) per size "
        f"(Python {platform.python_version()}, tree and journal under "
        f"{results['tmp_dir']})"
    )
    print(
        f"  {'domains':>7} {'ours ms':>9} {'min':>7} {'baseline ms':>12} {'min':>8} "
        f"{'baseline/ours':>14}"
    )
    for size in results["sizes"]:
        ours, base = size["ours_ms"], size["baseline_ms"]
        print(
            f"  {size['domains']:>7} {ours['median']:>9.3f} {ours['min']:>7.3f} "
            f"{base['median']:>12.2f} {base['min']:>8.2f} {size['ratio_median']:>14.1f}"
        )
    print(
        f"  (medians; baseline/ours is the ratio of the medians; each timed window "
        f"follows {results['settle']})"
    )
    print()
    targets = results["targets"]
    print("Targets")
    print(
        f"  [{common.mark(targets['ratio_ok'])}] baseline/ours at {RATIO_SIZE} domains "
        f"{targets['ratio_at_size']:.1f} >= {RATIO_TARGET:.0f}"
    )
    print(
        f"  [{common.mark(targets['flat_ok'])}] ours({max(SIZES)}) / ours({min(SIZES)}) "
        f"{targets['flatness']:.2f} <= {FLAT_TARGET}"
    )


# Parts of an allocation, as ``(label, [function suffixes whose cumulative times add up])``.
PROFILE_PARTS = (
    (
        "claims journal (claims_journal.py, claims.py, sqlite3)",
        [
            "claims_journal.py(transaction)",
            "claims_journal.py(claims)",
            "claims.py(claims)",
            "claims.py(add)",
        ],
    ),
    ("one GPU's sysfs (mdevs/manager.py _gpu_state)", ["mdevs/manager.py(_gpu_state)"]),
    ("nova's connection test in get_connection (getLibVersion)", ["virConnectGetLibVersion>)"]),
    ("domain index, without that test (mdev_users)", ["(mdev_users)"]),
)


def _cum(rows, suffixes):
    total = 0.0
    for row in rows:
        function = row["function"]
        name = function[: function.index(":")] + function[function.index("(") :]
        if any(name.endswith(suffix) for suffix in suffixes):
            total += row["cumtime_ms"]
    return total


def profile_parts(rows):
    """``[(label, ms)]``: the journal, the sysfs reads, nova's connection test,
    the domain index, the rest."""
    total = max(r["cumtime_ms"] for r in rows)
    parts = [(label, _cum(rows, suffixes)) for label, suffixes in PROFILE_PARTS]
    # The connection test runs inside mdev_users: count it once.
    test_ms, (index_label, index_ms) = parts[2][1], parts[3]
    parts[3] = (index_label, index_ms - test_ms)
    parts.append(("the rest (planning, logging)", total - sum(ms for _, ms in parts)))
    return total, parts


def print_profile(rows, size, rounds):
    total, parts = profile_parts(rows)
    print()
    print(
        f"Where ours spends its time: cProfile over {rounds} allocations at {size} domains, "
        f"{total:.3f} ms each (profiled)"
    )
    for label, ms in parts:
        print(f"  {ms:>7.3f} ms {100 * ms / total:>4.0f} %  {label}")
    print(f"  {'own ms':>7} {'cum ms':>7} {'calls':>5}  functions by own time")
    for row in sorted(rows, key=lambda r: r["tottime_ms"], reverse=True)[:10]:
        print(
            f"  {row['tottime_ms']:>7.3f} {row['cumtime_ms']:>7.3f} {row['calls']:>5}  "
            f"{row['function']}"
        )


# -- one size, and the whole run --------------------------------------------------------


def check_state(drv, conn, guests, count):
    """Both sides see the same world: index == full scan, claims as made."""
    index = drv.vgpu.domains
    problems = []
    if not index.event_driven:
        problems.append("the index is not event-driven: every lookup would be a full scan")
    problems += libvirt_domains.index_problems(index, conn, guests.domain_mdevs(count))
    held = {c.mdev_uuid: c.instance_uuid for c in drv.vgpu.journal.claims()}
    if held != {mdev: inst for inst, mdev, _gpu, _state in guests.claims}:
        problems.append(f"the journal holds {len(held)} claims, expected {CLAIMS}")
    return problems


def run_size(args, count, drv, conn, guests, allocations):
    rounds = min(args.rounds, BASELINE_ROUNDS_CAP.get(count, args.rounds))
    ours = Ours(drv, conn, allocations)
    index = ours.index
    start = time.perf_counter()
    index._refreshed_at = float("-inf")  # time one full build at this size
    index.mdev_users()
    build_ms = (time.perf_counter() - start) * 1000
    problems = check_state(drv, conn, guests, count)
    if problems:
        return None, problems, None
    baseline_ms, ours_ms, wrong = time_rounds(
        rounds, lambda: nova_scan(drv), guests.domain_mdevs(count), ours, guests.free
    )
    problems = wrong + check_state(drv, conn, guests, count)
    profile = profile_ours(ours, rounds) if count == max(SIZES) else None
    base, mine = common.summary(baseline_ms), common.summary(ours_ms)
    size = {
        "domains": count,
        "rounds": rounds,
        "index_build_ms": build_ms,
        "baseline_ms": base,
        "ours_ms": mine,
        "ratio_median": base["median"] / mine["median"],
        "ratio_min": base["min"] / mine["min"],
    }
    return size, problems, profile


def setup_host(tmp):
    """The fake host, and its journal holding the claims before nova starts."""
    profile, by_gpu = host_profile()
    kernel = fakekernel.FakeKernel.build(os.path.join(tmp, "sys"), profile)
    guests = Guests(by_gpu, sorted(by_gpu)[0])
    journal = claims_journal.Journal(os.path.join(tmp, "state"))
    with journal.transaction() as txn:
        for instance, mdev_uuid, gpu, state in guests.claims:
            txn.add(instance, mdev_uuid, gpu, gpu, TYPE_ID, state)
    return profile, kernel, guests


def target_allocations(drv, tree, gpu):
    """Placement's allocation of one VGPU on ``gpu``'s provider."""
    provider = drv._gpu_tree.by_gpu(gpu)
    return {tree.data(provider.name).uuid: {"resources": {provider.resource_class: 1}}}


def measure(args, tmp):
    """Every size on one daemon, domains added between sizes."""
    host_profile_, kernel, guests = setup_host(tmp)
    daemon = private_libvirtd.Libvirtd(os.path.join(tmp, "libvirtd")).start()
    sizes, problems, profile, define_ms = [], [], None, {}
    conn = drv = None
    try:
        conn = libvirt.open(daemon.uri)
        drv = compute_driver(nova_conf(tmp, daemon.uri), kernel)
        tree = nova_tree(drv)
        allocations = target_allocations(drv, tree, guests.target)
        defined = 0
        for count in SIZES:
            define_ms[count] = define(conn, guests, defined, count)
            defined = count
            size, wrong, size_profile = run_size(args, count, drv, conn, guests, allocations)
            problems += [f"{count} domains: {p}" for p in wrong]
            if size is None:
                break
            size["define_ms"] = define_ms[count]
            sizes.append(size)
            profile = size_profile or profile
        info = {
            "host": host_profile_["description"],
            "gpu": guests.target,
            "local_domains": len(guests.local),
            "state_fs": common.fs_type(tmp),
            "libvirt": libvirt_domains.libvirt_version(),
            "daemon": daemon.uri.split("?")[0],
        }
        return sizes, problems, profile, info
    finally:
        if conn is not None:
            for dom in conn.listAllDomains(0):
                dom.undefine()
            conn.close()
        daemon.stop()


def main(argv=None):
    args = common.parse_args(
        argv,
        __doc__.split("\n\n")[0],
        f"Timed rounds of each path per size (at most {BASELINE_ROUNDS_CAP[5000]} at 5000 domains)",
        "Where to write the fake tree, the claims journal and the "
        "daemon's files (default: the system's temp dir).",
    )
    if os.geteuid() != 0:
        sys.exit("bench_allocation runs a qemu:///system libvirtd: run it as root")
    with tempfile.TemporaryDirectory(prefix="bench-allocation-", dir=args.tmpdir) as tmp:
        sizes, problems, profile, info = measure(args, tmp)
    if problems:
        print("WRONG RESULTS, the timings mean nothing:\n  " + "\n  ".join(problems[:20]))
        return 1
    by_size = {s["domains"]: s for s in sizes}
    flatness = by_size[max(SIZES)]["ours_ms"]["median"] / by_size[min(SIZES)]["ours_ms"]["median"]
    results = {
        "benchmark": "allocation",
        **info,
        "claims": CLAIMS,
        "rounds": args.rounds,
        "settle": common.SETTLE,
        "python": platform.python_version(),
        "tmp_dir": os.path.dirname(tmp),
        "sizes": sizes,
        "profile": {
            "domains": max(SIZES),
            "parts_ms": dict(profile_parts(profile)[1]),
            "functions": sorted(profile, key=lambda r: r["tottime_ms"], reverse=True)[:40],
        },
        "targets": {
            "ratio": RATIO_TARGET,
            "ratio_at_size": by_size[RATIO_SIZE]["ratio_median"],
            "flat": FLAT_TARGET,
            "flatness": flatness,
        },
    }
    results["targets"]["ratio_ok"] = results["targets"]["ratio_at_size"] >= RATIO_TARGET
    results["targets"]["flat_ok"] = flatness <= FLAT_TARGET
    print_setup(results)
    print_timing(results)
    print_profile(profile, max(SIZES), by_size[max(SIZES)]["rounds"])
    common.write_json(args.json, results)
    return 0


if __name__ == "__main__":
    status = 1
    try:
        status = main()
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # nova's event threads never return, and interpreter exit would wait
        # for its executor's threads forever (after a failure too): the
        # daemon is stopped, so leave.
        os._exit(status)
