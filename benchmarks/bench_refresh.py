"""The periodic GPU refresh after a small change, against nova's own.

nova-compute asks its driver for the provider tree every minute or so; for
vGPUs nova's libvirt driver then runs ``LibvirtDriver._get_gpu_inventories``,
which lists every mdev and every mdev-capable device through libvirt's
node-device API and parses each one's XML.  Ours is
:meth:`vgpu_driver.driver.VGPUDriver.provider_tree` (the core of
``_update_provider_tree_for_vgpu``): the claims reconcile, discovery, the
stale-type reclaim and the inventory, with discovery going through
:class:`~vgpu_driver.discovery_cache.CachedDiscovery` and its udev monitor.

Both read the same GPUs: the large host of ``bench_allocation.py`` (8 x T4,
16 mdevs each) written by the fake kernel.  nova reads it through a private,
real ``libvirtd`` (``tests/libvirtd.py``) whose mount namespace has the fake
tree bound over ``/sys``: its node-device driver enumerates it with libudev
as it would a host's.  Ours reads the tree with the production
``LinuxSysfs``; the fake kernel announces its devices on udev's netlink
group, which the production monitor hears.  Before each of our rounds one
mdev of one GPU is removed or created again (untimed): the small change.
The target is ``nova / ours >= 10``.  For context the run also times our
refresh with udev off (a full read every time) and discovery alone.

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

try:
    import libvirt  # noqa: F401 - the daemon helper needs it
    from nova import config as nova_config
    from nova.virt import driver as virt_driver
    from nova.virt import fake as fake_virt
    from nova.virt.libvirt import driver as libvirt_driver
except ImportError:  # pragma: no cover - depends on the environment
    sys.exit("bench_refresh needs nova and libvirt-python (the nova venv)")
import bench_allocation
import common
from oslo_config import cfg

from vgpu_driver import discovery
from vgpu_driver import domains
from vgpu_driver import driver as core
from vgpu_driver.conf import vgpu as vgpu_conf
from vgpu_driver.fake import fakekernel
from vgpu_driver.sysfs import linux
from vgpu_driver.sysfs import udev

private_libvirtd = common.load_test_helper("libvirtd")

NODENAME = bench_allocation.NODENAME
TYPE_ID = bench_allocation.TYPE_ID
RATIO_TARGET = 10.0


def nova_driver(conf_file):
    """nova's own LibvirtDriver, loaded and started as nova-compute does."""
    nova_config.parse_args([], default_config_files=[conf_file])
    drv = virt_driver.load_compute_driver(fake_virt.FakeVirtAPI(), "libvirt.LibvirtDriver")
    drv._host._conn_event_handler = None  # records in nova's DB, which is absent here
    drv.init_host(NODENAME)
    return drv


def our_driver(tmp, root, events):
    conf = cfg.ConfigOpts()
    vgpu_conf.register_opts(conf)
    from vgpu_driver.conf import devices
    devices.register_opts(conf)
    path = os.path.join(tmp, f"vgpu-{events}.conf")
    with open(path, "w") as f:
        f.write(textwrap.dedent(f"""
            [devices]
            enabled_mdev_types = {TYPE_ID}
            [vgpu]
            sysfs_root = {root}
            state_dir = {tmp}/state-{events}
            hotplug_events = {events}
            full_refresh_interval = 3600
            """))
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
    domain, bus, slot, function = libvirt_name[len("pci_"):].split("_")
    return f"{domain}:{bus}:{slot}.{function}"


def our_totals(tree):
    return {p.gpu: p.total for p in tree.providers}


def measure(args, tmp):
    profile, by_gpu = bench_allocation.host_profile()
    root = os.path.join(tmp, "sys")
    kernel = fakekernel.FakeKernel.build(root, profile)
    kernel.enable_uevents()
    gpu = sorted(by_gpu)[0]
    change = Change(kernel, gpu, by_gpu[gpu][-1])
    daemon = private_libvirtd.Libvirtd(os.path.join(tmp, "libvirtd"), sysfs=root).start()
    ours = polled = None
    wrong, partial = [], []
    try:
        # bench_allocation's nova.conf: nova's libvirt on the private daemon.
        nova = nova_driver(bench_allocation.nova_conf(tmp, daemon.uri))
        ours = our_driver(tmp, root, "udev")
        polled = our_driver(tmp, root, "off")
        if not isinstance(ours.changes, udev.UdevMonitor):
            sys.exit(f"udev is not usable here: {ours.changes.reason}")
        expected = {address: 16 for address in by_gpu}

        def one_nova():
            change.restore()  # libvirtd hears no fake uevent: its mdev list is the start's
            elapsed, got = timed(lambda: libvirt_driver.LibvirtDriver._get_gpu_inventories(nova))
            if nova_totals(got) != expected:
                wrong.append(f"nova: {nova_totals(got)}")
            return elapsed

        def one(drv):
            def run():
                change.toggle()
                removed = not any(m.uuid == change.uuid for m in kernel.list_mdevs())
                elapsed, tree = timed(lambda: drv.provider_tree(NODENAME))
                want = dict(expected)
                if removed:
                    want[gpu] = 16  # one mdev fewer, one more can be created
                if our_totals(tree) != want:
                    wrong.append(f"ours: {our_totals(tree)}")
                if drv is ours:
                    partial.append(drv.discovery.last == "partial")
                return elapsed
            return run

        nova_ms, ours_ms = common.interleaved(args.rounds, one_nova, one(ours))
        _, full_ms = common.interleaved(max(args.rounds // 3, 1), one_nova, one(polled))
        discover_full = [timed(lambda: discovery.discover(ours.host))[0]
                         for _ in range(args.rounds)]
        discover_cached = []
        for _ in range(args.rounds):
            change.toggle()
            discover_cached.append(timed(ours.discovery.snapshot)[0])
        nodedevs = len(nova._host.get_connection().listAllDevices(0))
    finally:
        for drv in (ours, polled):
            if drv is not None:
                drv.close()
        daemon.stop()
    return {"nova_ms": common.summary(nova_ms), "ours_ms": common.summary(ours_ms),
            "ours_udev_off_ms": common.summary(full_ms),
            "discover_full_ms": common.summary(discover_full),
            "discover_cached_ms": common.summary(discover_cached),
            "partial_rounds": sum(partial), "rounds_ours": len(partial),
            "libvirt_nodedevs": nodedevs, "host": profile["description"],
            "daemon": daemon.uri.split("?")[0]}, wrong


def report(results):
    print(f"Host: {results['host']}; libvirtd ({results['daemon']}) sees it as "
          f"{results['libvirt_nodedevs']} node devices")
    print("Each of our rounds follows one mdev removed or created on one GPU (untimed).")
    print(f"Our refreshes that re-read only what changed: {results['partial_rounds']} of "
          f"{results['rounds_ours']}")
    print()
    print(f"  {'path':<58} {'median ms':>10} {'min':>8} {'max':>8}")
    rows = (("nova LibvirtDriver._get_gpu_inventories (libvirtd nodedev)", "nova_ms"),
            ("ours VGPUDriver.provider_tree, udev + cached discovery", "ours_ms"),
            ("ours VGPUDriver.provider_tree, udev off (full read)", "ours_udev_off_ms"),
            ("  discovery alone: cached after a change", "discover_cached_ms"),
            ("  discovery alone: full", "discover_full_ms"))
    for label, key in rows:
        s = results[key]
        print(f"  {label:<58} {s['median']:>10.2f} {s['min']:>8.2f} {s['max']:>8.2f}")
    ratio = results["ratio_median"]
    print()
    print(f"nova / ours (median): {ratio:.1f}x, target >= {RATIO_TARGET:g}x: "
          f"{common.mark(ratio >= RATIO_TARGET)}")
    print(f"ours udev off / ours udev on (median): {results['cache_gain']:.1f}x")


def main(argv=None):
    args = common.parse_args(argv, __doc__.split("\n\n")[0], "Timed rounds of each path",
                             "Where to write the fake tree and the daemon's files "
                             "(default: the system's temp dir).")
    if os.geteuid() != 0:
        sys.exit("bench_refresh needs root (a private mount namespace, udev's group)")
    with tempfile.TemporaryDirectory(prefix="bench-refresh-", dir=args.tmpdir) as tmp:
        results, wrong = measure(args, tmp)
    if wrong:
        print("WRONG RESULTS, the timings mean nothing:\n  " + "\n  ".join(wrong[:20]))
        return 1
    results.update(benchmark="refresh", rounds=args.rounds, settle=common.SETTLE,
                   python=platform.python_version(),
                   ratio_median=results["nova_ms"]["median"] / results["ours_ms"]["median"],
                   cache_gain=(results["ours_udev_off_ms"]["median"]
                               / results["ours_ms"]["median"]))
    results["target_ok"] = results["ratio_median"] >= RATIO_TARGET
    report(results)
    common.write_json(args.json, results)
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    # As in bench_allocation: nova's event threads never return and
    # interpreter exit would wait for them; the daemon is stopped, so leave.
    os._exit(status)
