"""The privileged entry points, run in-process: they build every path under
their own root from validated names, open it by fd, and write nothing that
the device or this host's configuration does not allow.

The tree is the fake kernel's layout; in-process, a write lands in its plain
files (the fake kernel does not answer it), which is what these tests read.
"""

import os
import textwrap
import uuid

import pytest

from tests import confs
from vgpu_driver import exception
from vgpu_driver import privsep
from vgpu_driver.fake import fakekernel
from vgpu_driver.privsep import beneath

T4 = "0000:18:00.0"
T4_3 = "0000:35:00.0"
A100 = "0000:41:00.0"
A100_VF = "0000:41:00.4"
L40S = "0000:c1:00.0"
L40S_VF = "0000:c1:00.4"
NIC = "0000:05:00.0"

ENABLED = confs.MIXED_HOST


@pytest.fixture
def host(make_host, tmp_path, walk):
    host = make_host("t4x8", "a100-sriov", "l40s-vfio", "mtty")
    nic = os.path.join(host.paths.root, "devices", "pci0000:05", NIC)
    os.makedirs(nic)
    for name, text in (
        ("class", "0x020000\n"),
        ("sriov_totalvfs", "8\n"),
        ("sriov_numvfs", "0\n"),
        ("remove", ""),
    ):
        with open(os.path.join(nic, name), "w") as f:
            f.write(text)
    os.symlink(os.path.relpath(nic, host.paths.pci_base()), host.paths.pci_device(NIC))
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "remove").write_text("")
    return host


@pytest.fixture
def configure(host, make_conf):
    """Run the entry points in-process under a nova.conf of this text."""

    def run_under(text, fake_root=True):
        conf = make_conf(
            textwrap.dedent(text)
            + textwrap.dedent(f"""
            [vgpu]
            sysfs_root = {host.paths.root}
            test_only_fake_sysfs_root = {fake_root}
            """)
        )
        privsep.run_in_process(conf)
        return conf

    yield run_under
    privsep.use_daemon()


@pytest.fixture
def root(host, configure):
    configure(ENABLED)
    return host.paths.root


def read(path):
    with open(path) as f:
        return f.read()


def test_each_entry_point_writes_its_one_attribute(root):
    host = fakekernel.FakeKernel(root)
    mdev = str(uuid.uuid4())
    privsep.create_mdev(T4, "nvidia-222", mdev)
    assert read(os.path.join(host.paths.parent_type(T4, "nvidia-222"), "create")) == mdev
    privsep.set_vgpu_type(L40S_VF, 1156)
    assert read(os.path.join(host.paths.vendor_vfio_dir(L40S_VF), "current_vgpu_type")) == "1156"
    privsep.set_vgpu_type(L40S_VF, 0)  # clearing frees the VF: always allowed there
    # (a plain file keeps what the shorter write did not cover; sysfs would not)
    assert read(os.path.join(host.paths.vendor_vfio_dir(L40S_VF), "current_vgpu_type"))[0] == "0"


def test_remove_writes_into_the_mdev_of_a_registered_parent(root):
    host = fakekernel.FakeKernel(root)
    mdev = str(uuid.uuid4())
    host.create_mdev(T4, "nvidia-223", mdev)  # a type no longer configured: still freed
    privsep.remove_mdev(mdev)
    assert read(os.path.join(host.paths.mdev(mdev), "remove")) == "1"


def test_a_fleet_resolves_as_the_inventory_does(host, configure):
    """device_ids with gpu_count: the first two T4s serve the type, the third none."""
    configure("""
        [devices]
        enabled_mdev_types = nvidia-222
        [mdev_nvidia-222]
        device_ids = 10de:1eb8
        gpu_count = 2
        """)
    privsep.create_mdev(T4, "nvidia-222", str(uuid.uuid4()))
    before = snapshot(host.paths.root)
    with pytest.raises(
        exception.PrivilegedWriteRefused,
        match=f"GPU {T4_3} is given no mdev type by the configuration",
    ):
        privsep.create_mdev(T4_3, "nvidia-222", str(uuid.uuid4()))
    assert snapshot(host.paths.root) == before


@pytest.mark.parametrize(
    "call, kind",
    [
        (
            lambda: privsep.create_mdev("../../devices", "nvidia-222", str(uuid.uuid4())),
            "mdev parent name",
        ),
        (lambda: privsep.create_mdev(T4, "../nvidia-222", str(uuid.uuid4())), "mdev type id"),
        (lambda: privsep.create_mdev(T4, "nvidia-222", "not-a-uuid"), "mdev UUID"),
        (lambda: privsep.create_mdev(T4, "nvidia-222", str(uuid.uuid4()) + "\n"), "mdev UUID"),
        (lambda: privsep.remove_mdev("../../../outside"), "mdev UUID"),
        (lambda: privsep.set_vgpu_type("0000:c1:00.4/../..", 1156), "PCI address"),
        (lambda: privsep.set_vgpu_type(L40S_VF, "1156"), "vGPU type number"),
        (lambda: privsep.set_vgpu_type(L40S_VF, -1), "vGPU type number"),
        (lambda: privsep.set_vgpu_type(L40S_VF, True), "vGPU type number"),
    ],
)
def test_malformed_names_are_refused_and_write_nothing(root, call, kind):
    before = snapshot(root)
    with pytest.raises(exception.InvalidSysfsName, match=kind):
        call()
    assert snapshot(root) == before


def _non_nvidia_vf(root):
    vf = os.path.realpath(os.path.join(root, "bus", "pci", "devices", L40S_VF))
    with open(os.path.join(vf, "vendor"), "w") as f:
        f.write("0x1002\n")


# Each: (what the device or the configuration does not allow, the call,
# the rule the refusal names).
POLICY = [
    (
        "a type not enabled",
        lambda: privsep.create_mdev(T4, "nvidia-223", str(uuid.uuid4())),
        r"type nvidia-223 is not enabled \(\[devices\] enabled_mdev_types\)",
    ),
    (
        "an enabled type on a GPU configured for another",
        lambda: privsep.create_mdev(T4, "nvidia-468", str(uuid.uuid4())),
        f"GPU {T4} is configured for nvidia-222, not nvidia-468",
    ),
    (
        "a T4 type on an A100 VF",
        lambda: privsep.create_mdev(A100_VF, "nvidia-222", str(uuid.uuid4())),
        f"GPU {A100} is configured for nvidia-468, not nvidia-222",
    ),
    (
        "a virtual parent whose type is not enabled",
        lambda: privsep.create_mdev("mtty", "mtty-1", str(uuid.uuid4())),
        "type mtty-1 is not enabled",
    ),
    (
        "a vendor type not configured for the board",
        lambda: privsep.set_vgpu_type(L40S_VF, 1155),
        f"GPU {L40S} is configured for nvidia-1156, not nvidia-1155",
    ),
    (
        "a vendor type on a function that is not NVIDIA's",
        lambda: privsep.set_vgpu_type(L40S_VF, 1156),
        r"not an NVIDIA function \(vendor 0x1002\)",
    ),
    (
        "a vendor type on a physical function",
        lambda: privsep.set_vgpu_type(A100, 1156),
        "not an SR-IOV virtual function",
    ),
    (
        "a vendor type on a network card",
        lambda: privsep.set_vgpu_type(NIC, 4),
        "not a display or 3D controller",
    ),
    (
        "a registered parent that is not there any more",
        lambda: privsep.create_mdev("0000:99:00.0", "nvidia-222", str(uuid.uuid4())),
        None,
    ),
]


@pytest.mark.parametrize("what, call, rule", POLICY, ids=[p[0] for p in POLICY])
def test_writes_the_configuration_does_not_enable_are_refused(root, what, call, rule):
    if "not NVIDIA's" in what:
        _non_nvidia_vf(root)
    before = snapshot(root)
    if rule is None:  # the kernel's answer for a device that is gone
        with pytest.raises(OSError) as raised:
            call()
        assert raised.value.errno == 19
    else:
        with pytest.raises(exception.PrivilegedWriteRefused, match=rule):
            call()
    assert snapshot(root) == before


def test_no_entry_point_changes_sr_iov(host, configure):
    """VFs are NVIDIA's sriov-manage's to change, run by a root vgpu-manage:
    the privileged side nova-compute starts has no write for them."""
    configure(confs.FIRST_T4_ONLY)
    assert not hasattr(privsep, "set_sriov_numvfs")
    assert all("sriov" not in name for name in privsep.__all__)
    with pytest.raises(KeyError):
        privsep.call("set_sriov_numvfs", A100, 0)


def test_a_gpu_the_configuration_does_not_name(host, configure):
    configure(confs.FIRST_T4_ONLY)
    before = snapshot(host.paths.root)
    with pytest.raises(exception.PrivilegedWriteRefused, match=f"GPU {T4_3} is given no mdev type"):
        privsep.create_mdev(T4_3, "nvidia-222", str(uuid.uuid4()))
    assert snapshot(host.paths.root) == before


def test_a_vf_that_is_no_parent_is_on_no_gpu(host, configure):
    """A VF neither registered as an mdev parent nor carrying NVIDIA's files
    is no parent of any GPU: no vendor type is written there."""
    configure(ENABLED)
    os.unlink(os.path.join(host.paths.root, "class", "mdev_bus", A100_VF))
    before = snapshot(host.paths.root)
    with pytest.raises(
        exception.PrivilegedWriteRefused, match=f"VF {A100_VF} is on no GPU of this host"
    ):
        privsep.set_vgpu_type(A100_VF, 468)
    assert snapshot(host.paths.root) == before


def test_an_mdev_of_a_virtual_parent_not_configured_stays(host, configure):
    configure(confs.FIRST_T4_ONLY)
    mdev = str(uuid.uuid4())
    fakekernel.FakeKernel(host.paths.root).create_mdev("mtty", "mtty-1", mdev)
    before = snapshot(host.paths.root)
    with pytest.raises(
        exception.PrivilegedWriteRefused,
        match="parent mtty is neither a display controller nor a device",
    ):
        privsep.remove_mdev(mdev)
    assert snapshot(host.paths.root) == before


def test_a_configuration_with_errors_enables_nothing(host, configure):
    configure(f"""
        [devices]
        enabled_mdev_types = nvidia-222
        [mdev_nvidia-222]
        device_addresses = {T4}
        ramfb = true
        """)
    before = snapshot(host.paths.root)
    with pytest.raises(
        exception.PrivilegedWriteRefused,
        match="the configuration has errors, so it enables nothing",
    ):
        privsep.create_mdev(T4, "nvidia-222", str(uuid.uuid4()))
    assert snapshot(host.paths.root) == before


def test_a_root_that_is_not_sysfs_is_refused_without_the_test_option(host, configure):
    configure(ENABLED, fake_root=False)
    before = snapshot(host.paths.root)
    with pytest.raises(exception.PrivilegedWriteRefused, match="not a sysfs mount"):
        privsep.create_mdev(T4, "nvidia-222", str(uuid.uuid4()))
    assert snapshot(host.paths.root) == before


def test_the_real_sysfs_is_recognised():
    with beneath.SysfsRoot("/sys") as sys_root:
        assert sys_root.exists("class") and sys_root.exists("devices")


def test_links_that_leave_the_root_or_reach_a_non_gpu_are_refused(root, tmp_path):
    host = fakekernel.FakeKernel(root)
    escaping, relative_escape, pci_remove, nic_parent = (str(uuid.uuid4()) for _ in range(4))
    nic = os.path.realpath(host.paths.pci_device(NIC))

    def link(target, path):
        os.symlink(os.path.relpath(target, os.path.dirname(path)), path)

    os.symlink(str(tmp_path / "outside"), host.paths.mdev(escaping))
    link(str(tmp_path / "outside"), host.paths.mdev(relative_escape))
    # The PCI device itself: its ``remove`` would hot-unplug it.
    link(nic, host.paths.mdev(pci_remove))
    # A non-GPU registered as a parent, with something shaped like an mdev.
    os.makedirs(os.path.join(nic, nic_parent))
    link(nic, host.paths.parent(NIC))
    link(os.path.join(nic, nic_parent), host.paths.mdev(nic_parent))
    for planted in (escaping, relative_escape):
        with pytest.raises(exception.PrivilegedWriteRefused, match="outside"):
            privsep.remove_mdev(planted)
    with pytest.raises(
        exception.PrivilegedWriteRefused, match="not an mdev of a registered parent"
    ):
        privsep.remove_mdev(pci_remove)
    with pytest.raises(exception.PrivilegedWriteRefused, match="not a display or 3D controller"):
        privsep.remove_mdev(nic_parent)
    assert read(tmp_path / "outside" / "remove") == ""
    assert read(os.path.join(nic, "remove")) == ""


def test_a_link_inside_devices_is_never_followed(root, tmp_path):
    """A directory under devices/ replaced by a link (even one that stays in
    the root) is refused: the kernel's sysfs has none there."""
    host = fakekernel.FakeKernel(root)
    gpu_dir = os.path.realpath(host.paths.parent(T4))
    moved = str(tmp_path / "moved")
    os.rename(gpu_dir, moved)
    os.symlink(moved, gpu_dir)
    with pytest.raises(exception.PrivilegedWriteRefused, match="a link, another mount"):
        privsep.create_mdev(T4, "nvidia-222", str(uuid.uuid4()))
    assert read(os.path.join(moved, "mdev_supported_types", "nvidia-222", "create")) == ""


def test_a_fifo_in_place_of_an_attribute_is_refused_without_blocking(root):
    host = fakekernel.FakeKernel(root)
    mdev = str(uuid.uuid4())
    host.create_mdev(T4, "nvidia-222", mdev)
    attr = os.path.join(os.path.realpath(host.paths.mdev(mdev)), "remove")
    os.unlink(attr)
    os.mkfifo(attr)
    with pytest.raises(OSError) as raised:  # ENXIO: no reader, and no wait for one
        privsep.remove_mdev(mdev)
    assert raised.value.errno == 6


def test_a_device_that_is_gone_is_enodev_not_a_refusal(root):
    with pytest.raises(OSError) as raised:
        privsep.remove_mdev(str(uuid.uuid4()))
    assert raised.value.errno == 19


def test_the_root_comes_from_the_privileged_side_only(root, make_host):
    """A second host's names resolve under the fixed root, never the other."""
    other = make_host("t4x8")
    privsep.create_mdev(T4, "nvidia-222", str(uuid.uuid4()))
    assert (
        read(
            os.path.join(
                fakekernel.FakeKernel(other.paths.root).paths.parent_type(T4, "nvidia-222"),
                "create",
            )
        )
        == ""
    )


def test_errors_rebuild_from_their_plain_args():
    """oslo.privsep raises ``type(error)(*error.args)`` on the caller's side."""
    errors = [
        exception.InvalidSysfsName("vGPU type number", "x", "a call"),
        exception.PrivilegedWriteRefused("nvidia-223 on 0000:18:00.0", "a rule"),
        exception.WritesNeedRoot("create_mdev()", 1000),
        exception.MdevWriteError.from_os_error("create", "t on p", OSError(28, "full")),
        exception.GpuGone(instance="i", gpu="g"),
    ]
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
            if not os.path.isfile(path):
                continue
            with open(path, "rb") as f:  # a PCI function's config is binary
                found[path] = f.read()
    return found
