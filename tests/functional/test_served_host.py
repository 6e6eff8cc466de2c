"""``vgpu-manage fake-host serve``: the fake kernel as a filesystem.

Any process drives it as sysfs: plain writes get the kernel's errnos, and
Debian's mdevctl (in a private mount namespace with the mount bound over
``/sys``) starts and stops mdevs that ``vgpu-manage types`` then counts.
"""

import errno
import json
import os
import shutil
import subprocess
import threading
import uuid

import pytest

from tests import served_host
from tests.functional.test_mdevctl_agrees import in_namespace

T4 = "0000:18:00.0"
A100 = "0000:41:00.0"
L40S = "0000:c1:00.0"
L40S_VF = "0000:c1:00.4"


def write(path, text):
    """``echo -n text > path``: one open and one write, as a shell makes it."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def errno_of(path, text):
    with pytest.raises(OSError) as raised:
        write(path, text)
    return raised.value.errno


def free(mount, parent, type_id):
    path = f"{mount}/class/mdev_bus/{parent}/mdev_supported_types/{type_id}/available_instances"
    with open(path) as f:
        return int(f.read())


def types_free(mount, parent, type_id):
    """``available_instances`` as ``vgpu-manage types`` reports it."""
    done = subprocess.run(
        [
            served_host.MANAGE,
            "--config-file",
            "/dev/null",
            "--sysfs-root",
            mount,
            "types",
            "-f",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    (row,) = [r for r in json.loads(done.stdout) if r["parent"] == parent and r["type"] == type_id]
    return row["available_instances"]


def test_mdevctl_drives_the_served_host_and_vgpu_manage_agrees(tmp_path):
    if shutil.which("mdevctl") is None:
        pytest.skip("mdevctl is not installed")
    etc = tmp_path / "mdevctl.d"
    for sub in ("callouts", "notifiers"):  # mdevctl refuses to run without them
        (etc / "scripts.d" / sub).mkdir(parents=True)
    mdev = str(uuid.uuid4())
    with served_host.served(tmp_path, "t4x8") as host:
        assert types_free(host.mount, T4, "nvidia-222") == 16
        started = in_namespace(
            host.mount, etc, "mdevctl", "start", "-u", mdev, "-p", T4, "-t", "nvidia-222"
        )
        assert started.returncode == 0, started.stderr
        assert types_free(host.mount, T4, "nvidia-222") == 15
        listed = in_namespace(host.mount, etc, "mdevctl", "list")
        assert listed.stdout.split()[:3] == [mdev, T4, "nvidia-222"]
        types = in_namespace(host.mount, etc, "mdevctl", "types", "-p", T4)
        assert "Available instances: 15" in types.stdout
        other = in_namespace(
            host.mount,
            etc,
            "mdevctl",
            "start",
            "-u",
            str(uuid.uuid4()),
            "-p",
            T4,
            "-t",
            "nvidia-223",
        )
        assert other.returncode != 0 and "nvidia-223" in other.stderr
        stopped = in_namespace(host.mount, etc, "mdevctl", "stop", "-u", mdev)
        assert stopped.returncode == 0, stopped.stderr
        assert types_free(host.mount, T4, "nvidia-222") == 16
        assert host.stop() == 0
        assert not os.path.ismount(host.mount)


def test_writes_get_the_kernels_errnos(tmp_path):
    with served_host.served(tmp_path, "t4x8") as host:
        create = f"{host.mount}/class/mdev_bus/{T4}/mdev_supported_types/nvidia-222/create"
        assert errno_of(create, "not-a-uuid") == errno.EINVAL
        first = str(uuid.uuid4())
        write(create, first + "\n")
        assert errno_of(create, first) == errno.EEXIST
        other_type = create.replace("nvidia-222", "nvidia-223")
        assert errno_of(other_type, str(uuid.uuid4())) == errno.EUSERS
        for _ in range(15):
            write(create, str(uuid.uuid4()))
        assert free(host.mount, T4, "nvidia-222") == 0
        assert errno_of(create, str(uuid.uuid4())) == errno.EUSERS
        available = create.replace("create", "available_instances")
        assert errno_of(available, "99") == errno.EACCES
        assert sorted(os.listdir(host.mount)) == ["bus", "class", "devices", "kernel", "module"]


def test_remove_blocks_while_a_guest_holds_the_mdev(tmp_path):
    with served_host.served(tmp_path, "t4x8") as host:
        mdev = str(uuid.uuid4())
        write(f"{host.mount}/class/mdev_bus/{T4}/mdev_supported_types/nvidia-222/create", mdev)
        host.kernel.hold(mdev)
        remover = threading.Thread(
            target=write, args=(f"{host.mount}/bus/mdev/devices/{mdev}/remove", "1")
        )
        remover.start()
        remover.join(0.5)
        assert remover.is_alive() and os.path.exists(f"{host.mount}/bus/mdev/devices/{mdev}")
        # Other processes are not blocked meanwhile.
        assert free(host.mount, T4, "nvidia-222") == 15
        host.kernel.release(mdev)
        remover.join(10)
        assert not remover.is_alive()
        assert not os.path.lexists(f"{host.mount}/bus/mdev/devices/{mdev}")
        assert free(host.mount, T4, "nvidia-222") == 16


FAKE_SRIOV_MANAGE = os.path.join(os.path.dirname(served_host.MANAGE), "vgpu-fake-sriov-manage")


def shell_write(path, text, echo="echo"):
    """``sh -c 'echo TEXT > PATH'``: another process, as an operator types it
    (dash's own echo says "I/O error" whatever the errno; coreutils' names it)."""
    done = subprocess.run(
        ["sh", "-c", f"{echo} {text} > {path}"], capture_output=True, text=True, check=False
    )
    return done.returncode, done.stderr


def test_sriov_numvfs_of_an_nvidia_pf_is_refused_to_any_process(tmp_path):
    """The kernel asks the PF's driver, and ``nvidia`` cannot configure
    SR-IOV: ENOENT, whoever writes.  NVIDIA's script (its stand-in here)
    goes through pci-pf-stub and enables the VFs."""
    with served_host.served(tmp_path, "a100-sriov-off") as host:
        pf = f"{host.mount}/bus/pci/devices/{A100}"
        assert os.path.basename(os.readlink(f"{pf}/driver")) == "nvidia"
        code, err = shell_write(f"{pf}/sriov_numvfs", 4)
        assert code != 0 and "error" in err, err
        code, err = shell_write(f"{pf}/sriov_numvfs", 4, echo="/bin/echo")
        assert code != 0 and "write error: No such file or directory" in err, err
        assert errno_of(f"{pf}/sriov_numvfs", "16") == errno.ENOENT
        with open(f"{pf}/sriov_numvfs") as f:
            assert f.read() == "0\n"
        done = subprocess.run(
            [FAKE_SRIOV_MANAGE, "--sysfs-root", host.mount, "-e", A100],
            capture_output=True,
            text=True,
            check=False,
        )
        assert (done.returncode, done.stdout, done.stderr) == (0, f"Enabling VFs on {A100}\n", "")
        with open(f"{pf}/sriov_numvfs") as f:
            assert f.read() == "16\n"
        assert os.path.exists(f"{host.mount}/class/mdev_bus/0000:41:00.4")
        assert os.path.basename(os.readlink(f"{pf}/driver")) == "nvidia"
        assert errno_of(f"{pf}/sriov_numvfs", "0") == errno.ENOENT


def test_pci_pf_stub_takes_the_pf_by_hand(tmp_path):
    """What the script does, step by step, by shell writes: each step
    answers as the kernel does."""
    with served_host.served(tmp_path, "a100-sriov-off") as host:
        pf = f"{host.mount}/bus/pci/devices/{A100}"
        drivers = f"{host.mount}/bus/pci/drivers"
        assert errno_of(f"{drivers}/pci-pf-stub/bind", A100) == errno.ENODEV  # no match
        assert errno_of(f"{drivers}/pci-pf-stub/unbind", A100) == errno.ENODEV  # not its
        assert shell_write(f"{drivers}/nvidia/unbind", A100) == (0, "")
        assert not os.path.lexists(f"{pf}/driver")
        assert errno_of(f"{pf}/sriov_numvfs", "4") == errno.ENOENT  # no driver
        assert shell_write(f"{pf}/driver_override", "pci-pf-stub") == (0, "")
        assert errno_of(f"{drivers}/nvidia/bind", A100) == errno.ENODEV  # overridden
        assert shell_write(f"{drivers}/pci-pf-stub/bind", A100) == (0, "")
        assert errno_of(f"{drivers}/pci-pf-stub/bind", A100) == errno.EBUSY
        assert shell_write(f"{pf}/sriov_numvfs", 4) == (0, "")
        assert errno_of(f"{pf}/sriov_numvfs", "8") == errno.EBUSY
        assert errno_of(f"{pf}/sriov_numvfs", "17") == errno.ERANGE
        assert shell_write(f"{drivers}/pci-pf-stub/unbind", A100) == (0, "")
        assert shell_write(f"{pf}/driver_override", "") == (0, "")
        with open(f"{pf}/driver_override") as f:
            assert f.read() == "(null)\n"
        assert shell_write(f"{drivers}/nvidia/bind", A100) == (0, "")
        with open(f"{pf}/sriov_numvfs") as f:
            assert f.read() == "4\n"  # the VFs stay across the rebind
        assert sorted(e for e in os.listdir(f"{drivers}/nvidia") if e.startswith("0000")) == [
            A100,
            "0000:41:00.4",
            "0000:41:00.5",
            "0000:41:00.6",
            "0000:41:00.7",
        ]


def test_vendor_vgpu_types(tmp_path):
    with served_host.served(tmp_path, "a100-sriov", "l40s-vfio") as host:
        current = f"{host.mount}/bus/pci/devices/{L40S_VF}/nvidia/current_vgpu_type"
        write(current, "1156")
        assert errno_of(current, "1155") == errno.EBUSY
        with open(current) as f:
            assert f.read() == "1156\n"


def served_types(mount):
    """``{parent: {type ids}}`` as ``vgpu-manage types`` lists a host."""
    done = subprocess.run(
        [
            served_host.MANAGE,
            "--config-file",
            "/dev/null",
            "--sysfs-root",
            mount,
            "types",
            "-f",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    found = {}
    for row in json.loads(done.stdout):
        found.setdefault(row["parent"], set()).add(row["type"])
    return found


def test_a_boards_two_modes_as_vgpu_manage_types_lists_them(tmp_path):
    l40s_types = {f"nvidia-{n}" for n in range(1155, 1161)}
    with served_host.served(tmp_path, "l40s-vfio") as host:
        current = f"{host.mount}/bus/pci/devices/{L40S_VF}/nvidia/current_vgpu_type"
        write(current, "1157")  # an L40S-12Q, in equal-size mode
        others = {vf: ids for vf, ids in served_types(host.mount).items() if vf != L40S_VF}
        assert len(others) == 15 and set(map(frozenset, others.values())) == {
            frozenset({"nvidia-1157"})
        }
        write(current, "0")
        # Mixed-size mode (NVML's switch, made on the host's kernel), then the
        # same vGPU: every size with a free placement stays creatable.
        host.kernel.set_heterogeneous_mode(L40S, True)
        write(current, "1157")
        others = {vf: ids for vf, ids in served_types(host.mount).items() if vf != L40S_VF}
        assert set(map(frozenset, others.values())) == {frozenset(l40s_types - {"nvidia-1160"})}
        assert host.kernel.placement_of(L40S_VF) == 0


def test_a_taken_mount_point_is_refused(tmp_path):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "file").write_text("")
    done = subprocess.run(
        [served_host.MANAGE, "fake-host", "serve", "--profile", "t4x8", str(busy)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: Cannot serve the fake host at {busy}: it is not empty; choose an empty "
        "directory that nothing is mounted on."
    ]
    with served_host.served(tmp_path, "mtty") as host:
        again = subprocess.run(
            [served_host.MANAGE, "fake-host", "serve", "--profile", "mtty", host.mount],
            capture_output=True,
            text=True,
            check=False,
        )
        assert again.returncode == 2 and "something is mounted there" in again.stderr
