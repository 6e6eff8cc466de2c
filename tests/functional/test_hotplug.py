"""udev events, for real: the fake kernel announces its devices on udev's
netlink group as udevd does, and the production monitor hears them.

Nothing of pyudev is replaced: the monitor is ``pyudev.Monitor.from_netlink``
on a real socket, and each event crossed the kernel's netlink layer.  Sending
to udev's group needs root (CAP_NET_ADMIN); CI runs as root.
"""

import contextlib
import os
import random
import threading
import time
import uuid

import pytest

from tests import served_host
from vgpu_driver import discovery
from vgpu_driver import discovery_cache
from vgpu_driver import exception
from vgpu_driver import names
from vgpu_driver import sriov_functions
from vgpu_driver import sriov_wait
from vgpu_driver.sysfs import changes
from vgpu_driver.sysfs import linux
from vgpu_driver.sysfs import udev

T4 = "0000:18:00.0"
A100 = "0000:41:00.0"
A100_VF = "0000:41:00.4"
L40S = "0000:c1:00.0"
STEPS = 25
PROFILES = ("t4x8", "a100-sriov", "l40s-vfio", "mtty")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="only root may send on udev's netlink group"
)


@pytest.fixture
def announced(make_host):
    """A fake host that announces its devices, read by the production reader."""
    kernel = make_host(*PROFILES)
    kernel.enable_uevents()
    return kernel


@pytest.fixture
def monitor(announced):
    watching = udev.start(linux.LinuxSysfs(announced.paths.root), "udev")
    assert isinstance(watching, udev.UdevMonitor), getattr(watching, "reason", "")
    yield watching
    watching.stop()


def settled(monitor, quiet=0.2):
    """Changes once no event came for ``quiet`` seconds."""
    waiter = monitor.waiter()
    while waiter.wait(quiet):
        pass
    return monitor.take_changes()


def test_mdev_events_name_their_parent_and_gpu(announced, monitor):
    monitor.take_changes()
    waiter = monitor.waiter()
    mdev = str(uuid.uuid4())
    announced.create_mdev(T4, "nvidia-222", mdev)
    assert waiter.wait(5)
    changes = settled(monitor)
    assert not changes.everything
    assert T4 in changes.parents and T4 in changes.gpus
    announced.remove_mdev(mdev)
    changes = settled(monitor)
    assert T4 in changes.parents and T4 in changes.gpus


def test_vfs_coming_and_going_name_their_gpu(announced, monitor):
    announced.set_vfs(A100, 0)
    gone = settled(monitor)
    assert A100_VF in gone.parents
    announced.set_vfs(A100, 16)
    back = settled(monitor)
    assert A100_VF in back.parents and A100 in back.gpus
    # Then nothing more about the board.  udev's group is the machine's: the
    # fake hosts of tests running beside this one (the nova lane's soak)
    # announce their T4s' mdevs on it too, under the same addresses.
    later = settled(monitor, quiet=0.05)
    assert A100 not in later.gpus and not {p for p in later.parents if p.startswith(A100[:8])}, (
        later
    )


def test_a_served_host_announces_writes_from_any_process(tmp_path):
    """The FUSE-served kernel (another process) broadcasts what a plain
    write to its ``create`` file did."""
    with served_host.served(tmp_path, "t4x8") as host:
        host.kernel.enable_uevents()
        watching = udev.start(linux.LinuxSysfs(host.mount), "udev")
        try:
            waiter = watching.waiter()
            path = f"{host.mount}/class/mdev_bus/{T4}/mdev_supported_types/nvidia-222/create"
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, str(uuid.uuid4()).encode())
            finally:
                os.close(fd)
            assert waiter.wait(5)
            assert T4 in settled(watching).gpus
        finally:
            watching.stop()


# -- cached discovery equals a full one ----------------------------------------


def test_stops_at_once_close_each_pipe_end_once(monitor):
    """A service's shutdown thread and its owner may stop the monitor at the
    same moment; a file that took a freed number afterwards is never closed
    by a later stop."""
    barrier = threading.Barrier(4)

    def stop():
        barrier.wait()
        monitor.stop()

    stoppers = [threading.Thread(target=stop) for _ in range(4)]
    for thread in stoppers:
        thread.start()
    for thread in stoppers:
        thread.join(10)
    assert not monitor._thread.is_alive()
    reused = [os.open(os.devnull, os.O_RDONLY) for _ in range(2)]
    try:
        monitor.stop()
        for fd in reused:
            os.fstat(fd)  # still open
    finally:
        for fd in reused:
            os.close(fd)


def _random_change(kernel, rng):
    """One thing that happens to a host: an mdev created or removed, VFs
    enabled or disabled, a vendor vGPU type set or cleared."""
    action = rng.choice(("create", "create", "remove", "sriov", "vendor"))
    try:
        if action == "create":
            parent = rng.choice(kernel.list_parents())
            kernel.create_mdev(
                parent.name,
                rng.choice(parent.types).type_id,
                str(uuid.UUID(int=rng.getrandbits(128))),
            )
        elif action == "remove" and kernel.list_mdevs():
            kernel.remove_mdev(rng.choice(kernel.list_mdevs()).uuid)
        elif action == "sriov":
            gpu = rng.choice((A100, L40S))
            enabled = kernel.pci_device(gpu).sriov_numvfs
            kernel.set_vfs(gpu, 0 if enabled else rng.randint(1, 16))
        elif action == "vendor" and kernel.list_vendor_vfio():
            vf = rng.choice(kernel.list_vendor_vfio())
            number = 0 if vf.current_type or not vf.creatable else vf.creatable[0][0]
            kernel.set_vendor_vgpu_type(vf.address, number)
    except exception.MdevWriteError:
        pass  # refused by the kernel's rules: nothing changed, as on a host
    return action


@pytest.mark.parametrize("seed", range(2))
def test_cached_discovery_equals_a_full_one(announced, monitor, seed):
    rng = random.Random(seed)
    reader = linux.LinuxSysfs(announced.paths.root)
    cached = discovery_cache.CachedDiscovery(reader, monitor, full_every=1e9)
    assert cached.snapshot() == discovery.discover(reader)
    partial = 0
    for step in range(STEPS):
        action = _random_change(announced, rng)
        got = cached.snapshot()
        assert got == discovery.discover(reader), f"step {step}: {action}"
        partial += cached.last == "partial"
    assert partial == STEPS


def test_lost_events_mean_a_full_read(announced, monitor):
    reader = linux.LinuxSysfs(announced.paths.root)
    cached = discovery_cache.CachedDiscovery(reader, monitor, full_every=1e9)
    cached.snapshot()
    monitor.stop()
    announced.create_mdev(T4, "nvidia-222", str(uuid.uuid4()))
    assert cached.snapshot() == discovery.discover(reader)
    assert cached.last == "full"


@contextlib.contextmanager
def room_given_back_late(kernel):
    """``kernel`` gives a removed mdev's instance back to its type's count
    only as the block ends, its removal announced before; yields an event
    set once a removal is in between."""
    in_between, go_on = threading.Event(), threading.Event()
    give_back = kernel._refresh

    def released_late(gpu):
        in_between.set()
        assert go_on.wait(10)
        give_back(gpu)

    kernel._refresh = released_late
    try:
        yield in_between
    finally:
        go_on.set()
        del kernel._refresh


# The drivers below: conftest's make_driver, each closed as its test ends.
ON_UDEV = ("hotplug_events = udev", "restore_wait = 60")
POLLING = ("hotplug_events = off", "restore_wait = 60")


def t4_driver(make_host, make_driver):
    """``(host, driver)``: a T4 host announcing its devices, and a driver
    serving nvidia-222 there with udev events."""
    host = make_host("t4x8")
    host.enable_uevents()
    return host, make_driver(host, ON_UDEV, types="nvidia-222")


def test_a_read_before_a_removal_gave_its_room_back_is_read_again(announced, monitor):
    """The removal's uevent comes before the type's count has the instance
    back (the kernel's release comes after ``device_del``'s event): a
    snapshot taken in between finds the mdev gone and no room for it, and
    no event follows the count.  The next snapshot reads that GPU again."""
    reader = linux.LinuxSysfs(announced.paths.root)
    cached = discovery_cache.CachedDiscovery(reader, monitor, full_every=1e9)
    mdev = str(uuid.uuid4())
    announced.create_mdev(T4, "nvidia-222", mdev)
    settled(monitor)
    cached.snapshot()
    cached.snapshot()
    removal = threading.Thread(target=announced.remove_mdev, args=(mdev,))
    with room_given_back_late(announced) as in_between:
        removal.start()
        assert in_between.wait(10)
        torn = cached.snapshot()
    removal.join(10)
    assert mdev not in {m.uuid for m in torn.mdevs}
    free = discovery.discover(reader).gpu(T4).type_info("nvidia-222").available_instances
    assert torn.gpu(T4).type_info("nvidia-222").available_instances == free - 1
    assert not settled(monitor)  # the count came back without an event
    assert cached.snapshot() == discovery.discover(reader)
    assert cached.last == "partial"


def test_a_removal_of_ours_is_read_again_when_it_returns(make_host, make_driver):
    """However many snapshots take the removal's event before the kernel
    gives the instance back, the first one after the driver's removal
    returned reads the GPU again."""
    host, vgpu = t4_driver(make_host, make_driver)
    try:
        assert isinstance(vgpu.changes, udev.UdevMonitor)
        mdev = str(uuid.uuid4())
        host.create_mdev(T4, "nvidia-222", mdev)
        settled(vgpu.changes)
        vgpu.discovery.snapshot()
        with room_given_back_late(vgpu.host) as in_between:
            assert vgpu.manager.finish_release([mdev], wait=0) == []
            assert in_between.wait(10)
            for _ in range(3):
                torn = vgpu.discovery.snapshot()
                assert mdev not in {m.uuid for m in torn.mdevs}
        assert vgpu.manager.removals.join(10)
        now = discovery.discover(linux.LinuxSysfs(host.paths.root), {"nvidia-222"})
        assert vgpu.discovery.snapshot() == now
    finally:
        vgpu.close()


# -- late VFs after a reboot ------------------------------------------------------


def wait_for(predicate, timeout):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_mdevs_come_back_as_soon_as_late_vfs_appear(make_host, make_driver):
    """After a reboot the vendor enables the VFs seconds after the service
    started: by then a backoff would sleep for seconds, the monitor's
    waiter wakes the restore at the VFs' first events."""
    host = make_host("a100-sriov")
    host.enable_uevents()
    vgpu = make_driver(host, ON_UDEV)
    providers = {"rp": vgpu.provider_tree("cn1").by_gpu(A100)}
    guest = str(uuid.uuid4())
    got = vgpu.allocate(guest, {"rp": {"resources": {"VGPU": 2}}}, providers)
    vgpu.domains.define(guest, got)
    vgpu.instance_defined(guest)
    vgpu.close()
    host.reboot()

    restarted = make_driver(host, ON_UDEV)
    try:
        assert isinstance(restarted.changes, udev.UdevMonitor)
        restarted.domains.define(guest, got)
        started = time.monotonic()
        assert {o.result for o in restarted.init_host()} == {"waiting"}
        assert restarted.worker.running and set(restarted.worker.waiting) == set(got)
        # A backoff from 0.5 s would wake at 0.5, 1.5, 3.5 and then 7.5 s:
        # the VFs come at 4 s, and the restore must not wait for 7.5 s.  The
        # half second of margin is for a busy machine, not for a backoff.
        time.sleep(max(0.0, started + 4.0 - time.monotonic()))
        host.set_vfs(A100, 16)
        before_the_backoff = started + 7.0 - time.monotonic()
        assert wait_for(
            lambda: {m.uuid for m in host.list_mdevs()} == set(got), before_the_backoff
        ), f"not restored before a backoff would have woken ({host.list_mdevs()})"
        assert wait_for(lambda: not restarted.worker.waiting, 5.0)
        assert all(names.is_mdev_uuid(u) for u in got)
    finally:
        restarted.close()


def test_polling_when_udev_is_off_still_restores(make_host, make_driver):
    host = make_host("a100-sriov")
    vgpu = make_driver(host, POLLING)
    assert isinstance(vgpu.changes, changes.Polling)
    providers = {"rp": vgpu.provider_tree("cn1").by_gpu(A100)}
    got = vgpu.allocate("g", {"rp": {"resources": {"VGPU": 1}}}, providers)
    vgpu.domains.define("g", got)
    vgpu.instance_defined("g")
    host.reboot()
    restarted = make_driver(host, POLLING)
    restarted.domains.define("g", got)
    restarted.init_host()
    threading.Timer(0.2, host.set_vfs, (A100, 16)).start()
    assert wait_for(lambda: {m.uuid for m in host.list_mdevs()} == set(got), 10.0)


def test_the_refresh_sees_mdevs_made_outside_the_driver(make_host, make_driver):
    """An mdev another tool makes for its guest (of another type: the GPU is
    then blocked) shows in the next refresh, which re-read only that GPU."""
    host, vgpu = t4_driver(make_host, make_driver)
    try:
        before = vgpu.provider_tree("cn1").by_gpu(T4)
        assert (before.total, before.reserved) == (16, 0)
        other = str(uuid.uuid4())
        host.create_mdev(T4, "nvidia-223", other)
        vgpu.domains.define("a-guest-of-another-tool", [other])
        after = vgpu.provider_tree("cn1").by_gpu(T4)
        assert vgpu.discovery.last == "partial"
        assert after.reserved == after.total
        assert after == vgpu.provider_tree("cn1").by_gpu(T4)
    finally:
        vgpu.close()


# -- sriov enable's wait ---------------------------------------------------------------


def test_sriov_enable_wakes_at_the_vfs_events(make_host):
    """``sriov enable --wait`` ends at the VFs' events, not at its next
    re-read (EVENT_RECHECK), and polls without udev."""
    host = make_host("a100-sriov-off")
    host.enable_uevents()
    changes = udev.start(linux.LinuxSysfs(host.paths.root), "udev")
    try:
        wake = sriov_wait.waker(changes)
        threading.Timer(0.3, host.set_vfs, (A100, 16)).start()
        started = time.monotonic()
        woke = wake(10.0)
        elapsed = time.monotonic() - started
        # Woken before its next re-read would have come; the margin (1.7 s)
        # is for a busy machine.
        assert woke and elapsed < sriov_wait.EVENT_RECHECK
        [ready] = sriov_wait.wait_ready(host, [A100], 5.0, wake)
        assert (ready.numvfs, ready.state) == (16, sriov_functions.STATE_ENABLED)
    finally:
        changes.stop()
    polling = sriov_wait.waker(udev.start(linux.LinuxSysfs(host.paths.root), "off"))
    started = time.monotonic()
    assert polling(10.0) is None and time.monotonic() - started < 1.0
