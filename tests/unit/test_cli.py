"""vgpu-manage, run in-process with its real argument parsing and formatters."""

import contextlib
import io
import json
import os
import textwrap
import uuid
from importlib import metadata

import pytest

from tests import confs
from vgpu_driver.cmd import base
from vgpu_driver.cmd import manage


@pytest.fixture
def run(tmp_path, fake_kernel_cli):
    def run(*argv, conf=""):
        conf_file = tmp_path / "nova.conf"
        conf_file.write_text(textwrap.dedent(conf))
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = manage.main(
                [
                    "--config-file",
                    str(conf_file),
                    "--nodename",
                    "cn1",
                    "--state-dir",
                    str(tmp_path / "state"),
                    "--libvirt-uri",
                    "test:///default",
                    *argv,
                ]
            )
        return code, out.getvalue(), err.getvalue()

    return run


def test_types_json_has_the_documented_keys(make_host, run):
    host = make_host("a100-sriov")
    code, out, _ = run("--sysfs-root", host.paths.root, "types", "-f", "json")
    rows = json.loads(out)
    assert code == 0 and len(rows) == 16 * 6
    assert set(rows[0]) == {
        "parent",
        "type",
        "name",
        "available_instances",
        "device_api",
        "description",
    }
    assert rows[0] == {
        "parent": "0000:41:00.4",
        "type": "nvidia-468",
        "name": "NVIDIA A100-4C",
        "available_instances": 1,
        "device_api": "vfio-pci",
        "description": "num_heads=1, frl_config=60, framebuffer=4096M, "
        "max_resolution=4096x2160, max_instance=10",
    }


def test_types_of_one_parent_as_csv(make_host, run):
    host = make_host("mtty")
    code, out, _ = run(
        "--sysfs-root",
        host.paths.root,
        "types",
        "--parent",
        "mtty",
        "-f",
        "csv",
        "-c",
        "type",
        "-c",
        "available_instances",
    )
    assert out.splitlines() == ['"type","available_instances"', '"mtty-1",24', '"mtty-2",12']


def test_mdev_list_json(make_host, run):
    host = make_host("a100-sriov")
    uid = str(uuid.uuid4())
    host.create_mdev("0000:41:01.2", "nvidia-470", uid)
    assert run("claims", "init")[0] == 0  # a host with mdevs needs its journal
    code, out, _ = run("--sysfs-root", host.paths.root, "mdev", "list", "-f", "json")
    assert json.loads(out) == [
        {
            "uuid": uid,
            "parent": "0000:41:01.2",
            "gpu": "0000:41:00.0",
            "type": "nvidia-470",
            "instance": None,
            "state": "free",
        }
    ]


def test_inventory_json_of_nova_guide_host(make_host, run):
    host = make_host("m60-multi")
    code, out, _ = run(
        "--sysfs-root", host.paths.root, "inventory", "-f", "json", conf=confs.NOVA_GUIDE_M60
    )
    rows = {r["gpu"]: r for r in json.loads(out)}
    assert code == 0
    assert [rows[g]["total"] for g in sorted(rows)] == [16, 16, 8, 0]
    assert rows["0000:87:00.0"]["provider"] is None
    assert rows["0000:87:00.0"]["reason"].startswith("no provider: ")
    assert rows["0000:86:00.0"] == {
        "provider": "cn1_pci_0000_86_00_0",
        "parent_provider": "cn1",
        "gpu": "0000:86:00.0",
        "type": "nvidia-36",
        "resource_class": "VGPU",
        "total": 8,
        "reserved": 0,
        "max_unit": 8,
        "traits": [
            "CUSTOM_MDEV_NVIDIA_36",
            "CUSTOM_NVIDIA_VGPU_MANAGER_550_127_06",
            "CUSTOM_OWNER_VGPU_DRIVER",
            "CUSTOM_VGPU_GRID_M60_1B",
        ],
        "reason": None,
        "size_classes": [],
    }


def test_inventory_yaml_and_value_formats(make_host, run):
    host = make_host("a100-sriov")
    conf = "[devices]\nenabled_mdev_types = nvidia-468\n"
    _, out, _ = run("--sysfs-root", host.paths.root, "inventory", "-f", "yaml", conf=conf)
    assert "total: 10" in out and "- CUSTOM_VGPU_NVIDIA_A100_4C" in out
    _, out, _ = run(
        "--sysfs-root",
        host.paths.root,
        "inventory",
        "-f",
        "value",
        "-c",
        "provider",
        "-c",
        "total",
        conf=conf,
    )
    assert out.strip() == "cn1_pci_0000_41_00_0 10"


def test_inventory_refuses_an_unsound_config(make_host, run):
    host = make_host("m60-multi")
    code, out, err = run(
        "--sysfs-root",
        host.paths.root,
        "inventory",
        conf="[devices]\nenabled_mdev_types = nvidia-35\n[mdev_nvidia-35]\nmax_instances = 0\n",
    )
    assert code == base.EXIT_ERROR and out == ""
    assert "[mdev_nvidia-35] max_instances = '0'" in err


def test_config_check_sound(make_host, run):
    host = make_host("m60-multi")
    code, out, _ = run(
        "--sysfs-root", host.paths.root, "config", "check", conf=confs.NOVA_GUIDE_M60
    )
    assert code == 0
    assert out == "ok: 2 enabled type(s), 4 mdev-capable device(s) on this host\n"


def test_config_check_lists_each_problem(make_host, run):
    host = make_host("m60-multi")
    code, out, _ = run(
        "--sysfs-root",
        host.paths.root,
        "config",
        "check",
        conf="""
        [devices]
        enabled_mdev_types = nvidia-35, nvidia-36, nvidia-99
        [mdev_nvidia-35]
        device_addresses = 0000:84:00.0, 0000:99:00.0, 0000:86:00
        mdev_class = vgpu
        [mdev_nvidia-36]
        device_addresses = 0000:84:00.0
        """,
    )
    assert code == base.EXIT_PROBLEMS
    assert out.splitlines() == [
        "error: [mdev_nvidia-35] device_addresses = '0000:86:00': not a PCI address "
        "(dddd:bb:ss.f) nor a virtual device (<class>_<device>, e.g. mtty_mtty)",
        "error: [mdev_nvidia-35] mdev_class = 'vgpu': Value 'vgpu' doesn't match regex "
        "'^(VGPU|CUSTOM_[A-Z0-9_]+)$'",
        "error: [devices] enabled_mdev_types = 'nvidia-99': no device on this host "
        "offers this type; did you mean 'nvidia-39'?",
        "error: [mdev_nvidia-35] device_addresses = '0000:99:00.0': no mdev-capable "
        "device at this address on this host",
        # An M60 serves mdevs, one type a board: it mixes no sizes.
        "error: [mdev_nvidia-36] device_addresses = '0000:84:00.0': GPU 0000:84:00.0 gets "
        "no provider: its addresses are listed under several types (nvidia-35, "
        "nvidia-36); a GPU serves one type, unless it is a board serving vendor-VFIO "
        "vGPUs, which mixes sizes, or an NVIDIA GPU in a type pool ([devices] "
        "shared_board_mode = pool): fix device_addresses",
    ]


def test_config_check_names_a_metrics_file_node_exporter_never_reads(make_host, run, tmp_path):
    host = make_host("m60-multi")
    code, out, _ = run(
        "--sysfs-root",
        host.paths.root,
        "config",
        "check",
        conf=confs.NOVA_GUIDE_M60
        + f"""[vgpu]
    metrics_textfile = {tmp_path}/vgpu.txt
    """,
    )
    assert code == base.EXIT_PROBLEMS
    assert out.splitlines() == [
        f"error: [vgpu] metrics_textfile = '{tmp_path}/vgpu.txt': node_exporter's textfile "
        "collector reads only files named *.prom"
    ]


def test_fake_host_profiles_and_create(tmp_path, run):
    code, out, _ = run("fake-host", "profiles", "-f", "value", "-c", "name")
    assert out.split() == [
        "a100-sriov",
        "a100-sriov-off",
        "a100-vfio",
        "h100-datacenter",
        "l40s-vfio",
        "m60-multi",
        "mtty",
        "t4x8",
    ]
    target = tmp_path / "host"
    code, out, _ = run(
        "fake-host", "create", "--profile", "a100-sriov", "--profile", "t4x8", str(target)
    )
    assert code == 0 and "9 device(s), 24 mdev parent(s)" in out
    code, out, _ = run("--sysfs-root", str(target), "types", "-f", "value", "-c", "parent")
    assert len(set(out.split())) == 24
    code, out, _ = run(
        "fake-host", "create", "--profile", "a100-sriov-off", str(tmp_path / "rebooted")
    )
    assert code == 0 and "1 device(s), 0 mdev parent(s)" in out


def test_fake_host_refuses_a_non_empty_dir_and_unknown_profiles(tmp_path, run):
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "file").write_text("")
    code, _, err = run("fake-host", "create", "--profile", "t4x8", str(tmp_path / "busy"))
    assert code == base.EXIT_ERROR and "is not empty" in err
    code, _, err = run("fake-host", "create", "--profile", "h100", str(tmp_path / "new"))
    assert code == base.EXIT_ERROR
    assert "No fake-host profile named 'h100'; known profiles: a100-sriov" in err


def test_orphans_list_and_reclaim(make_host, run):
    host = make_host("t4x8")
    free, stale = str(uuid.uuid4()), str(uuid.uuid4())
    host.create_mdev("0000:18:00.0", "nvidia-231", free)
    host.create_mdev("0000:19:00.0", "nvidia-222", stale)
    run("claims", "init")
    conf = "[devices]\nenabled_mdev_types = nvidia-231\n"
    code, out, _ = run(
        "--sysfs-root",
        host.paths.root,
        "orphans",
        "list",
        "-f",
        "json",
        "-c",
        "uuid",
        "-c",
        "kind",
        conf=conf,
    )
    assert code == 0
    assert sorted(json.loads(out), key=lambda r: r["kind"]) == [
        {"uuid": free, "kind": "free"},
        {"uuid": stale, "kind": "stale-type"},
    ]
    code, out, _ = run(
        "--sysfs-root",
        host.paths.root,
        "orphans",
        "reclaim",
        "--dry-run",
        "-f",
        "value",
        "-c",
        "result",
        conf=conf,
    )
    assert out.split() == ["would-remove", "would-remove"] and len(host.list_mdevs()) == 2
    code, out, _ = run(
        "--sysfs-root", host.paths.root, "orphans", "reclaim", "-f", "json", conf=conf
    )
    assert code == 0 and {r["result"] for r in json.loads(out)} == {"removed"}
    assert host.list_mdevs() == []


def test_orphans_refuse_to_run_blind(make_host, run):
    host = make_host("t4x8")
    code, _, err = run(
        "--sysfs-root",
        host.paths.root,
        "--libvirt-uri",
        "qemu+unix:///system?socket=/nonexistent",
        "orphans",
        "reclaim",
        conf="[devices]\nenabled_mdev_types = nvidia-231\n",
    )
    assert code == base.EXIT_ERROR
    assert "Without it, mdevs used by guests cannot be told from free ones" in err


def test_mdev_list_names_the_guest_using_each_mdev(make_host, run, tmp_path):
    from tests import libvirt_domains

    host = make_host("t4x8")
    used, free = str(uuid.uuid4()), str(uuid.uuid4())
    for mdev in (used, free):
        host.create_mdev("0000:18:00.0", "nvidia-222", mdev)
    run("claims", "init")
    guest_uuid = str(uuid.uuid4())
    uri = libvirt_domains.node_file(
        tmp_path / "node.xml", [libvirt_domains.domain_xml("web-1", [used], guest_uuid)]
    )
    code, out, _ = run(
        "--sysfs-root",
        host.paths.root,
        "--libvirt-uri",
        uri,
        "mdev",
        "list",
        "-f",
        "json",
        "-c",
        "uuid",
        "-c",
        "instance",
        "-c",
        "state",
    )
    assert sorted(json.loads(out), key=lambda r: r["state"]) == [
        {"uuid": free, "instance": None, "state": "free"},
        {"uuid": used, "instance": guest_uuid, "state": "in-use"},
    ]


def test_vendor_vfio_vgpus_in_mdev_list_inventory_and_orphans(make_host, run, tmp_path):
    """A VF set to a type is a vGPU for every command, named by its address."""
    from tests import libvirt_domains

    host = make_host("l40s-vfio")
    used, free = "0000:c1:00.4", "0000:c1:00.5"
    for vf in (used, free):
        host.set_vendor_vgpu_type(vf, 1156)
    run("claims", "init")
    guest_uuid = str(uuid.uuid4())
    uri = libvirt_domains.node_file(
        tmp_path / "node.xml",
        [libvirt_domains.domain_xml("vdi-1", vfs=[used], domain_uuid=guest_uuid)],
    )
    conf = "[devices]\nenabled_mdev_types = nvidia-1156\n[mdev_nvidia-1156]\nmax_instances = 6\n"
    args = ("--sysfs-root", host.paths.root, "--libvirt-uri", uri)
    code, out, _ = run(*args, "mdev", "list", "-f", "json")
    assert code == 0 and json.loads(out) == [
        {
            "uuid": used,
            "parent": used,
            "gpu": "0000:c1:00.0",
            "type": "nvidia-1156",
            "instance": guest_uuid,
            "state": "in-use",
        },
        {
            "uuid": free,
            "parent": free,
            "gpu": "0000:c1:00.0",
            "type": "nvidia-1156",
            "instance": None,
            "state": "free",
        },
    ]
    code, out, _ = run(*args, "inventory", "-f", "json", "-c", "total", "-c", "reserved", conf=conf)
    assert code == 0 and json.loads(out) == [{"total": 6, "reserved": 0}]
    code, out, _ = run(*args, "orphans", "reclaim", "-f", "json", conf=conf)
    assert code == 0 and json.loads(out) == [{"uuid": free, "result": "removed", "reason": ""}]
    assert [str(vf.address) for vf in host.list_vendor_vfio() if vf.current_type] == [used]


def test_a_reader_that_stops_reading_ends_the_command_quietly(make_host, tmp_path):
    """``vgpu-manage types | head -1`` with SIGPIPE ignored (as Python does):
    no traceback and no ``error: Broken pipe``; the exit a shell gives a
    command SIGPIPE ended."""
    host = make_host("t4x8")
    read_end, write_end = os.pipe()
    os.close(read_end)
    err = io.StringIO()
    with (
        os.fdopen(write_end, "w") as closed_pipe,
        contextlib.redirect_stdout(closed_pipe),
        contextlib.redirect_stderr(err),
    ):
        code = manage.main(
            ["--config-file", os.devnull, "--sysfs-root", host.paths.root, "types", "-f", "value"]
        )
        with contextlib.suppress(BrokenPipeError):
            closed_pipe.flush()
    assert code == manage.SIGPIPE_EXIT and err.getvalue() == ""


def test_stderr_carries_no_chatter_and_warnings_share_one_prefix(make_host, run):
    host = make_host("t4x8")
    assert run("--sysfs-root", host.paths.root, "claims", "init")[0] == base.EXIT_OK
    # How this process learns of GPU changes (polling, on a fake host) is
    # nova-compute's concern, not the command's.
    code, _out, err = run("--sysfs-root", host.paths.root, "orphans", "list")
    assert code == base.EXIT_OK and err == ""
    code, _out, err = run(
        "--sysfs-root",
        host.paths.root,
        "inventory",
        conf="[devices]\nenabled_mdev_types = nvidia-222, nvidia-223\n",
    )
    assert code == base.EXIT_OK
    assert err.splitlines() == [
        "warning: [mdev_nvidia-223] device_addresses = []: empty, but type nvidia-222 "
        "already serves every unlisted device; nvidia-223 will not be used (set its "
        "device_addresses)"
    ], err


def test_every_command_summary_is_one_whole_line():
    """``vgpu-manage --help`` shows each command's first docstring line: one
    that wraps is cut mid-sentence there."""
    for entry in metadata.entry_points(group="vgpu_driver.manage"):
        doc = entry.load().__doc__ or ""
        lines = doc.strip().splitlines()
        assert lines and (len(lines) == 1 or not lines[1].strip()), entry.name
        assert len(lines[0]) <= 80, entry.name
