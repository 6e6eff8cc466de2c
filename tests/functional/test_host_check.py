"""``vgpu-manage host check`` as an operator runs it: its own process, on a
FUSE-served fake host, with the sudo rule ``install-units`` wrote, libvirt's
test driver and a real Placement; its JSON parsed and its exit code read."""

import json
import os
import subprocess
import sys

import pytest

from tests import served_host
from vgpu_driver.placement_service import EmbeddedPlacement

MANAGE = served_host.MANAGE
BIN_DIR = os.path.dirname(sys.executable)


@pytest.fixture
def compute_host(tmp_path):
    """nova.conf, the sudo rule install-units wrote for it under a root of
    its own, and a state directory as production.rst makes it (root being
    nova-compute's user here)."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    # install-units takes --user from the passwd of the tree it installs in.
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    state = tmp_path / "vgpu-state"
    state.mkdir()
    os.chmod(state, 0o750)
    conf = tmp_path / "nova.conf"

    def write(served, text):
        conf.write_text(
            f"{text}\n[vgpu]\nsysfs_root = {served.mount}\n"
            f"test_only_fake_sysfs_root = true\n"
            f"test_only_fake_nvml_host = {served.state}\n"
            f"libvirt_uri = test:///default\nstate_dir = {state}\n"
        )
        installed = subprocess.run(
            [
                MANAGE,
                "--config-file",
                str(conf),
                "install-units",
                "--root",
                str(root),
                "--user",
                "root",
                "--bin-dir",
                BIN_DIR,
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert installed.returncode == 0, installed.stderr
        return conf, root

    return write


def host_check(conf, root, env=None):
    done = subprocess.run(
        [
            MANAGE,
            "--config-file",
            str(conf),
            "host",
            "check",
            "-f",
            "json",
            "--user",
            "root",
            "--bin-dir",
            BIN_DIR,
            "--root",
            str(root),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("OS_")}, **(env or {})},
    )
    return done.returncode, json.loads(done.stdout) if done.stdout else [], done.stderr


def levels(rows):
    found = {}
    for row in rows:
        found.setdefault(row["check"], set()).add(row["level"])
    return found


def test_a_healthy_t4_host_is_all_ok(tmp_path, compute_host):
    with served_host.served(tmp_path, "t4x8") as served, EmbeddedPlacement() as placement:
        conf, root = compute_host(served, "[devices]\nenabled_mdev_types = nvidia-222")
        code, rows, err = host_check(conf, root, placement.cli_environment())
    assert code == 0, (rows, err)
    assert levels(rows) == {
        check: {"ok"}
        for check in (
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
        )
    }
    [placement_row] = [r for r in rows if r["check"] == "placement"]
    assert placement_row["message"].startswith("Placement answers at http://127.0.0.1:")


def test_an_a100_host_lacks_only_nvidias_sriov_manage(tmp_path, compute_host):
    with served_host.served(tmp_path, "a100-sriov") as served:
        conf, root = compute_host(
            served,
            "[devices]\nenabled_mdev_types = nvidia-468\n"
            "[mdev_nvidia-468]\ndevice_addresses = 0000:41:00.0",
        )
        code, rows, _err = host_check(conf, root)
    assert code == 1
    failing = [r for r in rows if r["level"] != "ok"]
    assert [(r["check"], r["level"]) for r in failing] == [
        ("sriov-manage", "error"),
        ("placement", "warning"),
    ]
    assert failing[0]["message"].startswith("/usr/lib/nvidia/sriov-manage is missing")
    assert {r["message"] for r in rows if r["check"] == "vgpu-manager"} == {
        "0000:41:00.0: NVIDIA's vGPU manager 550.127.06 drives it (host vGPU mode SR-IOV)"
    }


def test_the_h100_data_center_host_says_the_vgpu_manager_is_missing(tmp_path, compute_host):
    with served_host.served(tmp_path, "h100-datacenter") as served:
        conf, root = compute_host(
            served,
            "[devices]\nenabled_mdev_types = nvidia-1155\n"
            "[mdev_nvidia-1155]\ndevice_addresses = 0000:00:06.0",
        )
        code, rows, _err = host_check(conf, root)
        inventory = subprocess.run(
            [MANAGE, "--config-file", str(conf), "inventory"],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
    assert code == 1
    by_check = {r["check"]: r for r in rows}
    assert (
        by_check["gpu"]["message"]
        == "0000:00:06.0: NVIDIA H100 80GB HBM3 (10de:2330), driver nvidia"
    )
    assert by_check["vgpu-manager"] == {
        "check": "vgpu-manager",
        "level": "error",
        "message": "NVIDIA's data-center driver is loaded, not the vGPU manager (0000:00:06.0: "
        "NVML says virtualization mode pass-through, host vGPU mode not supported)",
        "fix": "install NVIDIA's vGPU manager (host driver)",
    }
    assert {c: by_check[c]["level"] for c in ("iommu", "vfio", "configured-boards")} == {
        "iommu": "error",
        "vfio": "error",
        "configured-boards": "error",
    }
    assert inventory.returncode == 0 and "'vgpu-manage host check' says why" in inventory.stderr
