"""``vgpu-manage sriov``, ``inventory`` and ``config check`` on an A100 whose
VFs are off, run in-process with the real parsing; and the boot unit."""

import configparser
import contextlib
import io
import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import threading
import time
import uuid

import pytest

from tests import conftest
from tests import pci_devices
from tests.unit.test_cli import run  # noqa: F401 - the in-process CLI fixture
from vgpu_driver import claims_journal
from vgpu_driver.cmd import base
from vgpu_driver.cmd import columns
from vgpu_driver.cmd import manage

A100 = "0000:41:00.0"
ENABLED = (
    f"{A100}: enabled 16 VFs ({conftest.FAKE_SRIOV_MANAGE} -e {A100}); waiting for their mdev types"
)
CONF = f"[devices]\nenabled_mdev_types = nvidia-468\n[mdev_nvidia-468]\ndevice_addresses = {A100}\n"
UNIT = pathlib.Path(__file__).parents[2] / "etc" / "systemd" / "vgpu-driver-sriov.service"


def test_off_gpu_is_an_inventory_row_and_a_config_problem(make_host, run):  # noqa: F811
    host = make_host("a100-sriov-off")
    code, out, _ = run("--sysfs-root", host.paths.root, "inventory", "-f", "json", conf=CONF)
    [row] = json.loads(out)
    assert code == 0 and (row["gpu"], row["provider"], row["total"]) == (A100, None, 0)
    assert row["reason"] == f"no provider: SR-IOV is off: run vgpu-manage sriov enable {A100}"
    code, out, _ = run("--sysfs-root", host.paths.root, "config", "check", conf=CONF)
    assert (code, out.splitlines()) == (
        base.EXIT_PROBLEMS,
        [
            f"error: [mdev_nvidia-468] device_addresses = '{A100}': GPU {A100} gets no provider: "
            f"SR-IOV is off: run vgpu-manage sriov enable {A100}"
        ],
    )


def test_enable_then_status_and_inventory(make_host, run, sriov_manage):  # noqa: F811
    host = make_host("a100-sriov-off")
    root = ("--sysfs-root", host.paths.root)
    conf = CONF + sriov_manage(host.paths.root)
    code, out, _ = run(*root, "sriov", "status", "-f", "json", conf=conf)
    assert json.loads(out) == [
        {
            "physical_function": A100,
            "vendor": "0x10de",
            "device": "0x20f1",
            "totalvfs": 16,
            "numvfs": 0,
            "vfs": [],
            "mdev_types": [],
            "state": "off",
            "vgpu_sizes": None,
        }
    ]
    code, out, _ = run(*root, "sriov", "enable", "--configured", "--dry-run", conf=conf)
    assert (code, out) == (
        0,
        f"{A100}: would enable VFs: sriov_numvfs 0 -> 16 "
        f"({conftest.FAKE_SRIOV_MANAGE} -e {A100})\n",
    )
    assert host.pci_device(A100).sriov_numvfs == 0
    code, out, _ = run(*root, "sriov", "enable", "--configured", "--wait", "10", conf=conf)
    assert code == 0 and out.splitlines()[0] == ENABLED
    [status] = json.loads(run(*root, "sriov", "status", "-f", "json", conf=conf)[1])
    assert (status["numvfs"], len(status["vfs"]), status["state"]) == (16, 16, "enabled")
    code, out, _ = run(*root, "inventory", "-f", "json", conf=conf)
    assert [(r["gpu"], r["total"]) for r in json.loads(out)] == [(A100, 10)]
    code, out, _ = run(*root, "sriov", "enable", A100, conf=conf)
    assert code == 0 and "already enabled (16 of 16 VFs), left alone" in out


def test_configured_enables_only_what_nova_conf_names(make_host, run):  # noqa: F811
    host = make_host("a100-sriov-off", "t4x8")
    conf = (
        "[devices]\nenabled_mdev_types = nvidia-222\n[mdev_nvidia-222]\n"
        "device_addresses = 0000:18:00.0\n"
    )
    code, out, _ = run(
        "--sysfs-root", host.paths.root, "sriov", "enable", "--configured", conf=conf
    )
    assert (code, out) == (0, "no SR-IOV GPU to enable\n")
    assert host.pci_device(A100).sriov_numvfs == 0


@pytest.mark.parametrize(
    "argv, why",
    [
        (("sriov", "enable"), "give ADDRESS..., --all or --configured"),
        (("sriov", "enable", "--all", A100), "give ADDRESS..., --all or --configured"),
        (
            ("sriov", "enable", "--all", "--wait", "-1"),
            "argument --wait: '-1' is not a finite, non-negative number",
        ),
        (("sriov", "enable", A100, pci_devices.NIC), "vendor 0x8086 is not NVIDIA"),
        (("sriov", "enable", "0000:41:00.1"), "no PCI device at this address"),
        (("sriov", "disable", pci_devices.NIC, "--dry-run"), "vendor 0x8086 is not NVIDIA"),
    ],
)
def test_refusals_are_one_error_line_and_change_nothing(make_host, run, argv, why):  # noqa: F811
    host = make_host("a100-sriov-off")
    pci_devices.plant_nic(host.paths.root)
    before = pci_devices.tree_state(host.paths.root)
    code, out, err = run("--sysfs-root", host.paths.root, *argv, conf=CONF)
    assert code == base.EXIT_ERROR and out == ""
    [line] = err.splitlines()
    assert line.startswith("error: ") and why in line
    assert pci_devices.tree_state(host.paths.root) == before


def test_disable_with_an_mdev_is_refused_then_done(make_host, run, sriov_manage):  # noqa: F811
    host = make_host("a100-sriov")
    conf = CONF + sriov_manage(host.paths.root)
    mdev = str(uuid.uuid4())
    host.create_mdev("0000:41:00.4", "nvidia-468", mdev)
    root = ("--sysfs-root", host.paths.root)
    code, _, err = run(*root, "sriov", "disable", A100, conf=conf)
    assert code == 2 and err == (
        f"error: Refusing to disable SR-IOV VFs of '{A100}': 1 VF(s) hold vGPUs: "
        f"0000:41:00.4 ({mdev}); remove them first (vgpu-manage mdev list, orphans "
        "reclaim).\n"
    )
    host.remove_mdev(mdev)
    assert run(*root, "sriov", "disable", A100, "--dry-run", conf=conf)[1] == (
        f"{A100}: would disable VFs: sriov_numvfs 16 -> 0 ({conftest.FAKE_SRIOV_MANAGE} "
        f"-d {A100})\n"
    )
    assert host.pci_device(A100).sriov_numvfs == 16
    assert run(*root, "sriov", "disable", A100, conf=conf)[:2] == (
        0,
        f"{A100}: disabled VFs: sriov_numvfs 16 -> 0\n",
    )
    assert host.pci_device(A100).sriov_numvfs == 0


def test_disable_waits_for_an_allocation_and_sees_its_claim(
    make_host,
    run,  # noqa: F811
    tmp_path,
    sriov_manage,
):
    """The claim check and the write happen under the journal's allocation
    lock: a vGPU claimed while disable waits is seen, not disabled under."""
    host = make_host("a100-sriov")
    conf = CONF + sriov_manage(host.paths.root)
    journal = claims_journal.Journal(str(tmp_path / "state"))
    holding, result = threading.Event(), {}

    def allocate():
        with journal.transaction() as txn:
            holding.set()
            time.sleep(0.5)
            txn.add("inst-1", str(uuid.uuid4()), A100, "0000:41:00.4", "nvidia-468")

    allocator = threading.Thread(target=allocate)
    allocator.start()
    holding.wait()
    result["code"], _, result["err"] = run(
        "--sysfs-root", host.paths.root, "sriov", "disable", A100, conf=conf
    )
    allocator.join()
    assert result["code"] == base.EXIT_ERROR
    assert "the claims journal holds 1 claim(s) on it (instance inst-1)" in result["err"]
    assert host.pci_device(A100).sriov_numvfs == 16


def _unit():
    unit = configparser.ConfigParser(strict=True, interpolation=None)
    unit.optionxform = str
    unit.read(UNIT)
    return unit


def test_boot_unit_orders_and_runs_once(tmp_path):
    unit = _unit()
    assert unit["Unit"]["After"] == "nvidia-vgpu-mgr.service"
    assert unit["Unit"]["Before"] == "nova-compute.service"
    assert (unit["Service"]["Type"], unit["Service"]["RemainAfterExit"]) == ("oneshot", "yes")
    # One command, no per-GPU template, no waiting step of its own.
    assert set(unit["Service"]) == {"Type", "RemainAfterExit", "ExecStart"}
    if shutil.which("systemd-analyze") is None:
        return  # parsed above; systemd's own check needs systemd
    # verify insists on the executable: the same unit, with this install's.
    copy = tmp_path / "vgpu-driver-sriov.service"
    copy.write_text(
        UNIT.read_text().replace(
            "/usr/bin/vgpu-manage", os.path.join(os.path.dirname(sys.executable), "vgpu-manage")
        )
    )
    result = subprocess.run(
        ["systemd-analyze", "verify", str(copy)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert (result.returncode, result.stderr) == (0, "")


def test_boot_unit_command_enables_a_rebooted_a100(
    make_host, tmp_path, fake_kernel_cli, sriov_manage
):
    argv = shlex.split(_unit()["Service"]["ExecStart"])
    assert argv[:3] == ["/usr/bin/vgpu-manage", "--config-file", "/etc/nova/nova.conf"]
    assert argv[3:] == ["sriov", "enable", "--configured", "--wait", "120"]
    host = make_host("a100-sriov-off")
    conf = tmp_path / "nova.conf"
    conf.write_text(CONF + sriov_manage(host.paths.root))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = manage.main([argv[1], str(conf), "--sysfs-root", host.paths.root, *argv[3:]])
    assert code == 0 and out.getvalue().startswith(f"{ENABLED}\n")
    assert host.pci_device(A100).sriov_numvfs == 16
    assert len(host.list_parents()) == 16


def test_vf_lists_read_as_ranges_in_tables_and_whole_in_json():
    vfs = [
        "0000:41:00.4",
        "0000:41:00.5",
        "0000:41:00.6",
        "0000:41:00.7",
        "0000:41:01.0",
        "0000:41:02.1",
        "0000:41:02.2",
        "0000:42:00.0",
    ]
    column = columns.PciRangesColumn(vfs)
    assert column.human_readable() == (
        "0000:41:00.4-0000:41:01.0, 0000:41:02.1-0000:41:02.2, 0000:42:00.0 (8)"
    )
    assert column.machine_readable() == vfs
    assert columns.PciRangesColumn(["0000:41:00.4"]).human_readable() == "0000:41:00.4"
    assert columns.PciRangesColumn([]).human_readable() == ""


L40S = "0000:c1:00.0"
L40S_CONF = (
    f"[devices]\nenabled_mdev_types = nvidia-1156\n[mdev_nvidia-1156]\ndevice_addresses = {L40S}\n"
)


def sizes_of(run, root):  # noqa: F811 - the fixture, passed on
    code, out, err = run(*root, "sriov", "status", "-f", "json", conf=L40S_CONF)
    assert code == 0, err
    return {row["physical_function"]: row["vgpu_sizes"] for row in json.loads(out)}


def test_a_vendor_vfio_board_switches_sizes_and_status_shows_it(make_host, run):  # noqa: F811
    host = make_host("l40s-vfio", "a100-sriov")
    root = ("--sysfs-root", host.paths.root)
    assert sizes_of(run, root) == {A100: None, L40S: "equal"}
    code, out, _ = run(*root, "sriov", "sizes", L40S, "mixed", "--dry-run", conf=L40S_CONF)
    assert (code, out) == (0, f"{L40S}: would switch to mixed sizes\n")
    assert not host.heterogeneous_mode(L40S)
    code, out, _ = run(*root, "sriov", "sizes", L40S, "mixed", conf=L40S_CONF)
    assert (code, out) == (
        0,
        f"{L40S}: switched to mixed sizes (until its VFs are disabled "
        "or enabled again, or the host reboots)\n",
    )
    assert host.heterogeneous_mode(L40S) and sizes_of(run, root)[L40S] == "mixed"
    code, out, _ = run(*root, "sriov", "sizes", L40S, "mixed", conf=L40S_CONF)
    assert (code, out) == (0, f"{L40S}: already mixed sizes, left alone\n")
    # NVIDIA forgets the mode when the VFs go and come back.
    host.set_vfs(L40S, 0)
    assert sizes_of(run, root)[L40S] is None
    host.set_vfs(L40S, 16)
    assert sizes_of(run, root)[L40S] == "equal"


@pytest.mark.parametrize(
    "address, why",
    [
        (A100, "its VFs serve no vendor-VFIO vGPUs"),
        ("0000:c1:00.4", "it is not an SR-IOV physical function"),
        ("c1:00.0", "not a PCI address"),
        (L40S, "VFs 0000:c1:00.4 hold vGPUs; the mode changes only on a board without any"),
    ],
)
def test_sizes_refusals_change_nothing(make_host, run, address, why):  # noqa: F811
    host = make_host("l40s-vfio", "a100-sriov")
    host.set_vendor_vgpu_type("0000:c1:00.4", 1156)
    code, out, err = run(
        "--sysfs-root", host.paths.root, "sriov", "sizes", address, "mixed", conf=L40S_CONF
    )
    assert (code, out) == (base.EXIT_ERROR, ""), err
    assert why in err and err.startswith("error: Refusing to switch the vGPU sizes of "), err
    assert not host.heterogeneous_mode(L40S)


def test_status_says_when_nvml_cannot_tell(make_host, run, monkeypatch):  # noqa: F811
    """A host without NVIDIA's library: the mode is unknown, and why."""
    host = make_host("l40s-vfio")
    monkeypatch.setattr(type(host), "nvml_bindings", None)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    code, out, err = run(
        "--sysfs-root", host.paths.root, "sriov", "status", "-f", "json", conf=L40S_CONF
    )
    assert code == 0 and json.loads(out)[0]["vgpu_sizes"] == "unknown"
    assert err == (
        f"warning: cannot read the vGPU size mode of {L40S}: NVIDIA's management "
        "library (NVML) cannot be used: nvidia-ml-py is not installed (pip install "
        "'vgpu-driver[nvml]').\n"
    )


MIXED_CONF = "[devices]\nenabled_mdev_types = nvidia-1155, nvidia-1157\n" + "".join(
    f"[mdev_{t}]\ndevice_addresses = {L40S}\n" for t in ("nvidia-1155", "nvidia-1157")
)


def test_enable_switches_a_board_configured_for_mixed_sizes(
    make_host,
    run,  # noqa: F811
    sriov_manage,
):
    host = make_host("l40s-vfio")
    root = ("--sysfs-root", host.paths.root)
    host.set_vfs(L40S, 0)
    conf = MIXED_CONF + sriov_manage(host.paths.root)
    code, out, _ = run(*root, "config", "check", conf=conf)
    assert (code, out.splitlines()) == (
        base.EXIT_PROBLEMS,
        [
            f"error: [mdev_nvidia-1157] device_addresses = '{L40S}': GPU {L40S} gets no "
            f"provider: SR-IOV is off: run vgpu-manage sriov enable {L40S}"
        ],
    )
    code, out, _ = run(*root, "sriov", "enable", L40S, "--dry-run", conf=conf)
    assert (code, out.splitlines()[1:]) == (
        0,
        [f"{L40S}: would switch to mixed sizes (configured for nvidia-1155, nvidia-1157)"],
    )
    code, out, err = run(*root, "sriov", "enable", L40S, "--wait", "10", conf=conf)
    assert code == 0, err
    assert out.splitlines()[-1] == (
        f"{L40S}: switched to mixed sizes (configured for nvidia-1155, nvidia-1157)"
    )
    assert host.heterogeneous_mode(L40S)
    code, out, _ = run(*root, "inventory", "-f", "json", conf=conf)
    [row] = json.loads(out)
    assert (row["type"], row["resource_class"], row["total"], row["max_unit"]) == (
        "nvidia-1155 (4096 MiB), nvidia-1157 (12288 MiB)",
        "CUSTOM_VGPU_FRAMEBUFFER_MIB",
        49152,
        49152,
    )
    code, out, _ = run(*root, "config", "check", conf=conf)
    assert code == 0 and out.startswith("ok: ")


def test_status_maps_where_each_vgpu_of_a_mixed_board_sits(make_host, run):  # noqa: F811
    """Two 4 GB and one 12 GB vGPU, placed by the board at the lowest IDs
    NVIDIA's table allows: the map shows each, the slots no configured size
    can use (4-7: neither 4 GB nor 12 GB may start there), and the free half."""
    host = make_host("l40s-vfio")
    host.set_mixed_sizes(L40S, True)
    for vf, number in (("0000:c1:00.4", 1155), ("0000:c1:00.5", 1157), ("0000:c1:00.6", 1155)):
        host.set_vendor_vgpu_type(vf, number)
    root = ("--sysfs-root", host.paths.root)
    code, out, err = run(
        *root, "status", "-f", "json", "-c", "gpu", "-c", "framebuffer", conf=MIXED_CONF
    )
    assert code == 0, err
    [row] = json.loads(out)
    assert row["framebuffer"] == {
        "slots": "aaaa----bbbbcccccccccccc" + "." * 24,
        "slot_mib": 1024,
        "unlocated": 0,
        "vgpus": [
            {"mark": "a", "type": "nvidia-1155", "placement": 0, "mib": 4096},
            {"mark": "b", "type": "nvidia-1155", "placement": 8, "mib": 4096},
            {"mark": "c", "type": "nvidia-1157", "placement": 12, "mib": 12288},
        ],
    }
    code, out, _ = run(*root, "status", "-c", "gpu", "-c", "framebuffer", conf=MIXED_CONF)
    assert code == 0
    assert "| aaaa----bbbbcccccccccccc........................ |" in out
    assert "| a=nvidia-1155@0 b=nvidia-1155@8 c=nvidia-1157@12 |" in out
    # Blocks on a narrow screen: the same lines, labelled.
    code, out, _ = run(
        *root, "status", "-c", "gpu", "-c", "framebuffer", "--max-width", "64", conf=MIXED_CONF
    )
    assert "    map       aaaa----bbbbcccccccccccc........................" in out.splitlines()


def test_status_map_marks_what_nvml_does_not_place(make_host, run):  # noqa: F811
    """A driver without the VFs' placement_id files leaves NVML to place
    them, and NVML lists only *active* vGPU instances (guests running): a
    typed VF it does not list is counted, and the slots neither free nor
    placed are not guessed at."""
    host = make_host("l40s-vfio")
    host.set_mixed_sizes(L40S, True)
    host.set_vendor_vgpu_type("0000:c1:00.4", 1157)
    host.set_vendor_vgpu_type("0000:c1:00.5", 1155)  # at 12; nothing may start at 16
    for vf in ("0000:c1:00.4", "0000:c1:00.5"):
        os.unlink(os.path.join(host.paths.pci_device(vf), "nvidia", "placement_id"))
    host.hold("0000:c1:00.4")  # its guest runs; the other's does not
    code, out, err = run("--sysfs-root", host.paths.root, "status", "-f", "json", conf=MIXED_CONF)
    assert code == 0, err
    board = json.loads(out)[0]["framebuffer"]
    assert (board["slots"], board["unlocated"]) == ("a" * 12 + "?" * 8 + "." * 28, 1)


A100_MIXED_CONF = "[devices]\nenabled_mdev_types = nvidia-471, nvidia-472\n" + "".join(
    f"[mdev_{t}]\ndevice_addresses = {A100}\n" for t in ("nvidia-471", "nvidia-472")
)


def test_an_a100_is_enabled_switched_to_mixed_sizes_and_serves_them(make_host, run, sriov_manage):  # noqa: F811
    """An Ampere board under vendor VFIO, as an operator brings it up: VFs
    on, the mode switched, then 10 GB and 20 GB vGPUs side by side at the
    placements of NVIDIA's 40 GB table."""
    host = make_host("a100-vfio")
    root = ("--sysfs-root", host.paths.root)
    conf = A100_MIXED_CONF + sriov_manage(host.paths.root)
    code, out, err = run(*root, "sriov", "enable", A100, "--wait", "10", conf=conf)
    assert code == 0, err
    assert out.splitlines()[-1] == (
        f"{A100}: switched to mixed sizes (configured for nvidia-471, nvidia-472)"
    )
    code, out, _ = run(*root, "sriov", "status", "-f", "json", "-c", "vgpu_sizes", conf=conf)
    assert json.loads(out) == [{"vgpu_sizes": "mixed"}]
    code, out, _ = run(*root, "inventory", "-f", "json", conf=conf)
    [row] = json.loads(out)
    assert (row["type"], row["total"], row["max_unit"]) == (
        "nvidia-471 (10240 MiB), nvidia-472 (20480 MiB)",
        40960,
        40960,
    )
    code, out, _ = run(*root, "config", "check", conf=conf)
    assert code == 0 and out.startswith("ok: "), out
    host.set_vendor_vgpu_type("0000:41:00.4", 471)  # 10 GB at 0
    host.set_vendor_vgpu_type("0000:41:00.5", 472)  # 20 GB at 20
    host.set_vendor_vgpu_type("0000:41:00.6", 471)  # 10 GB at 10
    code, out, err = run(*root, "status", "-f", "json", "-c", "framebuffer", conf=conf)
    assert code == 0, err
    board = json.loads(out)[0]["framebuffer"]
    assert board["slots"] == "a" * 10 + "b" * 10 + "c" * 20
    assert [(v["type"], v["placement"]) for v in board["vgpus"]] == [
        ("nvidia-471", 0),
        ("nvidia-471", 10),
        ("nvidia-472", 20),
    ]
    # Full: no VF lists a type now, and the board still serves both.
    code, out, _ = run(*root, "config", "check", "--strict", conf=conf)
    assert code == 0 and out.startswith("ok: "), out


def test_status_map_of_a_board_changing_or_unreadable_meanwhile(
    make_host,
    run,  # noqa: F811
    monkeypatch,
):
    """The map is read after the inventory: a vGPU typed in between is drawn
    where NVML puts it (a driver without placement_id files, guests
    running), never double-counted; an NVML that then refuses leaves the
    map unknown, with why, and status still exits 0."""
    host = make_host("l40s-vfio")
    host.set_mixed_sizes(L40S, True)

    def type_without_placement_file(vf, number):
        host.set_vendor_vgpu_type(vf, number)
        host.hold(vf)
        os.unlink(os.path.join(host.paths.pci_device(vf), "nvidia", "placement_id"))

    type_without_placement_file("0000:c1:00.4", 1157)
    bindings = type(host.nvml_bindings)
    listed = bindings.nvmlDeviceGetActiveVgpus

    def typed_meanwhile(self, handle):
        if not host.placement_of("0000:c1:00.5"):
            type_without_placement_file("0000:c1:00.5", 1155)
        return listed(self, handle)

    monkeypatch.setattr(bindings, "nvmlDeviceGetActiveVgpus", typed_meanwhile)
    root = ("--sysfs-root", host.paths.root)
    code, out, err = run(*root, "status", "-f", "json", conf=MIXED_CONF)
    assert code == 0, err
    board = json.loads(out)[0]["framebuffer"]
    assert (board["slots"][:16], board["unlocated"]) == ("a" * 12 + "b" * 4, 0)

    def refused(self, handle):
        raise bindings.NVMLError(3)  # NVML_ERROR_NOT_SUPPORTED

    monkeypatch.setattr(bindings, "nvmlDeviceGetActiveVgpus", refused)
    code, out, err = run(*root, "status", "-f", "json", conf=MIXED_CONF)
    assert code == 0, err
    assert json.loads(out)[0]["framebuffer"]["error"].startswith(
        f"Cannot locate the vGPUs in mixed-size mode on GPU {L40S}"
    )
    code, out, _ = run(*root, "status", "-c", "gpu", "-c", "framebuffer", conf=MIXED_CONF)
    assert code == 0 and "| unknown: Cannot locate the vGPUs in" in out


def test_config_check_names_a_mixed_board_in_equal_size_mode(make_host, run):  # noqa: F811
    host = make_host("l40s-vfio")
    code, out, _ = run("--sysfs-root", host.paths.root, "config", "check", conf=MIXED_CONF)
    assert (code, out.splitlines()) == (
        base.EXIT_PROBLEMS,
        [
            f"error: device_addresses = '{L40S}': configured for mixed sizes (nvidia-1155, "
            f"nvidia-1157) but in equal-size mode, so it gets no provider: run vgpu-manage "
            f"sriov sizes {L40S} mixed"
        ],
    )


def test_enable_refuses_to_switch_a_board_someone_gave_a_vgpu_and_changes_nothing(make_host, run):  # noqa: F811
    """The VFs are on, the mode off, and a VF was typed meanwhile (by hand,
    or by another tool): NVML refuses the switch, the command says so with
    exit 2, and the VF keeps its type."""
    host = make_host("l40s-vfio")
    host.set_vendor_vgpu_type("0000:c1:00.4", 1157)
    code, out, err = run("--sysfs-root", host.paths.root, "sriov", "enable", L40S, conf=MIXED_CONF)
    assert code == base.EXIT_ERROR
    assert "already enabled (16 of 16 VFs), left alone" in out
    assert err.startswith(
        f"error: Cannot enable mixed-size mode on GPU {L40S}: vGPUs exist on it"
    ), err
    assert not host.heterogeneous_mode(L40S)
    assert host.vendor_vf("0000:c1:00.4").current_type == 1157


def _listing(**addresses):
    """A mixed-size configuration of the L40S: ``{type: address}``."""
    enabled = ", ".join(f"nvidia-{n}" for n in addresses)
    return f"[devices]\nenabled_mdev_types = {enabled}\n" + "".join(
        f"[mdev_nvidia-{n}]\ndevice_addresses = {a}\n" for n, a in addresses.items()
    )


@pytest.mark.parametrize(
    "listing",
    [
        {"1155": "0000:c1:00.4", "1157": "0000:c1:00.5"},  # two of its VFs
        {"1155": L40S, "1157": "0000:c1:00.5"},  # its PF and a VF
        {"1155": "0000:c1:00.7", "1157": "0000:c1:00.7"},  # one VF under both
    ],
    ids=["vfs", "pf-and-vf", "one-vf"],
)
def test_config_check_agrees_with_inventory_however_the_board_is_named(make_host, run, listing):  # noqa: F811
    """The board may be named by its PF or any of its VFs: inventory serves
    it for both sizes, and config check finds nothing wrong."""
    host = make_host("l40s-vfio")
    host.set_mixed_sizes(L40S, True)
    conf = _listing(**listing)
    root = ("--sysfs-root", host.paths.root)
    code, out, _ = run(*root, "inventory", "-f", "json", conf=conf)
    [row] = json.loads(out)
    assert (row["gpu"], row["total"], row["max_unit"]) == (L40S, 49152, 49152)
    code, out, _ = run(*root, "config", "check", "--strict", conf=conf)
    assert (code, out.splitlines()[-1]) == (
        0,
        "ok: 2 enabled type(s), 1 mdev-capable device(s) on this host",
    ), out


@pytest.mark.parametrize(
    "parameter, value",
    [
        ("NVreg_RegistryDwords", "RmPVMRL=0x00010011"),
        ("NVreg_RegistryDwordsPerDevice", f"pci=0000:05:00.0;RmPVMRL=0x01;pci={L40S};RmPVMRL=0x11"),
    ],
)
def test_config_check_warns_of_the_fixed_share_scheduler_on_a_mixed_board(
    make_host,
    run,  # noqa: F811
    parameter,
    value,
):
    host = make_host("l40s-vfio")
    host.set_mixed_sizes(L40S, True)
    root = ("--sysfs-root", host.paths.root)
    code, out, _ = run(*root, "config", "check", conf=MIXED_CONF)
    assert code == 0 and "fixed-share" not in out
    params = os.path.join(host.paths.root, "module", "nvidia", "parameters")
    os.makedirs(params, exist_ok=True)
    with open(os.path.join(params, parameter), "w") as f:
        f.write(f"{value}\n")
    code, out, _ = run(*root, "config", "check", "--strict", conf=MIXED_CONF)
    assert (code, out.splitlines()) == (
        base.EXIT_PROBLEMS,
        [
            f"warning: device_addresses = '{L40S}': configured for mixed sizes (nvidia-1155, "
            "nvidia-1157) but NVIDIA's vGPU manager runs the fixed-share scheduler on it "
            "(RmPVMRL), which NVIDIA does not support in mixed-size mode: use the equal-share "
            "or best-effort scheduler"
        ],
    )


def test_config_check_warns_of_types_no_board_can_hold_together(make_host, run):  # noqa: F811
    """A 48 GB vGPU takes the whole L40S: no 4 GB vGPU fits beside it."""
    host = make_host("l40s-vfio")
    host.set_mixed_sizes(L40S, True)
    conf = _listing(**{"1155": L40S, "1157": L40S, "1160": L40S})
    code, out, _ = run("--sysfs-root", host.paths.root, "config", "check", "--strict", conf=conf)
    assert (code, out.splitlines()) == (
        base.EXIT_PROBLEMS,
        [
            f"warning: [devices] enabled_mdev_types = 'nvidia-{n}, nvidia-1160': nvidia-{n} and "
            "nvidia-1160 cannot share a board: on every board configured for both, each "
            "placement of one overlaps each placement of the other, so a vGPU of either makes "
            "the board refuse the other"
            for n in (1155, 1157)
        ],
    )


POOL_CONF = "[devices]\nenabled_mdev_types = nvidia-1155, nvidia-1156\n{mode}" + "".join(
    f"[mdev_{t}]\ndevice_addresses = {L40S}\n" for t in ("nvidia-1155", "nvidia-1156")
)


@pytest.mark.parametrize(
    "mode, said",
    [
        ("", f"{L40S}: would switch to mixed sizes (configured for nvidia-1155, nvidia-1156)\n"),
        ("shared_board_mode = pool\n", ""),
    ],
)
def test_enable_switches_boards_of_several_types_unless_they_are_pools(make_host, run, mode, said):  # noqa: F811
    host = make_host("l40s-vfio")
    code, out, err = run(
        "--sysfs-root",
        host.paths.root,
        "sriov",
        "enable",
        L40S,
        "--dry-run",
        conf=POOL_CONF.format(mode=mode),
    )
    assert code == 0, err
    assert out == f"{L40S}: would leave: already enabled (16 of 16 VFs), left alone\n{said}"
    assert not host.heterogeneous_mode(L40S)
