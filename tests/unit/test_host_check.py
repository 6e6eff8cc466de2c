"""``vgpu-manage host check``, run in-process with its real parsing, on fake
hosts each missing one thing a host needs to offer vGPUs: each is named,
with what to do, and the exit code says whether anything is wrong."""

import ast
import contextlib
import io
import json
import os
import pathlib
import re
import sys
import textwrap
import types

import pytest

from vgpu_driver import host_check_config
from vgpu_driver import host_check_gpus
from vgpu_driver import host_files
from vgpu_driver import host_probe
from vgpu_driver import service_check
from vgpu_driver.cmd import base
from vgpu_driver.cmd import manage
from vgpu_driver.fake import profiles
from vgpu_driver.sysfs import host_reads

H100 = "0000:00:06.0"
T4 = "0000:18:00.0"
BIN_DIR = os.path.dirname(sys.executable)
DATACENTER = (
    "NVIDIA's data-center driver is loaded, not the vGPU manager (0000:00:06.0: "
    "NVML says virtualization mode pass-through, host vGPU mode not supported)"
)


class Checked:
    def __init__(self, code, out, err):
        self.code, self.err = code, err
        self.rows = json.loads(out) if out else []

    def of(self, check):
        return [r for r in self.rows if r["check"] == check]

    def one(self, check):
        [row] = self.of(check)
        return row

    def levels(self):
        return {r["check"]: r["level"] for r in self.rows}


@pytest.fixture
def host_root(tmp_path):
    """Where the sudo rule is installed, and the state directory: root's, 0750."""
    root = tmp_path / "root"
    root.mkdir()
    state = tmp_path / "state"
    state.mkdir(mode=0o750)
    os.chmod(state, 0o750)
    return root


@pytest.fixture
def check(tmp_path, host_root, monkeypatch):
    """Run ``host check -f json`` on ``host`` with nova.conf ``conf`` (its
    [vgpu] options for the fake host added), as nova-compute's user root."""
    for variable in [v for v in os.environ if v.startswith("OS_")]:
        monkeypatch.delenv(variable)

    def run(host, conf="", *options, nvml=True, libvirt="test:///default"):
        conf_file = tmp_path / "nova.conf"
        conf_file.write_text(
            textwrap.dedent(conf)
            + textwrap.dedent(f"""
            [vgpu]
            sysfs_root = {host.paths.root}
            test_only_fake_sysfs_root = true
            state_dir = {tmp_path / "state"}
            """)
            + (f"test_only_fake_nvml_host = {host.paths.root}\n" if nvml else "")
        )
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = manage.main(
                [
                    "--config-file",
                    str(conf_file),
                    "--libvirt-uri",
                    libvirt,
                    "host",
                    "check",
                    "-f",
                    "json",
                    "--user",
                    "root",
                    "--bin-dir",
                    BIN_DIR,
                    "--root",
                    str(host_root),
                    *options,
                ]
            )
        return Checked(code, out.getvalue(), err.getvalue())

    return run


@pytest.fixture
def sudo_rule(tmp_path, host_root):
    """The rule install-units renders for the check's settings, installed,
    and the helper's file it names."""
    settings = host_files.Settings(
        bin_dir=BIN_DIR, user="root", config_files=(str(tmp_path / "nova.conf"),)
    )
    rendered = {f.path: f for f in host_files.render(settings)}
    for name in (host_files.PRIVSEP_CONF, host_files.SUDOERS):
        target = host_root / name
        target.parent.mkdir(parents=True)
        target.write_text(rendered[name].text)
        os.chmod(target, rendered[name].mode)
    path = host_root / host_files.SUDOERS
    return path


T4_CONF = """
    [devices]
    enabled_mdev_types = nvidia-222
    """


def test_a_healthy_host_is_all_ok_but_placement_unchecked(make_host, check, sudo_rule):
    checked = check(make_host("t4x8"), T4_CONF)
    assert checked.code == base.EXIT_OK, checked.rows
    assert set(checked.levels()) == {
        "gpu",
        "vgpu-manager",
        "iommu",
        "vfio",
        "sriov-manage",
        "configured-boards",
        "libvirt",
        "sudo-rule",
        "helper-conf",
        "state-dir",
        "placement",
    }
    assert {r["level"] for r in checked.rows if r["check"] != "placement"} == {"ok"}
    assert checked.one("placement")["level"] == "warning"
    assert len(checked.of("gpu")) == 8
    assert checked.of("gpu")[0]["message"] == f"{T4}: Tesla T4 (10de:1eb8), driver nvidia"
    assert checked.of("vgpu-manager")[0]["message"] == (
        f"{T4}: NVIDIA's vGPU manager 550.127.06 drives it (host vGPU mode non-SR-IOV)"
    )
    assert set(checked.rows[0]) == {"check", "level", "message", "fix"}


def test_the_data_center_driver_is_named_not_an_empty_host(make_host, check, sudo_rule):
    checked = check(
        make_host("h100-datacenter"),
        """
        [devices]
        enabled_mdev_types = nvidia-1155
        [mdev_nvidia-1155]
        device_addresses = 0000:00:06.0
        """,
    )
    assert checked.code == base.EXIT_PROBLEMS
    assert checked.one("gpu") == {
        "check": "gpu",
        "level": "ok",
        "fix": "",
        "message": f"{H100}: NVIDIA H100 80GB HBM3 (10de:2330), driver nvidia",
    }
    assert checked.one("vgpu-manager") == {
        "check": "vgpu-manager",
        "level": "error",
        "message": DATACENTER,
        "fix": "install NVIDIA's vGPU manager (host driver)",
    }
    assert checked.one("iommu")["level"] == "error"
    assert checked.one("vfio")["message"].startswith("the kernel has no mdev bus")
    assert checked.one("configured-boards") == {
        "check": "configured-boards",
        "level": "error",
        "message": f"[mdev_nvidia-1155] device_addresses {H100}: the device is there "
        "(driver nvidia) but offers no vGPU",
        "fix": "see this check's vgpu-manager, iommu and vfio lines",
    }


@pytest.mark.parametrize(
    "missing, expected",
    [
        (None, "nvidia-ml-py is not installed"),
        ("library", "NVML"),
    ],
)
def test_without_nvml_sysfs_still_tells(
    make_host, check, sudo_rule, monkeypatch, missing, expected
):
    """pynvml absent, or present without NVIDIA's library: a warning, and
    the vGPU manager is told by the types its GPUs offer."""
    if missing is None:
        monkeypatch.setitem(sys.modules, "pynvml", None)
    checked = check(make_host("t4x8"), T4_CONF, nvml=False)
    assert checked.code == base.EXIT_OK
    nvml_row = checked.one("nvml")
    assert nvml_row["level"] == "warning" and expected in nvml_row["message"]
    assert checked.one("vgpu-manager")["message"] == (
        "NVIDIA's vGPU manager 550.127.06 is loaded (its GPUs offer vGPU types)"
    )
    datacenter = check(make_host("h100-datacenter"), T4_CONF, nvml=False)
    assert datacenter.one("vgpu-manager")["level"] == "error"
    assert (
        "NVML cannot tell whether it is the vGPU manager"
        in datacenter.one("vgpu-manager")["message"]
    )


@pytest.mark.parametrize(
    "driver, message, fix",
    [
        (None, "driver none: no driver is bound to it", "modprobe nvidia"),
        ("vfio-pci", "bound to vfio-pci, not to NVIDIA's driver", "driverctl unset-override"),
    ],
)
def test_a_gpu_without_nvidias_driver(make_host, check, sudo_rule, driver, message, fix):
    host = make_host("t4x8")
    link = host.paths.pci_driver(T4)
    os.unlink(link)  # what the kernel's unbind leaves (drivers/base/dd.c)
    if driver:
        os.makedirs(host.paths.join("bus", "pci", "drivers", driver))
        os.symlink(f"../../../bus/pci/drivers/{driver}", link)
    checked = check(host, T4_CONF)
    assert checked.code == base.EXIT_PROBLEMS
    [row] = [r for r in checked.of("gpu") if r["level"] != "ok"]
    assert (
        row["level"] == "error"
        and row["message"].startswith(T4)
        and message in row["message"]
        and fix in row["fix"]
    )


def test_the_iommu_off_and_a_gpu_outside_any_group(make_host, check, sudo_rule):
    checked = check(make_host({**profiles.load("t4x8"), "iommu": False}), T4_CONF)
    assert checked.code == base.EXIT_PROBLEMS
    assert checked.one("iommu") == {
        "check": "iommu",
        "level": "error",
        "message": "the IOMMU is off (kernel/iommu_groups is empty)",
        "fix": "turn the IOMMU on: VT-d (Intel) or AMD-Vi in the firmware, and "
        "intel_iommu=on on an Intel host's kernel command line; then reboot",
    }
    host = make_host("t4x8")
    os.unlink(os.path.join(host.paths.pci_device(T4), "iommu_group"))
    assert check(host, T4_CONF).one("iommu")["message"] == f"GPU(s) {T4} in no IOMMU group"


def test_vfio_by_mdev_by_vendor_files_or_neither(make_host, check, sudo_rule):
    no_mdev = {**profiles.load("l40s-vfio"), "mdev": False}
    checked = check(
        make_host(no_mdev),
        """
        [devices]
        enabled_mdev_types = nvidia-1156
        """,
    )
    assert checked.one("vfio")["level"] == "ok"
    assert "vendor-specific VFIO" in checked.one("vfio")["message"]
    off = check(make_host({**profiles.load("a100-sriov-off"), "mdev": False}))
    assert off.one("vfio")["level"] == "warning"
    assert off.one("vfio")["fix"] == "vgpu-manage sriov enable --configured, then check again"
    loaded = {**profiles.load("h100-datacenter"), "mdev": True}
    assert (
        check(make_host(loaded))
        .one("vfio")["message"]
        .startswith("the mdev bus is loaded (bus/mdev) but no driver registered a parent")
    )


def test_sriov_manage_for_sriov_boards(make_host, check, sudo_rule, tmp_path):
    checked = check(
        make_host("a100-sriov"),
        """
        [devices]
        enabled_mdev_types = nvidia-468
        """,
    )
    assert checked.code == base.EXIT_PROBLEMS
    assert checked.one("sriov-manage") == {
        "check": "sriov-manage",
        "level": "error",
        "message": "/usr/lib/nvidia/sriov-manage is missing; SR-IOV board(s) 0000:41:00.0 "
        "need it to enable their VFs",
        "fix": "install NVIDIA's vGPU manager (it ships sriov-manage), or set "
        "[vgpu] sriov_manage_path to where it is",
    }
    assert check(make_host("t4x8"), T4_CONF).one("sriov-manage")["level"] == "ok"


def test_the_pure_check_of_sriov_manage_reads_the_file(make_host, tmp_path):
    host = make_host("a100-sriov")
    script = tmp_path / "sriov-manage"
    script.write_text("#!/bin/sh\n")
    facts = _facts(host_reads.nvidia_gpus(host.paths), host_probe._executable(str(script)))
    assert host_check_gpus.check_sriov_manage(facts)[0].message == (
        f"{script} is not executable; SR-IOV board(s) 0000:41:00.0 need it to enable their VFs"
    )
    os.chmod(script, 0o755)
    facts = _facts(host_reads.nvidia_gpus(host.paths), host_probe._executable(str(script)))
    assert host_check_gpus.check_sriov_manage(facts)[0].level == "ok"


def _facts(gpus, sriov_manage):
    """The facts check_sriov_manage reads, and nothing else."""
    return types.SimpleNamespace(gpus=gpus, sriov_manage=sriov_manage)


def test_configured_boards_absent_or_offering_nothing(make_host, check, sudo_rule):
    checked = check(
        make_host("t4x8"),
        """
        [devices]
        enabled_mdev_types = nvidia-222, nvidia-1155
        [mdev_nvidia-222]
        device_addresses = 0000:18:00.0, 0000:99:00.0
        [mdev_nvidia-1155]
        device_ids = 10de:2330
        """,
    )
    rows = checked.of("configured-boards")
    assert [(r["level"], r["message"]) for r in rows] == [
        ("ok", f"[mdev_nvidia-222] device_addresses {T4}: found (GPU {T4})"),
        ("error", "[mdev_nvidia-222] device_addresses 0000:99:00.0: no PCI device at this address"),
        (
            "ok",
            "[mdev_nvidia-1155] device_ids 10de:2330: no GPU of this model here (a fleet "
            "option: other hosts may have one)",
        ),
    ]
    assert checked.code == base.EXIT_PROBLEMS
    h100 = check(
        make_host("h100-datacenter"),
        """
        [devices]
        enabled_mdev_types = nvidia-1155
        [mdev_nvidia-1155]
        device_ids = 10de:2330
        """,
    )
    assert h100.one("configured-boards")["message"] == (
        f"[mdev_nvidia-1155] device_ids 10de:2330: GPU(s) {H100} are there but offer no vGPU"
    )
    assert check(make_host("t4x8")).one("configured-boards")["message"] == "no vGPU type is enabled"


def test_libvirt_unreachable(make_host, check, sudo_rule, tmp_path):
    uri = f"test://{tmp_path}/no-such-host.xml"
    checked = check(make_host("t4x8"), T4_CONF, libvirt=uri)
    row = checked.one("libvirt")
    assert checked.code == base.EXIT_PROBLEMS and row["level"] == "error"
    assert row["message"].startswith(f"cannot reach libvirt at {uri}: ")
    assert "[vgpu] libvirt_uri" in row["fix"]


def test_the_sudo_rule_missing_different_or_loose(make_host, check, sudo_rule):
    host = make_host("t4x8")
    path = str(sudo_rule)
    os.chmod(path, 0o644)
    assert (
        check(host, T4_CONF).one("sudo-rule")["fix"] == f"chown root:root {path}; chmod 0440 {path}"
    )
    os.chmod(path, 0o640)
    text = sudo_rule.read_text()
    sudo_rule.write_text(text.replace("privsep_sock_path /tmp", "privsep_sock_path /var/tmp"))
    os.chmod(path, 0o440)
    row = check(host, T4_CONF).one("sudo-rule")
    assert row["level"] == "error" and row["message"].startswith(
        f"{path} differs from what install-units renders for user root, "
        f"{BIN_DIR}/vgpu-privsep-helper, "
    )
    sudo_rule.unlink()
    row = check(host, T4_CONF).one("sudo-rule")
    assert (
        row["message"] == f"{path} is missing, so nova-compute cannot start its privileged helpers"
    )
    assert row["fix"] == "vgpu-manage --config-file <nova-compute's files> install-units"
    row = check(
        host,
        textwrap.dedent(T4_CONF)
        + textwrap.dedent("""
        [vgpu_driver_sysfs_writer]
        helper_command = /usr/local/bin/start-helper
        [vgpu_driver_gpu_admin]
        helper_command = /usr/local/bin/start-helper
        """),
    ).one("sudo-rule")
    assert row["level"] == "ok" and row["message"].startswith("not used")


def test_the_helpers_file_missing_different_or_changeable(make_host, check, sudo_rule, host_root):
    """The sudo rule starts the helper with privsep.conf, which it refuses
    unless only root can change it."""
    host = make_host("t4x8")
    path = host_root / host_files.PRIVSEP_CONF
    assert check(host, T4_CONF).one("helper-conf")["level"] == "ok"
    os.chmod(path.parent, 0o775)
    row = check(host, T4_CONF).one("helper-conf")
    assert (row["level"], row["message"]) == (
        "error",
        f"the privileged helper refuses {path}: {path.parent} (owner root, mode "
        "0775) can be changed by another user than root",
    )
    os.chmod(path.parent, 0o755)
    path.write_text(path.read_text().replace("config_files", "config_file"))
    row = check(host, T4_CONF).one("helper-conf")
    assert row["level"] == "error" and row["message"].startswith(
        f"{path} differs from what install-units renders for "
    )
    path.unlink()
    checked = check(host, T4_CONF)
    assert checked.code == base.EXIT_PROBLEMS
    assert (
        checked.one("helper-conf")["message"]
        == f"{path} is missing, so the privileged helper cannot start"
    )


def test_an_unreadable_file_is_refused_only_where_its_reader_would(
    make_host, check, sudo_rule, host_root
):
    """A file that cannot be read (not UTF-8 here): the helper refuses its
    file by who may change it, which needs no read, so that comes first;
    the sudo rule's mode is only told once it is read."""
    host = make_host("t4x8")
    conf = host_root / host_files.PRIVSEP_CONF
    conf.write_bytes(b"\xff\xfe")
    os.chmod(conf, 0o666)
    sudo_rule.write_bytes(b"\xff\xfe")
    os.chmod(sudo_rule, 0o644)
    checked = check(host, T4_CONF)
    row = checked.one("helper-conf")
    assert (row["level"], row["message"]) == (
        "error",
        f"the privileged helper refuses {conf}: {conf} (owner root, mode 0666) can "
        "be changed by another user than root",
    )
    row = checked.one("sudo-rule")
    assert row["level"] == "warning" and row["message"].startswith(f"{sudo_rule} cannot be read (")
    assert row["fix"] == "run host check as root"


def test_the_state_directory(make_host, check, sudo_rule, tmp_path):
    host = make_host("t4x8")
    state = tmp_path / "state"
    os.chmod(state, 0o755)
    row = check(host, T4_CONF).one("state-dir")
    assert (row["level"], row["fix"]) == ("warning", f"chmod 0750 {state}")
    os.chmod(state, 0o777)
    assert check(host, T4_CONF).one("state-dir")["level"] == "error"
    os.chmod(state, 0o750)
    row = check(host, T4_CONF, "--user", "nobody").one("state-dir")
    assert row["message"] == f"{state} is owned by uid 0, not by nobody"
    assert row["fix"] == f"chown nobody:nobody {state}"
    os.rmdir(state)
    row = check(host, T4_CONF).one("state-dir")
    assert row["message"] == f"[vgpu] state_dir {state} does not exist"
    assert row["fix"] == f"install -d -o root -g root -m 0750 {state}"
    assert (
        check(host, T4_CONF, "--user", "no-such-user").one("state-dir")["message"]
        == "no user no-such-user on this host"
    )


def test_placement_unreachable(make_host, check, sudo_rule, monkeypatch):
    monkeypatch.setenv("OS_AUTH_TYPE", "admin_token")
    monkeypatch.setenv("OS_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OS_TOKEN", "admin")
    row = check(make_host("t4x8"), T4_CONF).one("placement")
    assert row["level"] == "error" and row["message"].startswith("Placement does not answer")


def test_it_writes_nothing(make_host, check, tmp_path):
    host = make_host("a100-sriov")
    state = tmp_path / "state"

    def listing():
        found = {}
        for where in (host.paths.root, str(state), str(tmp_path / "root")):
            for directory, dirs, files in os.walk(where):
                for name in dirs + files:
                    path = os.path.join(directory, name)
                    found[path] = os.lstat(path).st_mtime_ns
        return found

    before = listing()
    check(host, "[devices]\nenabled_mdev_types = nvidia-468\n")
    assert listing() == before


def test_a_host_it_cannot_read_is_one_error_line(check, tmp_path):
    gone = types.SimpleNamespace(paths=types.SimpleNamespace(root=str(tmp_path / "no-sysfs")))
    checked = check(gone)
    assert checked.code == base.EXIT_ERROR and checked.rows == []
    assert checked.err.startswith("error: Sysfs root ") and checked.err.count("\n") == 1


def test_the_listings_of_an_h100_host_point_to_host_check(make_host, tmp_path):
    """inventory and status print no GPU there, and config check found no
    mdev-capable device: each now says which device is there and where to
    look."""
    conf_file = tmp_path / "nova.conf"

    def run(host, *argv):
        conf_file.write_text(
            textwrap.dedent(f"""
            [devices]
            enabled_mdev_types = nvidia-1155
            [mdev_nvidia-1155]
            device_addresses = 0000:00:06.0
            [vgpu]
            sysfs_root = {host.paths.root}
            state_dir = {tmp_path / "state"}
            """)
        )
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = manage.main(
                ["--config-file", str(conf_file), "--libvirt-uri", "test:///default", *argv]
            )
        return code, out.getvalue(), err.getvalue()

    h100 = make_host("h100-datacenter")
    warning = (
        f"warning: 1 NVIDIA GPU(s) on this host, none offering a vGPU type: {H100} "
        "(driver nvidia); 'vgpu-manage host check' says why\n"
    )
    for command in (("inventory",), ("status",)):
        code, _out, err = run(h100, *command)
        assert code == base.EXIT_OK and err == warning, command
    code, out, _ = run(h100, "config", "check")
    assert code == base.EXIT_PROBLEMS
    assert (
        f"error: [mdev_nvidia-1155] device_addresses = '{H100}': no mdev-capable device "
        "at this address on this host (the device there is bound to nvidia and offers no "
        "vGPU; 'vgpu-manage host check' says why)\n"
    ) in out
    for command in (("inventory",), ("status",)):
        assert "host check" not in run(make_host("t4x8"), *command)[2]


def test_the_troubleshooting_page_explains_every_line():
    """Each finding's fixed text is on the page, so a new or reworded line
    fails here until the page says what it means and what to do."""
    page = " ".join(
        pathlib.Path(__file__)
        .parents[2]
        .joinpath("doc", "source", "admin", "troubleshooting.rst")
        .read_text()
        .replace("``", "")
        .split()
    )
    missing = []
    for module in (host_check_gpus, host_check_config, service_check):
        for node in ast.walk(ast.parse(pathlib.Path(module.__file__).read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "Finding"
                and len(node.args) >= 3
            ):
                for part in ast.walk(node.args[2]):
                    if isinstance(part, ast.Constant) and isinstance(part.value, str):
                        for text in re.split(r"[{}]", part.value):
                            text = " ".join(text.split())
                            if len(text) >= 12 and text not in page:
                                missing.append(text)
    assert not missing


def test_a_configuration_error_is_a_line_of_its_own(make_host, check, sudo_rule):
    checked = check(
        make_host("t4x8"),
        """
        [devices]
        enabled_mdev_types = nvidia-222
        [mdev_nvidia-222]
        device_addresses = 18:00.0
        """,
    )
    assert checked.code == base.EXIT_PROBLEMS
    first = checked.of("configured-boards")[0]
    assert first["level"] == "error" and first["message"].startswith(
        "[mdev_nvidia-222] device_addresses = '18:00.0': not a PCI address"
    )
    assert first["fix"].startswith("vgpu-manage config check")


def test_a_host_of_emulated_parents_has_no_nvidia_gpu_to_check(make_host, check, sudo_rule):
    checked = check(make_host("mtty"), "[devices]\nenabled_mdev_types = mtty-1\n")
    assert checked.code == base.EXIT_OK, checked.rows
    assert (
        checked.one("gpu")["message"]
        == "no NVIDIA GPU on this host; 1 other mdev parent(s) offer types"
    )
    assert checked.one("gpu")["level"] == "warning"
    assert not checked.of("iommu") and not checked.of("vgpu-manager")
