"""mdevctl, an independent reader of the mdev ABI, sees what our reader sees.

The fake kernel's tree is only worth testing against if it is laid out the
way the kernel lays out ``/sys``, and our reader is only right if it reads
that layout the way other tools do.  Debian's mdevctl 1.2.0 reads the fixed
paths ``/sys`` and ``/etc/mdevctl.d`` (it ignores ``MDEVCTL_ENV_ROOT``), so
it runs in a private mount namespace where a fake host is bind-mounted on
``/sys`` and an empty directory on ``/etc/mdevctl.d``.  Both sides are then
reduced to sets of plain tuples and must be equal.
"""

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

from vgpu_driver import claims_journal
from vgpu_driver import sysfs
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles

pytestmark = pytest.mark.mdevctl

# l40s-vfio uses NVIDIA's vendor-specific VFIO files, not mdevs: nothing for
# mdevctl to read (see test_vendor_vfio_host_shows_no_mdev_parents).
# Profiles with mdev parents as written (l40s-vfio has vendor-VFIO VFs, and
# a100-sriov-off no VF until enabled: both are compared below).
# Profiles with mdev parents as built (the L40S's VFs have vendor VFIO files,
# the A100s are rebooted, one of them under vendor VFIO too, the H100 runs
# NVIDIA's data-center driver).
NO_MDEV_PARENT = ("l40s-vfio", "a100-sriov-off", "a100-vfio", "h100-datacenter")
MDEV_PROFILES = [name for name in profiles.names() if name not in NO_MDEV_PARENT]

# Hosts with mdevs, chosen so that creating them changes available_instances
# elsewhere: on sibling VFs of the A100, on the other types of one T4, and on
# both mtty types (they share the serial ports).
WITH_MDEVS = {
    "a100-sriov": [
        ("0000:41:00.4", "nvidia-468"),
        ("0000:41:00.6", "nvidia-468"),
        ("0000:41:01.1", "nvidia-468"),
    ],
    "t4x8": [("0000:18:00.0", "nvidia-231")] * 3,
    "mtty": [("mtty", "mtty-2")] * 3,
}

# Bind $1 on /sys and $2 on /etc/mdevctl.d, then run the rest of the arguments.
_NAMESPACE_SCRIPT = (
    'mount --bind "$1" /sys && mount --bind "$2" /etc/mdevctl.d && shift 2 && exec "$@"'
)


def in_namespace(sysfs_root, etc_dir, *argv):
    """Run ``argv`` where ``sysfs_root`` is /sys, without touching the host's mounts."""
    return subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            _NAMESPACE_SCRIPT,
            "sh",
            str(sysfs_root),
            str(etc_dir),
            *argv,
        ],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture(scope="module")
def mdevctl_view(tmp_path_factory):
    """A function giving mdevctl's (types, mdevs) for a fake host.

    Skips only when this machine cannot run mdevctl in a private mount
    namespace at all; any other failure is a failure.
    """
    if shutil.which("mdevctl") is None:
        pytest.skip("mdevctl is not installed")
    if os.geteuid() != 0:
        pytest.skip("a private mount namespace with bind mounts needs root")
    etc_dir = tmp_path_factory.mktemp("mdevctl.d")
    # mdevctl refuses to run without its callout and notifier directories.
    for sub in ("callouts", "notifiers"):
        (etc_dir / "scripts.d" / sub).mkdir(parents=True)
    probe = in_namespace(etc_dir, etc_dir, "true")
    if probe.returncode and (
        "Operation not permitted" in probe.stderr or "permission denied" in probe.stderr
    ):
        pytest.skip(f"cannot bind-mount in a private mount namespace: {probe.stderr.strip()}")
    assert probe.returncode == 0, probe.stderr

    def run(root, *args):
        done = in_namespace(root, etc_dir, "mdevctl", *args, "--dumpjson")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def view(root):
        # types: [{parent: [{type: {available_instances, device_api, name?, description?}}]}]
        types = {
            (
                parent,
                type_id,
                info.get("name"),
                info["available_instances"],
                info["device_api"],
                info.get("description"),
            )
            for by_parent in run(root, "types")
            for parent, entries in by_parent.items()
            for entry in entries
            for type_id, info in entry.items()
        }
        # list: [{parent: [{uuid: {mdev_type, start, attrs}}]}]
        mdevs = {
            (mdev_uuid, parent, info["mdev_type"])
            for by_parent in run(root, "list")
            for parent, entries in by_parent.items()
            for entry in entries
            for mdev_uuid, info in entry.items()
        }
        return types, mdevs

    return view


def our_view(root):
    """``vgpu-manage``'s (types, mdevs), rendered the way mdevctl renders them.

    mdevctl leaves out an empty name or description and joins a
    description's lines with ", "; we keep them as read.
    """
    state_dir = f"{root}-state"
    claims_journal.Journal(state_dir)  # as nova-compute's start-up leaves it

    def run(*args):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "vgpu_driver.cmd.manage",
                "--config-file",
                os.devnull,
                "--sysfs-root",
                str(root),
                "--state-dir",
                state_dir,
                *args,
                "-f",
                "json",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    types = {
        (
            row["parent"],
            row["type"],
            row["name"] or None,
            row["available_instances"],
            row["device_api"],
            (row["description"] or "").replace("\n", ", ") or None,
        )
        for row in run("types")
    }
    mdevs = {(row["uuid"], row["parent"], row["type"]) for row in run("mdev", "list")}
    return types, mdevs


def assert_agree(mdevctl_view, root):
    """Both readers see the same types and mdevs; returns what they saw."""
    our_types, our_mdevs = our_view(root)
    their_types, their_mdevs = mdevctl_view(root)
    assert our_types == their_types
    assert our_mdevs == their_mdevs
    return our_types, our_mdevs


@pytest.mark.parametrize("profile", MDEV_PROFILES)
def test_host_as_created(mdevctl_view, tmp_path, profile):
    """Every mdev profile, as the fake kernel writes it."""
    root = tmp_path / "sys"
    fakekernel.FakeKernel.build(root, profiles.load(profile))
    types, _ = assert_agree(mdevctl_view, root)
    assert types, "a profile with mdev parents shows no types: nothing was compared"


def test_a_host_without_the_mdev_module(mdevctl_view, tmp_path):
    """No class/mdev_bus, no bus/mdev: both readers see nothing, and neither
    fails."""
    root = tmp_path / "sys"
    fakekernel.FakeKernel.build(root, profiles.load("h100-datacenter"))
    assert assert_agree(mdevctl_view, root) == (set(), set())


@pytest.mark.parametrize("profile", sorted(WITH_MDEVS))
def test_host_with_mdevs(mdevctl_view, tmp_path, profile):
    """After creating mdevs, both readers see them and the capacity they took."""
    root = tmp_path / "sys"
    kernel = fakekernel.FakeKernel.build(root, profiles.load(profile))
    types_before, _ = assert_agree(mdevctl_view, root)
    for parent, type_id in WITH_MDEVS[profile]:
        kernel.create_mdev(parent, type_id, str(uuid.uuid4()))

    types_after, mdevs = assert_agree(mdevctl_view, root)
    assert len(mdevs) == len(WITH_MDEVS[profile])
    assert types_after != types_before, "creating mdevs changed no available_instances"


def test_rebooted_a100_agrees_before_and_after_its_vfs_are_enabled(mdevctl_view, tmp_path):
    root = tmp_path / "sys"
    kernel = fakekernel.FakeKernel.build(root, profiles.load("a100-sriov-off"))
    assert assert_agree(mdevctl_view, root) == (set(), set())
    kernel.set_vfs("0000:41:00.0", 16)
    types, _ = assert_agree(mdevctl_view, root)
    assert len({parent for parent, *_ in types}) == 16


def test_vendor_vfio_host_shows_no_mdev_parents(mdevctl_view, tmp_path):
    """l40s-vfio has no mdev parents and no mdevs, for either reader.

    ``vgpu-manage types`` does list its vendor-VFIO types, which mdevctl
    cannot know about, so our side is read from the sysfs backend directly.
    """
    root = tmp_path / "sys"
    fakekernel.FakeKernel.build(root, profiles.load("l40s-vfio"))
    assert mdevctl_view(root) == (set(), set())
    host = sysfs.open_host(str(root))
    assert host.list_parents() == []
    assert host.list_mdevs() == []
