"""The periodic GPU refresh after a small change, against nova's own.

nova-compute asks its driver for the provider tree every minute or so; the
GPU part of that update is ``_update_provider_tree_for_vgpu``.  Ours is the
class that ships, :class:`vgpu_driver.nova.LibvirtVGPUDriver`, loaded as
nova-compute loads it (``load_compute_driver``, nova's config, nova's
``init_host``) on nova's ``Host``: the core's ``provider_tree`` (the host
reconciler's pass, waited for: claims, removals, restore, stale-type
reclaim, libvirt's mdev definitions settled when due; discovery through
:class:`~vgpu_driver.discovery_cache.CachedDiscovery` and its udev monitor;
inventory), then nova's provider tree written, the reshape check and the
prune of vanished GPUs.  nova's is
``LibvirtDriver._update_provider_tree_for_vgpu`` itself (its
``_get_gpu_inventories`` lists every mdev and every mdev-capable device
through libvirt's node-device API and parses each one's XML), called on the
same driver object, so both talk to the same daemon.  Each side updates its
own nova ``ProviderTree`` (a root, as the resource tracker keeps it).

Both read the same GPUs: the large host of ``bench_allocation.py`` (8 x T4,
16 mdevs each) written by the fake kernel.  nova reads it through a private,
real ``libvirtd`` (``tests/libvirtd.py``) whose mount namespace has the fake
tree bound over ``/sys``: its node-device driver enumerates it with libudev
as it would a host's.  Ours reads the tree with the production
``LinuxSysfs`` (``[vgpu] hotplug_events = udev``); the fake kernel
announces its devices on udev's netlink group, which the production monitor
hears.  Before each of our rounds one mdev of one GPU is removed or created
again (untimed): the small change.  The target is ``nova / ours >= 10``
for the shipped update.  As a breakdown the run also times the core's
``VGPUDriver.provider_tree`` (with ``InProcessDomains``) against nova's
``_get_gpu_inventories``, the core with udev off (a full read every time)
and discovery alone, and profiles the shipped update by parts.

Run ``python benchmarks/bench_refresh.py [--rounds N] [--json FILE]`` as
root (the daemon's namespace and udev's group need it).  It reports and
exits 0 on correct results; a wrong answer (the timings would then mean
nothing) exits 1.
"""

import os
import platform
import sys
import tempfile
import textwrap
import time
import traceback

try:
    import libvirt
    from nova import config as nova_config
    from nova.compute import provider_tree as nova_provider_tree
    from nova.db import migration as nova_migration
    from nova.virt import driver as virt_driver
    from nova.virt.libvirt import driver as libvirt_driver
except ImportError:  # pragma: no cover - depends on the environment
    sys.exit("bench_refresh needs nova and libvirt-python (the nova venv)")
import cProfile
import pstats
import uuid

import bench_allocation
import common
from oslo_config import cfg

from vgpu_driver import discovery
from vgpu_driver import driver as core
from vgpu_driver import inventory
from vgpu_driver import nova_alias
from vgpu_driver.conf import vgpu as vgpu_conf
from vgpu_driver.fake import domains
from vgpu_driver.fake import fakekernel
from vgpu_driver.sysfs import linux
from vgpu_driver.sysfs import udev

private_libvirtd = common.load_test_helper("libvirtd")

NODENAME = bench_allocation.NODENAME
TYPE_ID = bench_allocation.TYPE_ID
RATIO_TARGET = 10.0


def nova_database_conf_file(tmp):
    """nova's databases, sqlite files under ``tmp``: nova-compute's
    ``init_host`` reads the instances of its host (ours asks which guests
    it was rebooting when it stopped), so the database must exist and hold
    nova's schema, with no instance on it."""
    path = os.path.join(tmp, "nova-db.conf")
    with open(path, "w") as f:
        f.write(
            textwrap.dedent(f"""
            [database]
            connection = sqlite:///{tmp}/nova.sqlite
            [api_database]
            connection = sqlite:///{tmp}/nova_api.sqlite
            """)
        )
    return path


def vgpu_conf_file(tmp, root):
    """What this host adds to bench_allocation's nova.conf: udev on the fake
    tree (which announces its devices as udev does), full reads hourly."""
    path = os.path.join(tmp, "vgpu.conf")
    with open(path, "w") as f:
        f.write(
            textwrap.dedent(f"""
            [vgpu]
            sysfs_root = {root}
            hotplug_events = udev
            full_refresh_interval = 3600
            """)
        )
    return path


def shipped_driver(conf_files):
    """``LibvirtVGPUDriver`` as nova-compute loads and starts it, on the
    private daemon; its core reads the fake tree with ``LinuxSysfs``.

    Its report client refuses use (no Placement runs here): with no claims
    and no GPU gone, an update asks Placement nothing.
    """
    nova_alias.install()  # as vgpu-nova-compute does before nova-compute runs
    nova_config.parse_args([], default_config_files=conf_files)
    for database in ("api", "main"):
        nova_migration.db_sync(database=database)
    drv = virt_driver.load_compute_driver(
        bench_allocation._VirtAPI(), "vgpu_driver.nova.LibvirtVGPUDriver"
    )
    drv._host._conn_event_handler = None  # records in nova's DB, which is absent here
    drv.init_host(NODENAME)
    return drv


def new_tree():
    """nova's provider tree with the compute node's root, as the resource
    tracker hands it to the driver."""
    tree = nova_provider_tree.ProviderTree()
    tree.new_root(NODENAME, str(uuid.uuid4()))
    return tree


def nova_update(drv, tree):
    """nova's own GPU part of the update (not our override), on the same
    driver object and so the same connection to the daemon."""
    libvirt_driver.LibvirtDriver._update_provider_tree_for_vgpu(drv, tree, NODENAME)


def our_driver(tmp, root, events):
    conf = cfg.ConfigOpts()
    vgpu_conf.register_opts(conf)
    from vgpu_driver.conf import devices

    devices.register_opts(conf)
    path = os.path.join(tmp, f"vgpu-{events}.conf")
    with open(path, "w") as f:
        f.write(
            textwrap.dedent(f"""
            [devices]
            enabled_mdev_types = {TYPE_ID}
            [vgpu]
            sysfs_root = {root}
            state_dir = {tmp}/state-{events}
            hotplug_events = {events}
            full_refresh_interval = 3600
            """)
        )
    conf([], project="nova", default_config_files=[path])
    return core.VGPUDriver(conf, domains.InProcessDomains(), host=linux.LinuxSysfs(root))


class Change:
    """One mdev of the first GPU goes and comes back, alternately."""

    def __init__(self, kernel, gpu, uuid):
        self.kernel, self.gpu, self.uuid = kernel, gpu, uuid

    def toggle(self):
        if any(m.uuid == self.uuid for m in self.kernel.list_mdevs()):
            self.kernel.remove_mdev(self.uuid)
        else:
            self.kernel.create_mdev(self.gpu, TYPE_ID, self.uuid)

    def restore(self):
        if not any(m.uuid == self.uuid for m in self.kernel.list_mdevs()):
            self.kernel.create_mdev(self.gpu, TYPE_ID, self.uuid)


def timed(func):
    common.settle()
    start = time.perf_counter()
    result = func()
    return (time.perf_counter() - start) * 1000, result


def nova_totals(inventories):
    return {bench_allocation_address(name): inv["total"] for name, inv in inventories.items()}


def bench_allocation_address(libvirt_name):
    domain, bus, slot, function = libvirt_name[len("pci_") :].split("_")
    return f"{domain}:{bus}:{slot}.{function}"


def our_totals(tree):
    return {p.gpu: p.total for p in tree.providers}


def tree_totals(tree):
    """``{child provider name: total units}`` under the root of nova's tree."""
    root = tree.data(NODENAME).uuid
    totals = {}
    for rp in tree.get_provider_uuids_in_tree(NODENAME):
        data = tree.data(rp)
        if data.parent_uuid == root:
            totals[data.name] = sum(inv["total"] for inv in data.inventory.values())
    return totals


class Rounds:
    """The timed rounds: each returns its ms and records wrong answers."""

    def __init__(self, kernel, change, expected, shipped):
        self.kernel, self.change, self.expected = kernel, change, expected
        self.shipped = shipped
        self.wrong, self.partial = [], []
        self.nova_tree, self.our_tree = new_tree(), new_tree()

    def check(self, who, got, want):
        if got != want:
            self.wrong.append(f"{who}: {got}")

    def nova(self, func, totals, names):
        def run():
            self.change.restore()
            self.libvirtd_lists(self.change.uuid)
            elapsed, got = timed(func)
            self.check("nova", totals(got), {names(a): 16 for a in self.expected})
            return elapsed

        return run

    def ours(self, func, totals, drv):
        def run():
            self.change.toggle()
            elapsed, got = timed(func)
            # One mdev fewer on a GPU: one more can be created, the total stays.
            self.check(
                "ours",
                totals(got),
                {self.names(a): 16 for a in self.expected}
                if totals is tree_totals
                else dict(self.expected),
            )
            if drv is not None:
                self.partial.append(drv.discovery.last == "partial")
            return elapsed

        return run

    def libvirtd_lists(self, mdev_uuid, timeout=10.0):
        """Wait (untimed) until the daemon lists the mdev ``restore`` made
        again: it hears the fake kernel's uevents, and nova counts the
        mdevs the daemon lists, so a round timed before it has would be
        judged wrong."""
        conn = self.shipped._host.get_connection()
        flag = libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV
        deadline = time.monotonic() + timeout
        while not any(
            mdev_uuid.replace("-", "_") in dev.name() for dev in conn.listAllDevices(flag)
        ):
            if time.monotonic() > deadline:
                self.wrong.append(f"libvirtd: mdev {mdev_uuid} not listed after {timeout:.0f} s")
                return
            time.sleep(0.01)

    @staticmethod
    def names(address):
        return inventory.provider_name_for(NODENAME, address)

    def nova_update(self):
        return self.nova(
            lambda: nova_update(self.shipped, self.nova_tree) or self.nova_tree,
            tree_totals,
            self.names,
        )

    def nova_inventories(self):
        return self.nova(
            lambda: libvirt_driver.LibvirtDriver._get_gpu_inventories(self.shipped),
            nova_totals,
            lambda a: a,
        )

    def shipped_update(self):
        return self.ours(self.update_ours, tree_totals, self.shipped.vgpu)

    def update_ours(self):
        self.shipped._update_provider_tree_for_vgpu(self.our_tree, NODENAME)
        return self.our_tree


def measure(args, tmp):
    profile, by_gpu = bench_allocation.host_profile()
    root = os.path.join(tmp, "sys")
    kernel = fakekernel.FakeKernel.build(root, profile)
    kernel.enable_uevents()
    gpu = sorted(by_gpu)[0]
    change = Change(kernel, gpu, by_gpu[gpu][-1])
    daemon = private_libvirtd.Libvirtd(os.path.join(tmp, "libvirtd"), sysfs=root).start()
    ours = polled = shipped = None
    try:
        # bench_allocation's nova.conf (nova's libvirt on the private daemon),
        # with udev on the fake tree.
        shipped = shipped_driver(
            [
                bench_allocation.nova_conf(tmp, daemon.uri),
                nova_database_conf_file(tmp),
                vgpu_conf_file(tmp, root),
            ]
        )
        ours = our_driver(tmp, root, "udev")
        polled = our_driver(tmp, root, "off")
        for drv in (shipped.vgpu, ours):
            if not isinstance(drv.changes, udev.UdevMonitor):
                sys.exit(f"udev is not usable here: {drv.changes.reason}")
        rounds = Rounds(kernel, change, {address: 16 for address in by_gpu}, shipped)
        nova_update_ms, shipped_ms = common.interleaved(
            args.rounds, rounds.nova_update(), rounds.shipped_update()
        )
        shipped_partial = rounds.partial
        rounds.partial = []
        nova_ms, ours_ms = common.interleaved(
            args.rounds,
            rounds.nova_inventories(),
            rounds.ours(lambda: ours.provider_tree(NODENAME), our_totals, ours),
        )
        _, full_ms = common.interleaved(
            max(args.rounds // 3, 1),
            rounds.nova_inventories(),
            rounds.ours(lambda: polled.provider_tree(NODENAME), our_totals, None),
        )
        discover_full = [
            timed(lambda: discovery.discover(ours.host))[0] for _ in range(args.rounds)
        ]
        discover_cached = []
        for _ in range(args.rounds):
            change.toggle()
            discover_cached.append(timed(ours.discovery.snapshot)[0])
        parts = profile_shipped(rounds, args.rounds)
        nodedevs = len(shipped._host.get_connection().listAllDevices(0))
    finally:
        for drv in (ours, polled, shipped and shipped.vgpu):
            if drv is not None:
                drv.close()
        daemon.stop()
    return {
        "nova_update_ms": common.summary(nova_update_ms),
        "shipped_ms": common.summary(shipped_ms),
        "nova_ms": common.summary(nova_ms),
        "ours_ms": common.summary(ours_ms),
        "ours_udev_off_ms": common.summary(full_ms),
        "discover_full_ms": common.summary(discover_full),
        "discover_cached_ms": common.summary(discover_cached),
        "partial_rounds": sum(shipped_partial),
        "rounds_ours": len(shipped_partial),
        "profile": parts,
        "libvirt_nodedevs": nodedevs,
        "host": profile["description"],
        "daemon": daemon.uri.split("?")[0],
    }, rounds.wrong


# Parts of one shipped update, as ``(label, [function suffixes whose cumulative
# times add up])``; bench_allocation's way of reading cProfile's rows.
PROFILE_PARTS = (
    ("core provider_tree (reconciler's pass, discovery, inventory)", ["driver.py(provider_tree)"]),
    (
        "  of which the host reconciler's pass, waited for (claims, removals, restore, "
        "stale types, libvirt's mdev definitions; on its own thread)",
        ["host_reconciler.py(run_now)"],
    ),
    ("  of which discovery (cached, udev)", ["discovery_cache.py(snapshot)"]),
    ("nova's provider tree written (providers.write)", ["nova/providers.py(write)"]),
    ("reshape check (reshape.take_over)", ["nova/reshape.py(take_over)"]),
    ("prune of vanished GPUs (providers.prune)", ["nova/providers.py(prune)"]),
)


def profile_shipped(rounds, count):
    """cProfile over ``count`` shipped updates, each after a small change."""
    profiler = cProfile.Profile()
    for _ in range(count):
        rounds.change.toggle()
        common.settle()
        profiler.enable()
        rounds.update_ours()
        profiler.disable()
    stats = pstats.Stats(profiler)
    rows = []
    for (filename, line, func), (_cc, calls, tottime, cumtime, _) in stats.stats.items():
        rows.append(
            {
                "function": f"{bench_allocation._short(filename)}:{line}({func})",
                "calls": calls // count,
                "tottime_ms": tottime * 1000 / count,
                "cumtime_ms": cumtime * 1000 / count,
            }
        )
    total = max(
        r["cumtime_ms"] for r in rows if r["function"].endswith("(_update_provider_tree_for_vgpu)")
    )
    parts = [(label, bench_allocation._cum(rows, suffixes)) for label, suffixes in PROFILE_PARTS]
    counted = sum(ms for label, ms in parts if not label.startswith(" "))
    parts.append(("the rest", total - counted))
    top = sorted(rows, key=lambda r: r["tottime_ms"], reverse=True)[:10]
    return {"total_ms": total, "rounds": count, "parts_ms": parts, "functions": top}


def report(results):
    print(
        f"Host: {results['host']}; libvirtd ({results['daemon']}) sees it as "
        f"{results['libvirt_nodedevs']} node devices"
    )
    print("Each of our rounds follows one mdev removed or created on one GPU (untimed).")
    print(
        f"Shipped updates that re-read only what changed: {results['partial_rounds']} of "
        f"{results['rounds_ours']}"
    )
    print()
    print(f"  {'path':<64} {'median ms':>10} {'min':>8} {'max':>8}")
    rows = (
        ("nova LibvirtDriver._update_provider_tree_for_vgpu", "nova_update_ms"),
        ("ours LibvirtVGPUDriver._update_provider_tree_for_vgpu (shipped)", "shipped_ms"),
        ("breakdown: nova LibvirtDriver._get_gpu_inventories", "nova_ms"),
        ("breakdown: ours VGPUDriver.provider_tree, udev + cached", "ours_ms"),
        ("breakdown: ours VGPUDriver.provider_tree, udev off (full read)", "ours_udev_off_ms"),
        ("  discovery alone: cached after a change", "discover_cached_ms"),
        ("  discovery alone: full", "discover_full_ms"),
    )
    for label, key in rows:
        s = results[key]
        print(f"  {label:<64} {s['median']:>10.2f} {s['min']:>8.2f} {s['max']:>8.2f}")
    ratio = results["ratio_median"]
    print()
    print(
        f"nova / ours, shipped update (median): {ratio:.1f}x, target >= "
        f"{RATIO_TARGET:g}x: {common.mark(ratio >= RATIO_TARGET)}"
    )
    print(
        f"nova inventories / our core provider_tree (median): {results['core_ratio_median']:.1f}x"
    )
    print(f"ours udev off / ours udev on (median): {results['cache_gain']:.1f}x")
    profile = results["profile"]
    print()
    print(
        f"Where the shipped update spends its time: cProfile over {profile['rounds']} "
        f"updates, {profile['total_ms']:.2f} ms each (profiled)"
    )
    for label, ms in profile["parts_ms"]:
        print(f"  {ms:>7.2f} ms {100 * ms / profile['total_ms']:>4.0f} %  {label}")
    print(f"  {'own ms':>7} {'cum ms':>7} {'calls':>5}  functions by own time")
    for row in profile["functions"]:
        print(
            f"  {row['tottime_ms']:>7.3f} {row['cumtime_ms']:>7.3f} {row['calls']:>5}  "
            f"{row['function']}"
        )


def main(argv=None):
    args = common.parse_args(
        argv,
        __doc__.split("\n\n")[0],
        "Timed rounds of each path",
        "Where to write the fake tree and the daemon's files (default: the system's temp dir).",
    )
    if os.geteuid() != 0:
        sys.exit("bench_refresh needs root (a private mount namespace, udev's group)")
    with tempfile.TemporaryDirectory(prefix="bench-refresh-", dir=args.tmpdir) as tmp:
        results, wrong = measure(args, tmp)
    if wrong:
        print("WRONG RESULTS, the timings mean nothing:\n  " + "\n  ".join(wrong[:20]))
        return 1
    results.update(
        benchmark="refresh",
        rounds=args.rounds,
        settle=common.SETTLE,
        python=platform.python_version(),
        ratio_median=(results["nova_update_ms"]["median"] / results["shipped_ms"]["median"]),
        core_ratio_median=results["nova_ms"]["median"] / results["ours_ms"]["median"],
        cache_gain=(results["ours_udev_off_ms"]["median"] / results["ours_ms"]["median"]),
    )
    results["target_ok"] = results["ratio_median"] >= RATIO_TARGET
    report(results)
    common.write_json(args.json, results)
    return 0


if __name__ == "__main__":
    try:
        status = main()
    except SystemExit as stop:
        if not isinstance(stop.code, int):
            print(stop.code, file=sys.stderr)
        status = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # noqa: BLE001 - reported; exit must not wait for nova's threads
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    # As in bench_allocation: nova's event threads never return and
    # interpreter exit would wait for them; the daemon is stopped, so leave.
    os._exit(status)
