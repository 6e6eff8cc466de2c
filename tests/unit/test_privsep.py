"""The privileged entry points, run in-process: they build every path under
their own root from validated names and write nothing they refuse.

The tree is the fake kernel's layout; in-process, a write lands in its plain
files (the fake kernel does not answer it), which is what these tests read.
"""

import os
import uuid

import pytest

from vgpu_driver import exception
from vgpu_driver import privsep
from vgpu_driver.fake import fakekernel

T4 = "0000:18:00.0"
A100 = "0000:41:00.0"
A100_VF = "0000:41:00.4"
L40S_VF = "0000:c1:00.4"
NIC = "0000:05:00.0"


@pytest.fixture
def root(make_host, tmp_path):
    host = make_host("t4x8", "a100-sriov", "l40s-vfio")
    privsep.run_in_process(host.paths.root)
    nic = os.path.join(host.paths.root, "devices", "pci0000:05", NIC)
    os.makedirs(nic)
    for name, text in (("class", "0x020000\n"), ("sriov_totalvfs", "8\n"),
                       ("sriov_numvfs", "0\n"), ("remove", "")):
        with open(os.path.join(nic, name), "w") as f:
            f.write(text)
    os.symlink(os.path.relpath(nic, host.paths.pci_base()), host.paths.pci_device(NIC))
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "remove").write_text("")
    yield host.paths.root
    privsep.use_daemon()


def read(path):
    with open(path) as f:
        return f.read()


def test_each_entry_point_writes_its_one_attribute(root):
    host = fakekernel.FakeKernel(root)
    mdev = str(uuid.uuid4())
    privsep.create_mdev(T4, "nvidia-222", mdev)
    assert read(os.path.join(host.paths.parent_type(T4, "nvidia-222"), "create")) == mdev
    privsep.set_sriov_numvfs(A100, 12)   # over "16\n": no truncation, as in sysfs
    assert read(os.path.join(host.paths.pci_device(A100), "sriov_numvfs")) == "12\n"
    privsep.set_vgpu_type(L40S_VF, 1156)
    assert read(os.path.join(host.paths.vendor_vfio_dir(L40S_VF), "current_vgpu_type")) == "1156"


def test_remove_writes_into_the_mdev_of_a_registered_parent(root):
    host = fakekernel.FakeKernel(root)
    mdev = str(uuid.uuid4())
    host.create_mdev(T4, "nvidia-222", mdev)
    privsep.remove_mdev(mdev)
    assert read(os.path.join(host.paths.mdev(mdev), "remove")) == "1"


@pytest.mark.parametrize("call, kind", [
    (lambda: privsep.create_mdev("../../devices", "nvidia-222", str(uuid.uuid4())),
     "mdev parent name"),
    (lambda: privsep.create_mdev(T4, "../nvidia-222", str(uuid.uuid4())), "mdev type id"),
    (lambda: privsep.create_mdev(T4, "nvidia-222", "not-a-uuid"), "mdev UUID"),
    (lambda: privsep.remove_mdev("../../../outside"), "mdev UUID"),
    (lambda: privsep.set_sriov_numvfs("0000:41:00.0/../..", 4), "PCI address"),
    (lambda: privsep.set_sriov_numvfs(NIC, 4), "not a display or 3D controller"),
    (lambda: privsep.set_sriov_numvfs(A100, "4; reboot"), "VF count"),
    (lambda: privsep.set_sriov_numvfs(T4, 4), "not an SR-IOV physical function"),
    (lambda: privsep.set_vgpu_type(L40S_VF, "1156"), "vGPU type number"),
    (lambda: privsep.set_vgpu_type(L40S_VF, -1), "vGPU type number"),
    (lambda: privsep.set_vgpu_type(L40S_VF, True), "vGPU type number"),
    (lambda: privsep.set_vgpu_type(A100, 1156), "not an SR-IOV virtual function"),
])
def test_refusals_are_typed_and_write_nothing(root, call, kind):
    before = snapshot(root)
    with pytest.raises(exception.InvalidSysfsName, match=kind):
        call()
    assert snapshot(root) == before


def test_links_that_leave_the_root_or_reach_a_non_gpu_are_refused(root, tmp_path):
    host = fakekernel.FakeKernel(root)
    escaping, pci_remove, nic_parent = (str(uuid.uuid4()) for _ in range(3))
    nic = os.path.realpath(host.paths.pci_device(NIC))

    def link(target, path):
        os.symlink(os.path.relpath(target, os.path.dirname(path)), path)

    os.symlink(str(tmp_path / "outside"), host.paths.mdev(escaping))
    # The PCI device itself: its ``remove`` would hot-unplug it.
    link(nic, host.paths.mdev(pci_remove))
    # A non-GPU registered as a parent, with something shaped like an mdev.
    os.makedirs(os.path.join(nic, nic_parent))
    link(nic, host.paths.parent(NIC))
    link(os.path.join(nic, nic_parent), host.paths.mdev(nic_parent))
    with pytest.raises(exception.InvalidSysfsName, match="outside"):
        privsep.remove_mdev(escaping)
    with pytest.raises(exception.InvalidSysfsName, match="not an mdev of a registered parent"):
        privsep.remove_mdev(pci_remove)
    with pytest.raises(exception.InvalidSysfsName, match="not a display or 3D controller"):
        privsep.remove_mdev(nic_parent)
    assert read(tmp_path / "outside" / "remove") == ""
    assert read(os.path.join(nic, "remove")) == ""


def test_a_device_that_is_gone_is_enodev_not_a_refusal(root):
    with pytest.raises(OSError) as raised:
        privsep.remove_mdev(str(uuid.uuid4()))
    assert raised.value.errno == 19


def test_the_root_comes_from_the_privileged_side_only(root, make_host):
    """A second host's names resolve under the fixed root, never the other."""
    other = make_host("t4x8")
    privsep.create_mdev(T4, "nvidia-222", str(uuid.uuid4()))
    assert read(os.path.join(fakekernel.FakeKernel(other.paths.root).paths.parent_type(
        T4, "nvidia-222"), "create")) == ""


def test_errors_rebuild_from_their_plain_args():
    """oslo.privsep raises ``type(error)(*error.args)`` on the caller's side."""
    errors = [exception.InvalidSysfsName("vGPU type number", "x", "a call"),
              exception.MdevWriteError.from_os_error("create", "t on p", OSError(28, "full")),
              exception.GpuGone(instance="i", gpu="g")]
    for error in errors:
        rebuilt = type(error)(*error.args)
        assert type(rebuilt) is type(error) and str(rebuilt) == str(error)
        assert getattr(rebuilt, "errno", None) == getattr(error, "errno", None)
        assert rebuilt.kwargs == error.kwargs


def snapshot(root):
    found = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:  # a PCI function's config is binary
                found[path] = f.read()
    return found
