"""The shipped write path: ``LinuxSysfs`` and a real privsep daemon against a
served fake host.

The daemon is started as nova-compute starts it, by oslo.privsep running the
context's ``helper_command`` (``privsep-helper --config-file ...``; as root
here, without sudo), and it takes its sysfs root from that configuration
file.  Every write then crosses the daemon's socket and reaches the fake
kernel through the FUSE mount, so kernel errnos and the daemon's refusals
come back as the caller sees them on a host.
"""

import contextlib
import errno
import os
import signal
import sys
import threading
import time
import uuid

import pytest
from oslo_config import cfg

from tests import served_host
from vgpu_driver import domains
from vgpu_driver import driver
from vgpu_driver import exception
from vgpu_driver import privsep
from vgpu_driver import sriov
from vgpu_driver.conf import privsep as privsep_conf
from vgpu_driver.sysfs import linux

T4 = "0000:18:00.0"
A100 = "0000:41:00.0"
L40S_VF = "0000:c1:00.4"
NIC = "0000:05:00.0"
HELPER = os.path.join(os.path.dirname(sys.executable), "privsep-helper")

# oslo.privsep hands the helper's stderr a pipe whose ends it never closes
# (daemon._fd_logger); that is the library's, not a leak of ours.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in:pytest.PytestUnraisableExceptionWarning")


def daemon_pids(marker):
    """PIDs of processes whose command line names ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def use_helper(command):
    cfg.CONF.set_override("helper_command", command, group=privsep_conf.GROUP)
    privsep.use_daemon()


@pytest.fixture
def served(tmp_path):
    """A served host (T4s, an A100, an L40S) written by a real daemon."""
    with served_by_daemon(tmp_path, "t4x8", "a100-sriov", "l40s-vfio") as host:
        yield host


@contextlib.contextmanager
def served_by_daemon(tmp_path, *profile_names):
    with served_host.served(tmp_path, *profile_names) as host:
        daemon_conf = tmp_path / "privsep-daemon.conf"
        daemon_conf.write_text(f"[vgpu]\nsysfs_root = {host.mount}\n")
        use_helper(f"{HELPER} --config-file {daemon_conf}")
        try:
            yield host
            # Every write went through a daemon process, not this one.
            assert daemon_pids(str(daemon_conf))
        finally:
            privsep.sysfs_writer.stop()
            for pid in daemon_pids(str(daemon_conf)):
                os.kill(pid, signal.SIGTERM)
            served_host.wait_for(lambda: not daemon_pids(str(daemon_conf)),
                                 what="the privsep daemon to stop")
            cfg.CONF.clear_override("helper_command", group=privsep_conf.GROUP)


def make_driver(make_conf, host, tmp_path, extra=""):
    conf = make_conf(f"""
        [devices]
        enabled_mdev_types = nvidia-222
        [vgpu]
        sysfs_root = {host.mount}
        state_dir = {tmp_path / "state"}
        restore_wait = 5
        {extra}
        """)
    return driver.VGPUDriver(conf, domains.InProcessDomains())


def test_allocate_reuse_release_and_restore_through_the_daemon(served, make_conf, tmp_path):
    vgpu = make_driver(make_conf, served, tmp_path)
    assert type(vgpu.host) is linux.LinuxSysfs
    providers = {"rp": vgpu.provider_tree("cn1").by_gpu(T4)}
    request = {"rp": {"resources": {"VGPU": 1}}}
    first = vgpu.allocate("i-1", request, providers)
    assert os.path.lexists(f"{served.mount}/bus/mdev/devices/{first[0]}")
    vgpu.domains.define("i-1", first)
    vgpu.instance_defined("i-1")
    vgpu.domains.undefine("i-1")
    vgpu.release("i-1")
    again = vgpu.allocate("i-2", request, providers)
    assert again == first                       # the free mdev is reused, not re-created
    vgpu.domains.define("i-2", again)
    vgpu.instance_defined("i-2")
    served.kernel.reboot()
    restarted = make_driver(make_conf, served, tmp_path, "claim_grace = 0")
    restarted.domains.define("i-2", again)
    assert {o.result for o in restarted.init_host()} == {"restored"}
    assert {m.uuid for m in restarted.host.list_mdevs()} == set(again)


def test_remove_blocked_by_a_guest_then_done(served):
    host = linux.LinuxSysfs(served.mount)
    mdev = str(uuid.uuid4())
    host.create_mdev(T4, "nvidia-222", mdev)
    served.kernel.hold(mdev)
    with pytest.raises(exception.MdevBusy, match="still blocked"):
        host.remove_mdev(mdev, timeout=0.5)
    assert os.path.lexists(f"{served.mount}/bus/mdev/devices/{mdev}")
    served.kernel.release(mdev)
    served_host.wait_for(lambda: not os.path.lexists(f"{served.mount}/bus/mdev/devices/{mdev}"),
                         what="the blocked remove to finish")
    assert host.available_instances(T4, "nvidia-222") == 16


def test_sriov_and_vendor_types_through_the_daemon(served):
    host = linux.LinuxSysfs(served.mount)
    host.set_sriov_numvfs(A100, 0)
    assert host.pci_device(A100).sriov_numvfs == 0
    host.set_sriov_numvfs(A100, 16)
    assert host.pci_device(A100).sriov_numvfs == 16
    host.set_vendor_vgpu_type(L40S_VF, 1156)
    assert host.vendor_vf(L40S_VF).current_type == 1156
    with pytest.raises(exception.MdevBusy, match="already has a vGPU type"):
        host.set_vendor_vgpu_type(L40S_VF, 1155)
    taken = str(uuid.uuid4())
    host.create_mdev(T4, "nvidia-222", taken)
    with pytest.raises(exception.MdevAlreadyExists):
        host.create_mdev("0000:19:00.0", "nvidia-222", taken)
    with pytest.raises(exception.MdevNoCapacity):
        host.create_mdev(T4, "nvidia-223", str(uuid.uuid4()))


def test_enabling_a_rebooted_a100_through_the_daemon(tmp_path):
    """The kernel's answers to sriov_numvfs reach the caller typed: more than
    sriov_totalvfs is ERANGE, another non-zero count is EBUSY."""
    with served_by_daemon(tmp_path, "a100-sriov-off") as served:
        host = linux.LinuxSysfs(served.mount)
        with pytest.raises(exception.MdevWriteError, match=r"\[ERANGE\].*at most "
                                                           "sriov_totalvfs") as caught:
            host.set_sriov_numvfs(A100, 17)
        assert caught.value.errno == errno.ERANGE
        assert host.pci_device(A100).sriov_numvfs == 0 and host.list_parents() == []
        [pf] = sriov.enable(host, sriov.plan_enable(host, [A100]), timeout=15)
        assert (pf.state, pf.numvfs) == ("enabled", 16)
        assert len(host.list_parents()) == 16
        with pytest.raises(exception.MdevBusy, match=r"\[EBUSY\].*sriov disable"):
            host.set_sriov_numvfs(A100, 8)
        assert host.pci_device(A100).sriov_numvfs == 16
        # Enabling again is no write at all.
        assert [s.action for s in sriov.plan_enable(host, [A100])] == ["none"]


def plant_refusals(tree, tmp_path):
    """What a hostile or broken sysfs could hold: a network card with SR-IOV,
    an mdev link to a PCI device itself, and links escaping the root."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "remove").write_text("")
    nic = os.path.join(tree, "devices", "pci0000:05", NIC)
    os.makedirs(nic)
    for name, text in (("class", "0x020000\n"), ("sriov_totalvfs", "8\n"),
                       ("sriov_numvfs", "0\n"), ("remove", "")):
        with open(os.path.join(nic, name), "w") as f:
            f.write(text)
    os.symlink(f"../../../devices/pci0000:05/{NIC}", os.path.join(tree, "bus/pci/devices", NIC))
    pci_itself, escaping = str(uuid.uuid4()), str(uuid.uuid4())
    os.symlink(f"../../../devices/pci0000:05/{NIC}",
               os.path.join(tree, "bus/mdev/devices", pci_itself))
    os.symlink(str(tmp_path / "outside"), os.path.join(tree, "bus/mdev/devices", escaping))
    os.symlink(str(tmp_path / "outside"), os.path.join(tree, "class/mdev_bus", "escape"))
    return pci_itself, escaping


def test_each_refusal_reaches_the_caller_typed(served, tmp_path):
    pci_itself, escaping = plant_refusals(served.state, tmp_path)
    refusals = [
        (("create_mdev", "../../../etc", "nvidia-222", str(uuid.uuid4())), "mdev parent name"),
        (("create_mdev", T4, "..", str(uuid.uuid4())), "mdev type id"),
        (("create_mdev", "escape", "nvidia-222", str(uuid.uuid4())), "outside"),
        (("remove_mdev", escaping), "outside"),
        (("remove_mdev", pci_itself), "not an mdev of a registered parent"),
        (("remove_mdev", "../../devices"), "mdev UUID"),
        (("set_sriov_numvfs", NIC, 4), "not a display or 3D controller"),
        (("set_vgpu_type", L40S_VF, "1156; reboot"), "vGPU type number"),
        (("set_vgpu_type", L40S_VF, "1156"), "vGPU type number"),
    ]
    for call, text in refusals:
        with pytest.raises(exception.InvalidSysfsName, match=text):
            privsep.call(*call)
    assert (tmp_path / "outside" / "remove").read_text() == ""
    with open(os.path.join(served.mount, "bus/pci/devices", NIC, "sriov_numvfs")) as f:
        assert f.read() == "0\n"
    # The daemon is still serving after all of them.
    linux.LinuxSysfs(served.mount).create_mdev(T4, "nvidia-222", str(uuid.uuid4()))


def test_a_helper_that_cannot_start_is_named_as_such(tmp_path):
    use_helper(f"{tmp_path}/missing/privsep-helper --config-file /dev/null")
    for top in ("bus", "class"):  # a sysfs root the host check accepts
        (tmp_path / top).mkdir()
    try:
        with pytest.raises(exception.PrivilegedHelperUnavailable,
                           match="Cannot start the privileged helper.*sudoers"):
            linux.LinuxSysfs(str(tmp_path)).create_mdev(T4, "nvidia-222", str(uuid.uuid4()))
    finally:
        cfg.CONF.clear_override("helper_command", group=privsep_conf.GROUP)


def test_writes_from_several_threads_share_one_daemon(served):
    host = linux.LinuxSysfs(served.mount)
    made = [str(uuid.uuid4()) for _ in range(8)]
    threads = [threading.Thread(target=host.create_mdev, args=(T4, "nvidia-222", m))
               for m in made]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert time.monotonic() - started < 30
    assert {u for u, _ in host.parent_mdevs(T4)} == set(made)
