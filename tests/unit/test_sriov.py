"""VF enablement of NVIDIA SR-IOV GPUs against fake hosts: the fake kernel
answers ``sriov_numvfs`` as the kernel does, and the stand-in for NVIDIA's
``sriov-manage`` (``vgpu-fake-sriov-manage``) is the script run."""

import errno
import logging
import os
import uuid

import pytest

from tests import conftest
from tests import pci_devices
from vgpu_driver import claims_journal
from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import inventory
from vgpu_driver import sriov_apply
from vgpu_driver import sriov_functions
from vgpu_driver import sriov_manage as sriov_manage_mod
from vgpu_driver import sriov_notices
from vgpu_driver import sriov_plan
from vgpu_driver import sriov_wait
from vgpu_driver.conf import mdev_types

A100 = "0000:41:00.0"
ENABLED = (
    f"{A100}: enabled 16 VFs ({conftest.FAKE_SRIOV_MANAGE} -e {A100}); waiting for their mdev types"
)
A100_VF = "0000:41:00.4"
T4 = "0000:18:00.0"
L40S = "0000:c1:00.0"


def test_off_board_is_listed_as_off_and_offers_nothing(make_host):
    host = make_host("a100-sriov-off")
    [pf] = sriov_functions.list_functions(host)
    assert (pf.address, pf.vendor, pf.device, pf.pci_class) == (
        A100,
        "0x10de",
        "0x20f1",
        "0x030200",
    )
    assert (pf.totalvfs, pf.numvfs, pf.vfs, pf.mdev_types, pf.state) == (16, 0, (), (), "off")
    assert host.list_parents() == []


def test_enabled_boards_list_their_vfs_and_types(make_host):
    host = make_host("a100-sriov", "l40s-vfio", "t4x8")
    functions = {pf.address: pf for pf in sriov_functions.list_functions(host)}
    assert set(functions) == {A100, L40S}  # time-sliced T4s have no VFs
    a100, l40s = functions[A100], functions[L40S]
    assert (a100.state, a100.numvfs, len(a100.vfs)) == ("enabled", 16, 16)
    assert a100.vfs[0].address == A100_VF and "nvidia-468" in a100.mdev_types
    assert l40s.state == "enabled" and "nvidia-1156" in l40s.mdev_types


@pytest.fixture
def script(sriov_manage):
    """NVIDIA's script, as vgpu-manage runs it: the stand-in, on the host
    ``script.point_at(host)`` names."""
    runner = sriov_manage_mod.SriovManage(conftest.FAKE_SRIOV_MANAGE)
    runner.point_at = lambda host: sriov_manage(host.paths.root)
    return runner


def test_enable_runs_sriov_manage_and_waits_for_every_vf(make_host, script):
    host = make_host("a100-sriov-off")
    script.point_at(host)
    steps = sriov_plan.plan_enable(host, [A100])
    assert [(s.action, s.detail) for s in steps] == [("enable", "sriov_numvfs 0 -> 16")]
    said = []
    [pf] = sriov_apply.enable(host, steps, 5, script, progress=said.append)
    assert (pf.state, pf.numvfs, pf.ready_vfs) == ("enabled", 16, 16)
    assert said[0] == ENABLED
    assert said[1].startswith(f"{A100}: 16 VFs ready, offering 6 mdev type(s)")
    # Idempotent: an enabled board is left alone (a second write would be EBUSY).
    again = sriov_plan.plan_enable(host, [A100, A100, "0000:41:00.0 "])
    assert [(s.action, s.detail) for s in again] == [
        ("none", "already enabled (16 of 16 VFs), left alone")
    ]
    assert sriov_apply.enable(host, again, 0, script)[0].numvfs == 16


def test_vfs_enabled_between_plan_and_write_are_left_alone(make_host, script):
    host = make_host("a100-sriov-off")
    script.point_at(host)
    steps = sriov_plan.plan_enable(host, [A100])
    host.set_vfs(A100, 4)  # another tool got there first
    said = []
    [pf] = sriov_apply.enable(host, steps, 5, script, progress=said.append)
    assert pf.numvfs == 4  # no second write (the kernel would answer EBUSY)
    assert said[0] == f"{A100}: enabled meanwhile by someone else (4 VFs), left alone"


def test_the_wait_takes_any_wake_and_ends_when_the_vfs_appear(make_host):
    """What a udev monitor would do: return as soon as devices changed."""
    host = make_host("a100-sriov-off")
    woken = []

    def wake(seconds):
        woken.append(seconds)
        if len(woken) == 2:  # the vendor driver registers the VFs meanwhile
            host.set_vfs(A100, 16)

    [pf] = sriov_wait.wait_ready(host, [A100], timeout=30, wake=wake)
    assert pf.state == "enabled" and len(woken) == 2
    assert all(0 < s <= 30 for s in woken)


def test_the_wait_is_bounded_and_says_what_is_missing(make_host):
    host = make_host("a100-sriov-off")
    now = [100.0]

    def wake(seconds):
        now[0] += min(seconds, 1.0)

    with pytest.raises(
        exception.SriovNotReady, match=rf"{A100}: after 5s, 0 of 0 VFs offer mdev types.*--wait"
    ):
        sriov_wait.wait_ready(host, [A100], timeout=5, wake=wake, clock=lambda: now[0])
    assert now[0] == 105.0


def test_vfs_the_vendor_driver_has_not_registered_are_partial(make_host):
    host = make_host("a100-sriov")
    host.unregister_parent("0000:41:02.3")
    [pf] = sriov_functions.list_functions(host)
    assert (pf.state, pf.ready_vfs, pf.numvfs) == ("partial", 15, 16)
    assert pf.vfs[-1] == sriov_functions.VirtualFunction("0000:41:02.3", (), False)
    now = [0.0]
    with pytest.raises(exception.SriovNotReady, match="after 2s, 15 of 16 VFs"):
        sriov_wait.wait_ready(
            host,
            [A100],
            timeout=2,
            clock=lambda: now[0],
            wake=lambda seconds: now.__setitem__(0, now[0] + seconds),
        )


@pytest.mark.parametrize(
    "address, why",
    [
        (pci_devices.NIC, r"vendor 0x8086 is not NVIDIA \(0x10de\)"),
        ("0000:41:00.1", "no PCI device at this address"),
        ("41:00.0; reboot", "not a PCI address"),
        (T4, r"not an SR-IOV physical function \(no sriov_totalvfs\)"),
        (A100_VF, r"not an SR-IOV physical function"),
    ],
)
def test_anything_but_an_nvidia_sriov_gpu_is_refused_before_any_write(make_host, address, why):
    host = make_host("a100-sriov-off", "t4x8")
    host.set_vfs(A100, 16)
    pci_devices.plant_nic(host.paths.root)
    before = pci_devices.tree_state(host.paths.root)
    with pytest.raises(
        exception.SriovRefused, match=rf"enable SR-IOV VFs of '[^']*': (it is )?{why}"
    ):
        sriov_plan.plan_enable(host, [A100, address])
    with pytest.raises(exception.SriovRefused, match=why):
        sriov_plan.plan_disable(host, address)
    assert pci_devices.tree_state(host.paths.root) == before


def test_an_nvidia_function_of_another_class_is_refused(make_host):
    host = make_host("a100-sriov-off")
    pci_devices.plant_nic(host.paths.root, "0000:06:00.0", vendor="0x10de")
    with pytest.raises(exception.SriovRefused, match="class 0x020000 is not a display"):
        sriov_plan.plan_enable(host, ["0000:06:00.0"])


def test_disable_refuses_while_a_vf_holds_an_mdev(make_host, script):
    host = make_host("a100-sriov")
    script.point_at(host)
    mdev = str(uuid.uuid4())
    host.create_mdev(A100_VF, "nvidia-468", mdev)
    with pytest.raises(
        exception.SriovRefused, match=rf"1 VF\(s\) hold vGPUs: {A100_VF} \({mdev}\)"
    ):
        sriov_plan.plan_disable(host, A100)
    host.remove_mdev(mdev)
    step = sriov_plan.plan_disable(host, A100)
    assert (step.action, step.detail) == ("disable", "sriov_numvfs 16 -> 0")
    sriov_apply.disable(host, step, script)
    assert sriov_functions.list_functions(host)[0].state == "off"
    assert sriov_plan.plan_disable(host, A100).action == "none"


def test_disable_refuses_a_vendor_vgpu_type(make_host):
    host = make_host("l40s-vfio")
    host.set_vendor_vgpu_type("0000:c1:00.5", 1156)
    with pytest.raises(exception.SriovRefused, match=r"0000:c1:00.5 \(nvidia-1156\)"):
        sriov_plan.plan_disable(host, L40S)


def test_disable_refuses_a_claim_in_the_journal(make_host, tmp_path):
    host = make_host("a100-sriov")
    journal = claims_journal.Journal(str(tmp_path / "state"))
    with journal.transaction() as txn:
        txn.add("inst-1", str(uuid.uuid4()), A100, A100_VF, "nvidia-468")
    with pytest.raises(
        exception.SriovRefused, match="the claims journal holds 1 claim.*instance inst-1"
    ):
        sriov_plan.plan_disable(host, A100, journal.claims)
    assert sriov_functions.list_functions(host)[0].numvfs == 16


def test_off_gpu_is_unserved_with_the_fix_and_logged_once(make_host, make_conf, caplog):
    host = make_host("a100-sriov-off")
    config = mdev_types.from_conf(
        make_conf(
            f"[devices]\nenabled_mdev_types = nvidia-468\n"
            f"[mdev_nvidia-468]\ndevice_addresses = {A100}\n"
        )
    )
    tree = inventory.compute(discovery.discover(host), config, "cn1")
    assert tree.providers == () and tree.vfs_pending == {A100}
    assert tree.unserved == ((A100, f"SR-IOV is off: run vgpu-manage sriov enable {A100}"),)
    notices, log = sriov_notices.PendingNotices(), logging.getLogger("test-sriov")
    with caplog.at_level(logging.WARNING, "test-sriov"):
        for _periodic_update in range(3):
            notices.report(tree, log)
    assert [r.getMessage() for r in caplog.records] == [
        f"GPU {A100} is configured but gets no provider: SR-IOV is off: run vgpu-manage "
        f"sriov enable {A100}"
    ]
    host.set_vfs(A100, 16)
    served = inventory.compute(discovery.discover(host), config, "cn1")
    assert served.by_gpu(A100).total == 10 and not served.vfs_pending
    notices.report(served, log)
    host.set_vfs(A100, 0)  # off again later: said again, once
    with caplog.at_level(logging.WARNING, "test-sriov"):
        notices.report(tree, log)
        notices.report(tree, log)
    assert len(caplog.records) == 2


def test_an_unconfigured_off_gpu_keeps_the_usual_reason(make_host, make_conf):
    host = make_host("a100-sriov-off", "t4x8")
    config = mdev_types.from_conf(
        make_conf(
            f"[devices]\nenabled_mdev_types = nvidia-222\n"
            f"[mdev_nvidia-222]\ndevice_addresses = {T4}\n"
        )
    )
    tree = inventory.compute(discovery.discover(host), config, "cn1")
    assert dict(tree.unserved)[A100].startswith("not listed in any [mdev_<type>]")
    assert not tree.vfs_pending


def test_device_ids_count_an_off_gpu(make_host, make_conf):
    """A fleet's gpu_count gives the off GPU its type, so enabling it later
    does not shift which GPU serves what."""
    host = make_host("a100-sriov-off")
    config = mdev_types.from_conf(
        make_conf(
            "[devices]\nenabled_mdev_types = nvidia-468\n"
            "[mdev_nvidia-468]\ndevice_ids = 10de:20f1\ngpu_count = 1\n"
        )
    )
    tree = inventory.compute(discovery.discover(host), config, "cn1")
    assert tree.vfs_pending == {A100}


def _script_file(tmp_path, body):
    path = tmp_path / "sriov-manage"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize(
    "case, why",
    [
        (
            "missing",
            "cannot run: there is no such file (it comes with NVIDIA's vGPU manager; "
            "set [vgpu] sriov_manage_path where it is installed); nothing was changed",
        ),
        (
            "relative",
            "cannot run: [vgpu] sriov_manage_path must be an absolute path; nothing was changed",
        ),
        ("not executable", "cannot run: the file is not executable; nothing was changed"),
    ],
)
def test_a_script_that_cannot_run_changes_nothing(make_host, tmp_path, case, why):
    host = make_host("a100-sriov-off")
    path = {
        "missing": str(tmp_path / "nowhere" / "sriov-manage"),
        "relative": "sriov-manage",
        "not executable": _script_file(tmp_path, "exit 0"),
    }[case]
    if case == "not executable":
        (tmp_path / "sriov-manage").chmod(0o644)
    before = pci_devices.tree_state(host.paths.root)
    with pytest.raises(exception.SriovManageFailed) as raised:
        sriov_apply.enable(
            host, sriov_plan.plan_enable(host, [A100]), 1, sriov_manage_mod.SriovManage(path)
        )
    assert str(raised.value) == f"NVIDIA's sriov-manage ({path} -e {A100}) {why}"
    assert pci_devices.tree_state(host.paths.root) == before


@pytest.mark.parametrize("writable", ["script", "directory"])
def test_a_script_another_user_can_replace_is_not_run(make_host, tmp_path, writable):
    """Root runs it: a script, or a directory above it, that others may
    write would hand them root.  The script would have enabled the VFs."""
    host = make_host("a100-sriov-off")
    folder = tmp_path / "nvidia"
    folder.mkdir()
    path = _script_file(folder, f"echo 16 > {host.paths.root}/nowhere")
    changed = path if writable == "script" else str(folder)
    os.chmod(changed, 0o777 if writable == "script" else 0o775)
    before = pci_devices.tree_state(host.paths.root)
    with pytest.raises(exception.SriovManageFailed) as raised:
        sriov_apply.enable(
            host, sriov_plan.plan_enable(host, [A100]), 1, sriov_manage_mod.SriovManage(path)
        )
    assert (
        f"({path} -e {A100}) was not run: root would run what another user can "
        f"replace: {changed} (owner root, mode 0{'777' if writable == 'script' else '775'})"
        in str(raised.value)
    )
    assert str(raised.value).endswith("nothing was changed")
    assert pci_devices.tree_state(host.paths.root) == before
    assert not os.path.exists(f"{host.paths.root}/nowhere")


def test_a_failing_script_is_named_with_what_it_printed_on_one_line(make_host, tmp_path):
    host = make_host("a100-sriov-off")
    path = _script_file(
        tmp_path, 'echo "Enabling VFs on $2"; echo "Cannot obtain unbindLock for $2" >&2; exit 1'
    )
    with pytest.raises(exception.SriovManageFailed) as raised:
        sriov_apply.enable(
            host, sriov_plan.plan_enable(host, [A100]), 1, sriov_manage_mod.SriovManage(path)
        )
    assert str(raised.value) == (
        f"NVIDIA's sriov-manage ({path} -e {A100}) failed (exit code 1); it printed: "
        f"Enabling VFs on {A100} / Cannot obtain unbindLock for {A100}"
    )
    assert host.pci_device(A100).sriov_numvfs == 0


def test_a_script_that_exits_0_without_vfs_is_not_taken_at_its_word(make_host, tmp_path):
    """NVIDIA's script exits 0, silently, for a GPU it does not take for
    SR-IOV: the VF count read back is what counts, not a wait that times out."""
    host = make_host("a100-sriov-off")
    path = _script_file(tmp_path, "exit 0")
    with pytest.raises(
        exception.SriovManageFailed,
        match=rf"\({path} -e {A100}\) exited 0 but GPU {A100} still has no "
        "VF; it printed: nothing",
    ):
        sriov_apply.enable(
            host, sriov_plan.plan_enable(host, [A100]), 30, sriov_manage_mod.SriovManage(path)
        )


def test_the_old_direct_write_is_refused_by_the_kernel(make_host):
    """What vgpu-driver used to write (sriov_numvfs of the PF, as root):
    the kernel refuses it while nvidia holds the PF, as on a host."""
    host = make_host("a100-sriov-off")
    with pytest.raises(OSError) as raised:
        host.write_attr(os.path.join(host.paths.pci_device(A100), "sriov_numvfs"), "16")
    assert raised.value.errno == errno.ENOENT
    assert host.pci_device(A100).sriov_numvfs == 0
