"""An A100 and an L40S right after a reboot, brought back with the real
``vgpu-manage``.

The host is served with FUSE (``fake-host serve``), so every command runs
as its own process.  The VFs come from NVIDIA's ``sriov-manage`` (its
stand-in, ``vgpu-fake-sriov-manage``, writing the served files as the
script writes sysfs), since the fake kernel, as the kernel, refuses
``sriov_numvfs`` while ``nvidia`` holds the PF; the mode switch goes through
the privileged entry point, in-process as root.
"""

import json
import os
import subprocess
import uuid

import pytest

from tests import conftest
from tests import pci_devices
from tests import served_host

A100 = "0000:41:00.0"
L40S = "0000:c1:00.0"
ENABLED = (
    f"{A100}: enabled 16 VFs ({conftest.FAKE_SRIOV_MANAGE} -e {A100}); waiting for their mdev types"
)
CONF = f"[devices]\nenabled_mdev_types = nvidia-468\n[mdev_nvidia-468]\ndevice_addresses = {A100}\n"


# nova's guide configures SR-IOV boards by their VFs' addresses, which do
# not exist while the VFs are off: the PF's sriov_offset and sriov_stride say
# which they will be.
CONF_BY_VFS = CONF.replace(
    f"device_addresses = {A100}", "device_addresses = 0000:41:00.4, 0000:41:00.5"
)


@pytest.fixture(params=[CONF, CONF_BY_VFS], ids=["by-pf", "by-vfs"])
def rebooted(tmp_path, request, sriov_manage):
    with served_host.served(tmp_path, "a100-sriov-off") as host:
        (tmp_path / "nova.conf").write_text(
            request.param + served_host.FAKE_ROOT_CONF + sriov_manage(host.mount)
        )
        yield host


def manage(host, tmp_path, *argv):
    result = subprocess.run(
        [
            served_host.MANAGE,
            "--config-file",
            str(tmp_path / "nova.conf"),
            "--sysfs-root",
            host.mount,
            "--nodename",
            "cn1",
            "--state-dir",
            str(tmp_path / "state"),
            "--libvirt-uri",
            "test:///default",
            *argv,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return result.returncode, result.stdout, result.stderr


def test_acceptance_enable_a_rebooted_a100(rebooted, tmp_path):
    code, out, _ = manage(rebooted, tmp_path, "inventory", "-f", "json")
    [row] = [r for r in json.loads(out) if r["gpu"] == A100]
    assert code == 0 and row["provider"] is None and "sriov enable" in row["reason"]
    code, out, _ = manage(rebooted, tmp_path, "config", "check")
    assert code == 1 and len(out.splitlines()) == 1 and A100 in out
    # What the boot unit runs: the configured boards, found with their VFs off.
    code, out, err = manage(rebooted, tmp_path, "sriov", "enable", "--configured")
    assert code == 0 and "error" not in err and out.startswith(f"{ENABLED}\n")
    code, out, _ = manage(rebooted, tmp_path, "sriov", "status", "-f", "json")
    [status] = json.loads(out)
    assert code == 0 and (status["numvfs"], status["state"]) == (16, "enabled")
    code, out, _ = manage(rebooted, tmp_path, "inventory", "-f", "json")
    [row] = [r for r in json.loads(out) if r["gpu"] == A100]
    assert code == 0 and (row["provider"], row["total"]) == ("cn1_pci_0000_41_00_0", 10)
    assert manage(rebooted, tmp_path, "config", "check")[0] == 0


def _claim_totalvfs(host, count):
    """A physical function whose sriov_totalvfs reads more than the kernel
    then accepts: the kernel's ERANGE is what stops the write."""
    path = os.path.join(host.state, "devices", "pci0000:41", A100, "sriov_totalvfs")
    os.chmod(path, 0o644)
    with open(path, "w") as f:
        f.write(f"{count}\n")


@pytest.mark.parametrize(
    "case, argv, why",
    [
        ("nic", ("sriov", "enable", pci_devices.NIC), "vendor 0x8086 is not NVIDIA"),
        ("unknown", ("sriov", "enable", "0000:41:00.1"), "no PCI device at this address"),
        ("mdev", ("sriov", "disable", A100), "1 VF(s) hold vGPUs"),
        ("erange", ("sriov", "enable", A100), "write error: Numerical result out of range"),
    ],
)
def test_bad_input_exits_2_and_changes_nothing(rebooted, tmp_path, case, argv, why):
    pci_devices.plant_nic(rebooted.state)
    kernel = rebooted.kernel
    if case == "mdev":
        kernel.set_vfs(A100, 16)
        kernel.create_mdev("0000:41:00.4", "nvidia-468", str(uuid.uuid4()))
    if case == "erange":
        _claim_totalvfs(rebooted, 32)
    before = pci_devices.tree_state(rebooted.state)
    code, out, err = manage(rebooted, tmp_path, *argv)
    assert (code, out) == (2, "")
    # Libraries may warn on stderr (eventlet's deprecation); ours is one line.
    [line] = [text for text in err.splitlines() if text.startswith("error: ")]
    assert why in line and "Traceback" not in err
    assert pci_devices.tree_state(rebooted.state) == before


def test_a_missing_script_exits_2_with_one_line_and_changes_nothing(rebooted, tmp_path):
    conf = tmp_path / "nova.conf"
    missing = str(tmp_path / "usr-lib-nvidia" / "sriov-manage")
    conf.write_text(conf.read_text().replace(conftest.FAKE_SRIOV_MANAGE, missing))
    before = pci_devices.tree_state(rebooted.state)
    code, out, err = manage(rebooted, tmp_path, "sriov", "enable", "--configured")
    assert (code, out) == (2, "")
    [line] = [text for text in err.splitlines() if text.startswith("error: ")]
    assert line == (
        f"error: NVIDIA's sriov-manage ({missing} -e {A100}) cannot run: there is "
        "no such file (it comes with NVIDIA's vGPU manager; set [vgpu] "
        "sriov_manage_path where it is installed); nothing was changed"
    ), err
    assert pci_devices.tree_state(rebooted.state) == before


MIXED_L40S = "[devices]\nenabled_mdev_types = nvidia-1155, nvidia-1157\n" + "".join(
    f"[mdev_{t}]\ndevice_addresses = {L40S}\n" for t in ("nvidia-1155", "nvidia-1157")
)


def test_configured_boards_get_their_vfs_then_their_mode(tmp_path, sriov_manage):
    """The boot unit's command on a rebooted A100 and an L40S configured
    for mixed sizes: each through NVIDIA's script, one run per board, and
    the L40S switched to mixed sizes once its VFs are there."""
    with served_host.served(tmp_path, "a100-sriov", "l40s-vfio") as host:
        host.kernel.set_mixed_sizes(L40S, True)
        host.kernel.reboot()
        assert not host.kernel.heterogeneous_mode(L40S)
        (tmp_path / "nova.conf").write_text(
            MIXED_L40S.replace(
                "nvidia-1157\n[mdev_nvidia-1155]", "nvidia-1157, nvidia-468\n[mdev_nvidia-1155]"
            )
            + f"[mdev_nvidia-468]\ndevice_addresses = {A100}\n"
            + served_host.FAKE_ROOT_CONF
            + f"test_only_fake_nvml_host = {host.state}\n"
            + sriov_manage(host.mount)
        )
        code, out, err = manage(host, tmp_path, "sriov", "enable", "--configured")
        assert code == 0, err
        lines = out.splitlines()
        assert lines[:2] == [
            ENABLED,
            (
                f"{L40S}: enabled 16 VFs ({conftest.FAKE_SRIOV_MANAGE} "
                f"-e {L40S}); waiting for their mdev types"
            ),
        ]
        assert lines[2].startswith(f"{A100}: 16 VFs ready")
        assert lines[3].startswith(f"{L40S}: 16 VFs ready")
        assert lines[-1] == (
            f"{L40S}: switched to mixed sizes (configured for nvidia-1155, nvidia-1157)"
        )
        assert host.kernel.heterogeneous_mode(L40S)
        code, out, _ = manage(host, tmp_path, "sriov", "status", "-f", "json")
        assert {
            (r["physical_function"], r["numvfs"], r["state"], r["vgpu_sizes"])
            for r in json.loads(out)
        } == {(A100, 16, "enabled", None), (L40S, 16, "enabled", "mixed")}
        for pf in (A100, L40S):
            assert (
                os.path.basename(os.readlink(f"{host.mount}/bus/pci/devices/{pf}/driver"))
                == "nvidia"
            )
