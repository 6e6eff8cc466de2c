"""Discovery + inventory of a large fake host, against a raw-I/O floor.

nova-compute runs discovery and the inventory on every resource update, so
their cost is paid once a minute per host, forever.  Absolute timings depend
on the machine; what this measures is the price of the abstraction: the real
path (:func:`vgpu_driver.discovery.discover` over
:func:`vgpu_driver.sysfs.open_host`, reading the configured types as the
driver's update does, then :func:`vgpu_driver.inventory.compute`) against the
cheapest loop that reads every file of a full discovery with plain ``os``
calls, timed in the same run on the same tree.  The targets are
``real / floor <= 0.7`` and ``real < 50 ms``.

The host: 8 A100 boards with 16 SR-IOV VFs each plus 8 time-sliced T4s
(16 GPUs, 136 mdev parents, 904 type directories) and 200 existing mdevs.

Run ``python benchmarks/bench_discovery.py [--rounds N] [--json FILE]``.  It
reports and always exits 0 on a correct result; only a wrong inventory (the
timings would then mean nothing) exits 1.
"""

import builtins
import contextlib
import copy
import os
import platform
import sys
import tempfile
import time
import uuid
from types import MappingProxyType

import common

from vgpu_driver import discovery
from vgpu_driver import inventory
from vgpu_driver import names
from vgpu_driver import sysfs
from vgpu_driver.conf.mdev_settings import MdevConfig
from vgpu_driver.conf.mdev_settings import TypeConfig
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles

NODENAME = "bench-host"
A100_BUSES = range(0x41, 0x49)
A100_TYPE = "nvidia-468"  # A100-4C: one per VF, at most 10 per GPU.
A100_MDEVS_PER_BOARD = 10
T4_TYPE = "nvidia-222"  # T4-1B: at most 16 per GPU.
T4_MDEVS_PER_GPU = 15
EXPECTED_MDEVS = 200
EXPECTED_TOTALS = {A100_TYPE: 10, T4_TYPE: 16}

RATIO_TARGET = 0.7
REAL_MS_TARGET = 50.0

# Every file a type directory holds that the reader looks at.
TYPE_ATTRS = ("available_instances", "device_api", "name", "description")
PCI_ATTRS = ("vendor", "device", "numa_node", "sriov_totalvfs", "sriov_numvfs", "class")


# -- the host -----------------------------------------------------------------


def _vf_addresses(gpu):
    """The VF addresses the fake kernel derives from a PF (offset, stride)."""
    pf = names.parse_pci_address(gpu["address"])
    sriov = gpu["sriov"]
    return [str(pf.offset(sriov["offset"] + i * sriov["stride"])) for i in range(sriov["numvfs"])]


def _check_addresses_distinct(gpus):
    """Copies of one board must not share a PCI function with another GPU.

    The fake kernel would fail on a clash halfway through writing the tree,
    or worse, quietly make one GPU's VF look like another GPU.
    """
    seen = {}
    for gpu in gpus:
        for address in [gpu["address"], *(_vf_addresses(gpu) if gpu.get("sriov") else ())]:
            if address in seen:
                raise SystemExit(f"{address} is both {seen[address]} and {gpu['address']}")
            seen[address] = gpu["address"]


def large_host_profile():
    """8 A100 boards (distinct buses) + the 8 T4s of ``t4x8``, with 200 mdevs.

    Returns ``(profile, a100 PF addresses)``.  The mdevs fill every A100 to
    its 10-instance limit (one per VF) and leave one T4-1B free per T4, so
    both capacity rules (the type's maximum and what is still creatable)
    are exercised.
    """
    a100 = profiles.load("a100-sriov")
    t4x8 = profiles.load("t4x8")
    boards = []
    for bus in A100_BUSES:
        board = copy.deepcopy(a100)
        board["gpus"][0]["address"] = f"0000:{bus:02x}:00.0"
        boards.append(board)
    profile = profiles.combine(
        "bench-large", *boards, t4x8, description="8 x A100 (16 VFs) + 8 x T4, 200 mdevs"
    )
    _check_addresses_distinct(profile["gpus"])
    mdevs = []
    for board in boards:
        vfs = _vf_addresses(board["gpus"][0])
        mdevs += [
            {"parent": vf, "type": A100_TYPE, "uuid": str(uuid.uuid4())}
            for vf in vfs[:A100_MDEVS_PER_BOARD]
        ]
    for gpu in t4x8["gpus"]:
        mdevs += [
            {"parent": gpu["address"], "type": T4_TYPE, "uuid": str(uuid.uuid4())}
            for _ in range(T4_MDEVS_PER_GPU)
        ]
    profile["mdevs"] = mdevs
    a100_pfs = tuple(board["gpus"][0]["address"] for board in boards)
    return profile, a100_pfs


def build_host(root, profile):
    """Write the tree; the fake kernel enforces per-GPU limits as it goes."""
    kernel = fakekernel.FakeKernel.build(root, profile)
    made = len(os.listdir(kernel.paths.mdev_base()))
    if made != EXPECTED_MDEVS:
        raise SystemExit(f"the fake kernel made {made} mdevs, not {EXPECTED_MDEVS}")
    return kernel


def mdev_config(a100_pfs):
    """A100-4C on the listed A100s, T4-1B on every other GPU."""
    return MdevConfig(
        types=(TypeConfig(A100_TYPE, device_addresses=a100_pfs), TypeConfig(T4_TYPE)),
        default_type=T4_TYPE,
        by_address=MappingProxyType(dict.fromkeys(a100_pfs, A100_TYPE)),
    )


# -- the two paths ------------------------------------------------------------


def real_path(root, config):
    """What the driver does on each full update: open, discover (the
    attributes of the configured types), compute."""
    snapshot = discovery.discover(sysfs.open_host(root), frozenset(config.enabled))
    return inventory.compute(snapshot, config, NODENAME)


def _read(path):
    """One sysfs attribute as bytes: open, one read, close (as the kernel likes)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


def _physfn(device_dir):
    try:
        return os.readlink(device_dir + "/physfn").rsplit("/", 1)[-1]
    except OSError:
        return None


def raw_floor(root):
    """The same reads as the real path, with no abstraction in between.

    Not a strawman: it resolves each parent link once (as the reader does)
    so attribute opens walk no symlink, it reads with one ``os.read``, and
    it keeps nothing but the set of GPUs it must look at next.
    """
    mdev_base = root + "/bus/mdev/devices"
    for uuid_ in os.listdir(mdev_base):
        os.readlink(mdev_base + "/" + uuid_)
        os.readlink(mdev_base + "/" + uuid_ + "/mdev_type")

    gpus = set()
    parent_base = root + "/class/mdev_bus"
    for name in os.listdir(parent_base):
        device_dir = os.path.normpath(parent_base + "/" + os.readlink(parent_base + "/" + name))
        types_dir = device_dir + "/mdev_supported_types/"
        for type_id in os.listdir(types_dir):
            for attr in TYPE_ATTRS:
                _read(types_dir + type_id + "/" + attr)
        gpus.add(_physfn(device_dir) or name)

    pci_base = root + "/bus/pci/devices/"
    for address in os.listdir(pci_base):
        vendor_dir = pci_base + address + "/nvidia/"
        # One open tells a function with NVIDIA's vendor-VFIO files apart.
        if _read(vendor_dir + "current_vgpu_type") is not None:
            _read(vendor_dir + "creatable_vgpu_types")
            gpus.add(_physfn(pci_base + address) or address)
        # And one more tells an SR-IOV physical function (its VFs may be off).
        if _read(pci_base + address + "/sriov_totalvfs") is not None:
            gpus.add(address)

    for address in gpus:
        device_dir = pci_base + address + "/"
        for entry in os.listdir(device_dir):
            if entry.startswith("virtfn"):
                os.readlink(device_dir + entry)
        for attr in PCI_ATTRS:
            _read(device_dir + attr)
    # The vGPU manager's version, which the snapshot carries.
    _read(root + "/module/nvidia/version")
    return gpus


# -- what each path reads (a separate, untimed pass) ---------------------------


class IoCounter:
    """Counts and records the file-system calls made while it is installed.

    Patches the ``os`` functions both paths call (and ``open``, which the
    fake kernel uses for its model file), so the counts come from the code
    as it runs rather than from a reading of it.  Paths are kept with their
    directory resolved, so ``class/mdev_bus/X/...`` and ``devices/.../X/...``
    compare equal.
    """

    CALLS = ("open", "read", "readlink", "listdir", "stat")

    def __init__(self):
        self.counts = dict.fromkeys((*self.CALLS, "open_missing"), 0)
        self._opened = []

    @property
    def opened(self):
        """Opened files, resolved only now: ``realpath`` itself calls ``os``."""
        return {
            os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
            for path in self._opened
        }

    def _record(self, call, path_or_fd):
        self.counts[call] += 1
        if call == "open":
            self._opened.append(os.fsdecode(path_or_fd))

    @contextlib.contextmanager
    def installed(self):
        originals = {name: getattr(os, name) for name in self.CALLS}
        original_open = builtins.open

        def counted(call, func):
            def wrapper(path, *args, **kwargs):
                self._record(call, path)
                try:
                    return func(path, *args, **kwargs)
                except FileNotFoundError:
                    if call == "open":
                        self.counts["open_missing"] += 1
                    raise

            return wrapper

        for name, func in originals.items():
            setattr(os, name, counted(name, func))
        builtins.open = counted("open", original_open)
        try:
            yield self
        finally:
            for name, func in originals.items():
                setattr(os, name, func)
            builtins.open = original_open


def count_io(func, *args):
    with IoCounter().installed() as counter:
        func(*args)
    return counter


# -- timing --------------------------------------------------------------------


def _timed(clock, func, *args):
    start = clock()
    func(*args)
    return (clock() - start) * 1000


# -- checking and reporting ----------------------------------------------------


def check_tree(tree, a100_pfs):
    """The numbers only count if the real path got the answer right."""
    problems = []
    if len(tree.providers) != 16:
        problems.append(f"{len(tree.providers)} providers, expected 16")
    if tree.unserved:
        problems.append(f"unserved GPUs: {tree.unserved}")
    for provider in tree.providers:
        expected_type = A100_TYPE if provider.gpu in a100_pfs else T4_TYPE
        expected = (expected_type, EXPECTED_TOTALS[expected_type], 0)
        got = (provider.type_id, provider.total, provider.reserved)
        if got != expected:
            problems.append(f"{provider.gpu}: (type, total, reserved) {got}, expected {expected}")
    return problems


def print_tree(tree):
    print(f"Inventory of {tree.root_name}: {len(tree.providers)} providers")
    print(f"  {'provider':<34} {'type':<11} {'name':<16} {'total':>5} {'reserved':>8}")
    for p in tree.providers:
        print(
            f"  {p.name:<34} {p.type_id:<11} {p.type_name or '-':<16} {p.total:>5} {p.reserved:>8}"
        )
    print()


def print_io(real, floor):
    print("File-system calls per run (untimed verification pass)")
    print(f"  {'call':<22} {'real':>7} {'floor':>7}")
    labels = {
        "open": "open (attempts)",
        "open_missing": "  of which missing",
        "read": "os.read",
        "readlink": "readlink",
        "listdir": "listdir",
        "stat": "stat",
    }
    for call, label in labels.items():
        print(f"  {label:<22} {real.counts[call]:>7} {floor.counts[call]:>7}")
    missing = sorted(real.opened - floor.opened)
    if missing:
        print(f"  floor misses {len(missing)} file(s) the real path opens, e.g. {missing[:3]}")
    else:
        print(f"  the floor opens every one of the {len(real.opened)} files the real path opens")
    print()


def print_timing(results):
    floor, real = results["floor_ms"], results["real_ms"]
    print(
        f"Timing ({results['clock']} time): {results['rounds']} interleaved rounds, "
        "warm cache "
        f"(Python {platform.python_version()}, tree on {results['tree_dir']})"
    )
    print(f"  {'':<8} {'median ms':>10} {'min ms':>8} {'max ms':>8}")
    for label, summary in (("floor", floor), ("real", real)):
        print(
            f"  {label:<8} {summary['median']:>10.2f} {summary['min']:>8.2f} {summary['max']:>8.2f}"
        )
    ratio, ratio_min = results["ratio_median"], results["ratio_min"]
    print(f"  ratio real/floor: {ratio:.2f}x (of medians), {ratio_min:.2f}x (of minimums)")
    print()
    print("Targets")
    print(
        f"  [{common.mark(results['targets']['ratio_ok'])}] real/floor {ratio:.2f} "
        f"<= {RATIO_TARGET}"
    )
    print(
        f"  [{common.mark(results['targets']['real_ms_ok'])}] real {real['median']:.2f} ms "
        f"< {REAL_MS_TARGET:.0f} ms"
    )


def main(argv=None):
    args = common.parse_args(
        argv,
        __doc__.split("\n\n")[0],
        "Timed rounds of each path",
        "Where to write the fake tree (default: the system's temp "
        "dir; /dev/shm is closer to sysfs, which lives in memory).",
        cpu_option=True,
    )
    clock = time.process_time if args.cpu else time.perf_counter
    profile, a100_pfs = large_host_profile()
    config = mdev_config(a100_pfs)
    with tempfile.TemporaryDirectory(prefix="bench-discovery-", dir=args.tmpdir) as tmp:
        root = os.path.join(tmp, "sys")
        build_host(root, profile)
        tree = real_path(root, config)
        print(
            f"Host: {profile['description']} -> {len(tree.providers)} GPUs "
            f"(8 SR-IOV A100 boards x 16 VFs + 8 T4s)"
        )
        print()
        print_tree(tree)
        problems = check_tree(tree, a100_pfs)
        full = inventory.compute(discovery.discover(sysfs.open_host(root)), config, NODENAME)
        if full != tree:
            problems.append("the tree differs from the one a full read of every type gives")
        if problems:
            print("WRONG INVENTORY, not timing it:\n  " + "\n  ".join(problems))
            return 1
        real_io = count_io(real_path, root, config)
        floor_io = count_io(raw_floor, root)
        print_io(real_io, floor_io)
        floor_ms, real_ms = common.interleaved(
            args.rounds,
            lambda: _timed(clock, raw_floor, root),
            lambda: _timed(clock, real_path, root, config),
        )
    floor, real = common.summary(floor_ms), common.summary(real_ms)
    results = {
        "benchmark": "discovery+inventory",
        "host": profile["description"],
        "rounds": args.rounds,
        "python": platform.python_version(),
        "clock": "cpu" if args.cpu else "wall",
        "tree_dir": os.path.dirname(tmp),
        "floor_ms": floor,
        "real_ms": real,
        "ratio_median": real["median"] / floor["median"],
        "ratio_min": real["min"] / floor["min"],
        "io": {"real": real_io.counts, "floor": floor_io.counts},
        "targets": {"ratio": RATIO_TARGET, "real_ms": REAL_MS_TARGET},
    }
    results["targets"]["ratio_ok"] = results["ratio_median"] <= RATIO_TARGET
    results["targets"]["real_ms_ok"] = real["median"] < REAL_MS_TARGET
    print_timing(results)
    common.write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
