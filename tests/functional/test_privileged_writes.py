"""The shipped write path: ``LinuxSysfs`` and a real privsep daemon against a
served fake host.

The daemon is started as nova-compute starts it, by oslo.privsep running the
context's helper command (``vgpu-privsep-helper --config-file <its own
file>``; as root here, without sudo), and it takes its sysfs root from the
nova.conf that file names.  Every write then crosses the daemon's socket and reaches the fake
kernel through the FUSE mount, so kernel errnos and the daemon's refusals
come back as the caller sees them on a host.
"""

import contextlib
import errno
import os
import signal
import sys
import textwrap
import threading
import time
import uuid

import pytest
from oslo_config import cfg

from tests import confs
from tests import conftest
from tests import served_host
from vgpu_driver import driver
from vgpu_driver import exception
from vgpu_driver import hosts
from vgpu_driver import privsep
from vgpu_driver import sriov_apply
from vgpu_driver import sriov_manage as sriov_manage_mod
from vgpu_driver import sriov_plan
from vgpu_driver.conf import privsep as privsep_conf
from vgpu_driver.fake import domains
from vgpu_driver.fake import fakekernel
from vgpu_driver.sysfs import writes

T4 = "0000:18:00.0"
A100 = "0000:41:00.0"
A100_VF = "0000:41:00.4"
L40S = "0000:c1:00.0"
L40S_VF = "0000:c1:00.4"
NIC = "0000:05:00.0"
HELPER = os.path.join(os.path.dirname(sys.executable), "vgpu-privsep-helper")

# oslo.privsep hands the helper's stderr a pipe whose ends it never closes
# (daemon._fd_logger); that is the library's, not a leak of ours.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in:pytest.PytestUnraisableExceptionWarning"
)


# What nova-compute's files say on this host, as the daemons read them.
NOVA_CONF = textwrap.dedent(confs.MIXED_HOST) + "[vgpu]\nsysfs_root = {mount}\n"
# The helper's own file: it names nova.conf, accepts the served host's root
# and asks the served host's fake vendor driver.
DAEMON_CONF = (
    "[nova]\nconfig_files = {nova_conf}\n"
    + served_host.FAKE_ROOT_CONF
    + "test_only_fake_nvml_host = {state}\n"
)
GROUPS = (privsep_conf.GROUP, privsep_conf.GPU_ADMIN_GROUP)


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
    for group in GROUPS:
        cfg.CONF.set_override("helper_command", command, group=group)
    privsep.use_daemon()


def stop_daemons():
    """Stop each context's daemon; the test then kills what is left."""
    for context in (privsep.sysfs_writer, privsep.gpu_admin):
        channel = context.channel
        context.stop()
        if channel is not None:
            # oslo.privsep's stop only shuts the socket down for writing
            # and never closes it (nova-compute never stops its daemon);
            # closed here, not by a garbage collection pytest may watch.
            channel.writer.writesock.close()
    for group in GROUPS:
        cfg.CONF.clear_override("helper_command", group=group)


@pytest.fixture
def served(tmp_path):
    """A served host (T4s, an A100, an L40S) written by a real daemon."""
    with served_by_daemon(tmp_path, "t4x8", "a100-sriov", "l40s-vfio") as host:
        yield host


@contextlib.contextmanager
def served_by_daemon(tmp_path, *profile_names, fake_root=True):
    with served_host.served(tmp_path, *profile_names) as host:
        nova_conf = tmp_path / "nova.conf"
        nova_conf.write_text(NOVA_CONF.format(mount=host.mount))
        daemon_conf = tmp_path / "privsep-daemon.conf"
        text = DAEMON_CONF.format(nova_conf=nova_conf, state=host.state)
        if not fake_root:
            text = text.replace(served_host.FAKE_ROOT_CONF, "[vgpu]\n")
        daemon_conf.write_text(text)
        use_helper(f"{HELPER} --config-file {daemon_conf}")
        try:
            yield host
            # Every write went through a daemon process, not this one.
            assert daemon_pids(str(daemon_conf))
        finally:
            stop_daemons()
            for pid in daemon_pids(str(daemon_conf)):
                os.kill(pid, signal.SIGTERM)
            served_host.wait_for(
                lambda: not daemon_pids(str(daemon_conf)), what="the privsep daemons to stop"
            )


@pytest.fixture
def daemon_driver(served, make_conf, tmp_path):
    """A driver on the served host, writing through the privileged daemon;
    ``extra``: more ``[vgpu]`` lines.  Each one made is closed as the test ends."""
    made = []

    def make(extra=""):
        conf = make_conf(f"""
            [devices]
            enabled_mdev_types = nvidia-222
            [vgpu]
            sysfs_root = {served.mount}
            state_dir = {tmp_path / "state"}
            restore_wait = 5
            {extra}
            """)
        made.append(driver.VGPUDriver(conf, domains.InProcessDomains()))
        return made[-1]

    yield make
    for vgpu in made:
        vgpu.close()


def test_allocate_reuse_release_and_restore_through_the_daemon(served, daemon_driver):
    vgpu = daemon_driver()
    assert type(vgpu.host) is writes.WritableSysfs
    assert vgpu.host.writer is privsep.call
    providers = {"rp": vgpu.provider_tree("cn1").by_gpu(T4)}
    request = {"rp": {"resources": {"VGPU": 1}}}
    first = vgpu.allocate("i-1", request, providers)
    assert os.path.lexists(f"{served.mount}/bus/mdev/devices/{first[0]}")
    vgpu.domains.define("i-1", first)
    vgpu.instance_defined("i-1")
    vgpu.domains.undefine("i-1")
    vgpu.release("i-1")
    again = vgpu.allocate("i-2", request, providers)
    assert again == first  # the free mdev is reused, not re-created
    vgpu.domains.define("i-2", again)
    vgpu.instance_defined("i-2")
    served.kernel.reboot()
    restarted = daemon_driver("claim_grace = 0")
    restarted.domains.define("i-2", again)
    assert {o.result for o in restarted.init_host()} == {"restored"}
    assert {m.uuid for m in restarted.host.list_mdevs()} == set(again)


def test_remove_blocked_by_a_guest_then_done(served):
    host = hosts.writable(served.mount)
    mdev = str(uuid.uuid4())
    host.create_mdev(T4, "nvidia-222", mdev)
    served.kernel.hold(mdev)
    with pytest.raises(exception.MdevBusy, match="still blocked"):
        host.remove_mdev(mdev, timeout=0.5)
    assert os.path.lexists(f"{served.mount}/bus/mdev/devices/{mdev}")
    served.kernel.release(mdev)
    served_host.wait_for(
        lambda: not os.path.lexists(f"{served.mount}/bus/mdev/devices/{mdev}"),
        what="the blocked remove to finish",
    )
    # The device leaves sysfs before its instance is counted free again (the
    # kernel's mdev core gives it back when the device is released), so a
    # reader polls the count rather than reading it once.
    served_host.wait_for(
        lambda: host.available_instances(T4, "nvidia-222") == 16,
        what="the removed mdev's instance to be free again",
    )


def test_vendor_types_and_mdevs_through_the_daemon(served):
    host = hosts.writable(served.mount)
    host.set_vendor_vgpu_type(L40S_VF, 1156)
    assert host.vendor_vf(L40S_VF).current_type == 1156
    with pytest.raises(exception.MdevBusy, match="already has a vGPU type"):
        host.set_vendor_vgpu_type(L40S_VF, 1156)
    taken = str(uuid.uuid4())
    host.create_mdev(T4, "nvidia-222", taken)
    with pytest.raises(exception.MdevAlreadyExists):
        host.create_mdev("0000:19:00.0", "nvidia-222", taken)
    host.create_mdev(A100_VF, "nvidia-468", str(uuid.uuid4()))
    with pytest.raises(exception.MdevNoCapacity):  # one vGPU per VF
        host.create_mdev(A100_VF, "nvidia-468", str(uuid.uuid4()))


def test_a_rebooted_a100_is_enabled_by_sriov_manage_not_by_the_daemon(tmp_path, sriov_manage):
    """What the daemon used to write, sriov_numvfs of the PF, the kernel
    refuses while nvidia holds it (ENOENT), even as root; the daemon has no
    such write any more, and NVIDIA's script (its stand-in) enables the VFs."""
    with served_by_daemon(tmp_path, "a100-sriov-off") as served:
        host = hosts.writable(served.mount)
        with pytest.raises(OSError) as refused:
            with open(f"{served.mount}/bus/pci/devices/{A100}/sriov_numvfs", "w") as f:
                f.write("16")
        assert refused.value.errno == errno.ENOENT
        with pytest.raises(KeyError):
            privsep.call("set_sriov_numvfs", A100, 16)
        assert host.pci_device(A100).sriov_numvfs == 0 and host.list_parents() == []
        sriov_manage(served.mount)
        script = sriov_manage_mod.SriovManage(conftest.FAKE_SRIOV_MANAGE)
        [pf] = sriov_apply.enable(host, sriov_plan.plan_enable(host, [A100]), 15, script)
        assert (pf.state, pf.numvfs) == ("enabled", 16)
        assert len(host.list_parents()) == 16
        # Enabling again runs nothing.
        assert [s.action for s in sriov_plan.plan_enable(host, [A100])] == ["none"]


def plant_refusals(tree, tmp_path):
    """What a hostile or broken sysfs could hold: a network card with SR-IOV,
    an mdev link to a PCI device itself, and links escaping the root."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "remove").write_text("")
    nic = os.path.join(tree, "devices", "pci0000:05", NIC)
    os.makedirs(nic)
    for name, text in (
        ("class", "0x020000\n"),
        ("sriov_totalvfs", "8\n"),
        ("sriov_numvfs", "0\n"),
        ("remove", ""),
    ):
        with open(os.path.join(nic, name), "w") as f:
            f.write(text)
    os.symlink(f"../../../devices/pci0000:05/{NIC}", os.path.join(tree, "bus/pci/devices", NIC))
    pci_itself, escaping = str(uuid.uuid4()), str(uuid.uuid4())
    os.symlink(
        f"../../../devices/pci0000:05/{NIC}", os.path.join(tree, "bus/mdev/devices", pci_itself)
    )
    os.symlink(str(tmp_path / "outside"), os.path.join(tree, "bus/mdev/devices", escaping))
    os.symlink(str(tmp_path / "outside"), os.path.join(tree, "class/mdev_bus", "escape"))
    return pci_itself, escaping


def test_each_refusal_reaches_the_caller_typed(served, tmp_path):
    """Malformed names, devices that are not what the write is for, and
    writes the daemon's configuration does not enable: each entry point
    refuses, typed on the caller's side, and nothing is written."""
    pci_itself, escaping = plant_refusals(served.state, tmp_path)
    malformed = [
        (("create_mdev", "../../../etc", "nvidia-222", str(uuid.uuid4())), "mdev parent name"),
        (("create_mdev", T4, "..", str(uuid.uuid4())), "mdev type id"),
        (("remove_mdev", "../../devices"), "mdev UUID"),
        (("remove_mdev", str(uuid.uuid4()) + "\n"), "mdev UUID"),
        (("set_vgpu_type", L40S_VF, "1156; reboot"), "vGPU type number"),
        (("set_vgpu_type", L40S_VF, "1156"), "vGPU type number"),
    ]
    refused = [
        (("create_mdev", "escape", "nvidia-222", str(uuid.uuid4())), "outside"),
        (("create_mdev", T4, "nvidia-223", str(uuid.uuid4())), "nvidia-223 is not enabled"),
        (
            ("create_mdev", A100_VF, "nvidia-222", str(uuid.uuid4())),
            f"GPU {A100} is configured for nvidia-468, not nvidia-222",
        ),
        (("remove_mdev", escaping), "outside"),
        (("remove_mdev", pci_itself), "not an mdev of a registered parent"),
        (("set_vgpu_type", NIC, 4), "not a display or 3D controller"),
        (("set_vgpu_type", T4, 1156), "not an SR-IOV virtual function"),
        (("set_vgpu_type", L40S_VF, 1155), f"GPU {L40S} is configured for nvidia-1156"),
        (("set_vgpu_type", A100, 1156), "not an SR-IOV virtual function"),
    ]
    before = tree_bytes(served.state)
    for calls, kind in (
        (malformed, exception.InvalidSysfsName),
        (refused, exception.PrivilegedWriteRefused),
    ):
        for call, text in calls:
            with pytest.raises(kind, match=text):
                privsep.call(*call)
    assert tree_bytes(served.state) == before
    assert (tmp_path / "outside" / "remove").read_text() == ""
    # The daemon is still serving after all of them.
    hosts.writable(served.mount).create_mdev(T4, "nvidia-222", str(uuid.uuid4()))


def test_the_daemon_refuses_a_root_that_is_not_sysfs(tmp_path):
    """Without the test-only option the daemon writes into sysfs only."""
    with served_by_daemon(tmp_path, "t4x8", fake_root=False) as host:
        before = tree_bytes(host.state)
        with pytest.raises(exception.PrivilegedWriteRefused, match="not a sysfs mount"):
            hosts.writable(host.mount).create_mdev(T4, "nvidia-222", str(uuid.uuid4()))
        assert tree_bytes(host.state) == before


def tree_bytes(top):
    """Every regular file under ``top`` and its bytes."""
    found = {}
    for dirpath, _dirs, files in os.walk(top):
        for name in files:
            path = os.path.join(dirpath, name)
            if os.path.isfile(path) and not os.path.islink(path):
                with open(path, "rb") as f:
                    found[path] = f.read()
    return found


def test_a_helper_that_cannot_start_is_named_as_such(tmp_path):
    use_helper(f"{tmp_path}/missing/vgpu-privsep-helper --config-file /dev/null")
    for top in ("bus", "class"):  # a sysfs root the host check accepts
        (tmp_path / top).mkdir()
    try:
        with pytest.raises(
            exception.PrivilegedHelperUnavailable,
            match="Cannot start the privileged helper.*sudoers",
        ):
            hosts.writable(str(tmp_path)).create_mdev(T4, "nvidia-222", str(uuid.uuid4()))
    finally:
        for group in GROUPS:
            cfg.CONF.clear_override("helper_command", group=group)


def test_writes_from_several_threads_share_one_daemon(served):
    host = hosts.writable(served.mount)
    made = [str(uuid.uuid4()) for _ in range(8)]
    threads = [threading.Thread(target=host.create_mdev, args=(T4, "nvidia-222", m)) for m in made]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert time.monotonic() - started < 30
    assert {u for u, _ in host.parent_mdevs(T4)} == set(made)


CAP_DAC_OVERRIDE, CAP_SYS_ADMIN = 1, 21


def effective_capabilities(pid):
    with open(f"/proc/{pid}/status") as f:
        line = next(line for line in f if line.startswith("CapEff:"))
    return int(line.split()[1], 16)


def daemons_by_context(daemon_conf):
    """``{context name: its daemon's effective capabilities}``."""
    found = {}
    for pid in daemon_pids(str(daemon_conf)):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode().split("\0")
        found[argv[argv.index("--privsep_context") + 1]] = effective_capabilities(pid)
    return found


def test_the_mode_switch_has_its_own_daemon_holding_cap_sys_admin_alone(tmp_path):
    """NVIDIA's driver wants CAP_SYS_ADMIN for NVML's mode switch: a second
    daemon holds it, started at the first switch, and the sysfs writer
    keeps CAP_DAC_OVERRIDE alone.  NVML's refusal comes back typed."""
    with served_by_daemon(tmp_path, "l40s-vfio", "t4x8") as served:
        kernel = fakekernel.FakeKernel(served.state)
        privsep.call("set_heterogeneous_mode", "0000:C1:00.0", True)
        assert kernel.heterogeneous_mode(L40S)
        daemon_conf = tmp_path / "privsep-daemon.conf"
        assert daemons_by_context(daemon_conf) == {
            "vgpu_driver.privsep.gpu_admin": 1 << CAP_SYS_ADMIN
        }
        hosts.writable(served.mount).set_vendor_vgpu_type(L40S_VF, 1156)
        assert daemons_by_context(daemon_conf) == {
            "vgpu_driver.privsep.gpu_admin": 1 << CAP_SYS_ADMIN,
            "vgpu_driver.privsep.sysfs_writer": 1 << CAP_DAC_OVERRIDE,
        }
        with pytest.raises(
            exception.MixedSizeModeRefused,
            match=f"Cannot disable mixed-size mode on GPU {L40S}: vGPUs exist",
        ):
            privsep.call("set_heterogeneous_mode", L40S, False)
        assert kernel.heterogeneous_mode(L40S)


def test_the_mode_switch_refuses_what_the_configuration_does_not_serve(tmp_path):
    """Only a vendor-VFIO board the configuration serves, an NVIDIA SR-IOV
    physical function with its VFs on, and only True or False."""
    with served_by_daemon(tmp_path, "l40s-vfio", "a100-sriov", "t4x8") as served:
        kernel = fakekernel.FakeKernel(served.state)
        refused = [
            (("set_heterogeneous_mode", L40S, 1), "1 is neither True nor False"),
            (("set_heterogeneous_mode", T4, True), "not an SR-IOV physical function"),
            (("set_heterogeneous_mode", L40S_VF, True), "not an SR-IOV physical function"),
            (("set_heterogeneous_mode", A100, True), f"GPU {A100} serves no vendor-VFIO vGPUs"),
        ]
        for call, text in refused:
            with pytest.raises(exception.PrivilegedWriteRefused, match=text):
                privsep.call(*call)
        with pytest.raises(exception.InvalidSysfsName):
            privsep.call("set_heterogeneous_mode", "../../c1:00.0", True)
        kernel.set_vfs(L40S, 0)
        with pytest.raises(
            exception.PrivilegedWriteRefused, match=f"GPU {L40S} serves no vendor-VFIO vGPUs"
        ):
            privsep.call("set_heterogeneous_mode", L40S, True)
        assert not kernel.heterogeneous_mode(L40S)


def test_the_mode_switch_refuses_a_gpu_given_no_type(tmp_path, make_conf):
    with served_host.served(tmp_path, "l40s-vfio", "t4x8") as served:
        conf = make_conf(
            textwrap.dedent(confs.FIRST_T4_ONLY)
            + textwrap.dedent(f"""
            [vgpu]
            sysfs_root = {served.mount}
            test_only_fake_sysfs_root = true
            test_only_fake_nvml_host = {served.state}
            """)
        )
        privsep.run_in_process(conf)
        try:
            with pytest.raises(
                exception.PrivilegedWriteRefused, match=f"GPU {L40S} is given no vGPU type"
            ):
                privsep.call("set_heterogeneous_mode", L40S, True)
        finally:
            privsep.use_daemon()
        assert not fakekernel.FakeKernel(served.state).heterogeneous_mode(L40S)
