"""The fake kernel's PCI drivers and the stand-in for NVIDIA's sriov-manage.

Each rule is the kernel's (``sriov_numvfs_store`` in ``drivers/pci/iov.c``,
``bind_store``/``unbind_store`` in ``drivers/base/bus.c``) or NVIDIA's (no
``.sriov_configure`` in ``nv-pci.c``; the vGPU mode reset when the driver
takes the board again); the stand-in does what NVIDIA's script does.
"""

import errno
import io
import os

import pytest

from tests import pci_devices
from vgpu_driver.fake import sriov_manage

A100 = "0000:41:00.0"
L40S = "0000:c1:00.0"
L40S_VF = "0000:c1:00.4"


def read(path):
    with open(path) as f:
        return f.read()


def errno_of(call, *args):
    with pytest.raises(OSError) as raised:
        call(*args)
    return raised.value.errno


class Paths:
    def __init__(self, host, address):
        self.host = host
        self.pf = host.paths.pci_device(address)
        self.address = address

    def driver(self, name, attr):
        return self.host.paths.join("bus", "pci", "drivers", name, attr)

    def attr(self, name):
        return os.path.join(self.pf, name)

    @property
    def bound(self):
        return self.host.bound_driver(os.path.realpath(self.pf))


def test_a_gpu_is_born_bound_to_nvidia_without_override(make_host):
    host = make_host("a100-sriov-off")
    pf = Paths(host, A100)
    assert pf.bound == "nvidia"
    assert read(pf.attr("driver_override")) == "(null)\n"
    assert read(pf.attr("uevent")).startswith("DRIVER=nvidia\n")
    assert os.path.realpath(pf.driver("nvidia", A100)) == os.path.realpath(pf.pf)


@pytest.mark.parametrize("driver", [None, "nvidia"])
def test_numvfs_without_a_driver_that_configures_sriov_is_enoent(make_host, driver):
    host = make_host("a100-sriov-off")
    pf = Paths(host, A100)
    if driver is None:
        host.write_attr(pf.driver("nvidia", "unbind"), A100)
        assert pf.bound is None and "DRIVER=" not in read(pf.attr("uevent"))
    assert errno_of(host.write_attr, pf.attr("sriov_numvfs"), "16") == errno.ENOENT
    # As the kernel: the count is checked before the driver, and the same
    # count is no change at all.
    assert errno_of(host.write_attr, pf.attr("sriov_numvfs"), "17") == errno.ERANGE
    host.write_attr(pf.attr("sriov_numvfs"), "0")
    assert host.pci_device(A100).sriov_numvfs == 0


@pytest.mark.parametrize(
    "text, code",
    [
        ("-1", errno.EINVAL),
        ("1_0", errno.EINVAL),
        (" 1", errno.EINVAL),
        ("1\n\n", errno.EINVAL),
        ("", errno.EINVAL),
        ("0x", errno.EINVAL),
        ("08", errno.EINVAL),
        ("65536", errno.ERANGE),
        ("0\n", None),
        ("+0", None),
        ("0x0", None),
        ("00", None),
    ],
)
def test_numvfs_parses_as_kstrtou16(make_host, text, code):
    """sriov_numvfs_store returns kstrtou16's error before anything else."""
    host = make_host("a100-sriov-off")
    pf = Paths(host, A100)
    if code is None:
        host.write_attr(pf.attr("sriov_numvfs"), text)  # zero, as now: no change
        assert host.pci_device(A100).sriov_numvfs == 0
    else:
        assert errno_of(host.write_attr, pf.attr("sriov_numvfs"), text) == code


def test_driver_override_is_set_as_driver_set_override(make_host):
    """drivers/base/driver.c: PAGE_SIZE - 1 bytes is too long; the first newline ends the name."""
    host = make_host("a100-sriov-off")
    pf = Paths(host, A100)
    assert errno_of(host.write_attr, pf.attr("driver_override"), "x" * 4095) == errno.EINVAL
    host.write_attr(pf.attr("driver_override"), "x" * 4094)
    assert read(pf.attr("driver_override")) == "x" * 4094 + "\n"
    host.write_attr(pf.attr("driver_override"), "pci-pf-stub\nvfio-pci\n")
    assert read(pf.attr("driver_override")) == "pci-pf-stub\n"
    host.write_attr(pf.attr("driver_override"), "\nvfio-pci")
    assert read(pf.attr("driver_override")) == "(null)\n"


def test_bind_and_unbind_answer_as_the_driver_core(make_host):
    host = make_host("a100-sriov-off", "l40s-vfio")
    pf = Paths(host, A100)
    assert errno_of(host.write_attr, pf.driver("pci-pf-stub", "bind"), A100) == errno.ENODEV
    assert errno_of(host.write_attr, pf.driver("nvidia", "bind"), A100) == errno.EBUSY
    assert errno_of(host.write_attr, pf.driver("pci-pf-stub", "unbind"), A100) == errno.ENODEV
    assert errno_of(host.write_attr, pf.driver("nvidia", "bind"), "0000:99:00.0") == errno.ENODEV
    assert errno_of(host.write_attr, pf.driver("nvidia", "unbind"), L40S_VF) == errno.EOPNOTSUPP
    host.write_attr(pf.driver("nvidia", "unbind"), A100 + "\n")
    host.write_attr(pf.attr("driver_override"), "pci-pf-stub\n")
    assert read(pf.attr("driver_override")) == "pci-pf-stub\n"
    assert pf.bound is None  # an override binds nothing by itself
    assert errno_of(host.write_attr, pf.driver("nvidia", "bind"), A100) == errno.ENODEV
    assert errno_of(host.write_attr, pf.attr("driver_override"), "x" * 4096) == errno.EINVAL
    host.write_attr(pf.driver("pci-pf-stub", "bind"), A100)
    assert pf.bound == "pci-pf-stub"
    host.write_attr(pf.attr("sriov_numvfs"), "16")
    host.write_attr(pf.driver("pci-pf-stub", "unbind"), A100)
    assert host.pci_device(A100).sriov_numvfs == 16  # the VFs outlive the unbind
    host.write_attr(pf.attr("driver_override"), "\n")
    host.write_attr(pf.driver("nvidia", "bind"), A100)
    assert pf.bound == "nvidia" and len(host.list_parents()) == 16


def test_nvidia_rebound_starts_the_board_afresh(make_host):
    """NVIDIA resets the vGPU mode when its driver takes the GPU again; no
    VF keeps a vGPU type."""
    host = make_host("l40s-vfio")
    host.set_mixed_sizes(L40S, True)
    pf = Paths(host, L40S)
    host.write_attr(pf.driver("nvidia", "unbind"), L40S)
    assert host.heterogeneous_mode(L40S)  # nothing said it yet
    host.write_attr(pf.driver("nvidia", "bind"), L40S)
    assert not host.heterogeneous_mode(L40S)
    host.set_vendor_vgpu_type(L40S_VF, 1156)
    host.write_attr(pf.driver("nvidia", "unbind"), L40S)
    host.write_attr(pf.driver("nvidia", "bind"), L40S)
    assert host.vendor_vf(L40S_VF).current_type == 0


def test_reboot_binds_nvidia_again(make_host):
    host = make_host("a100-sriov-off")
    pf = Paths(host, A100)
    host.write_attr(pf.driver("nvidia", "unbind"), A100)
    host.write_attr(pf.attr("driver_override"), "pci-pf-stub")
    host.write_attr(pf.driver("pci-pf-stub", "bind"), A100)
    host.reboot()
    assert pf.bound == "nvidia"
    assert read(pf.attr("driver_override")) == "(null)\n"


def stand_in(host, *argv):
    out, err = io.StringIO(), io.StringIO()
    code = sriov_manage.main(["--sysfs-root", host.paths.root, *argv], out, err)
    return code, out.getvalue(), err.getvalue()


def test_the_stand_in_enables_and_disables_as_nvidias_script(make_host):
    host = make_host("a100-sriov-off", "t4x8")
    assert stand_in(host, "-e", A100) == (0, f"Enabling VFs on {A100}\n", "")
    assert host.pci_device(A100).sriov_numvfs == 16 and Paths(host, A100).bound == "nvidia"
    assert stand_in(host, "-e", A100) == (0, f"GPU at {A100} already has VFs enabled.\n", "")
    assert stand_in(host, "-d", A100) == (0, f"Disabling VFs on {A100}\n", "")
    assert host.pci_device(A100).sriov_numvfs == 0
    assert stand_in(host, "-d", A100) == (0, f"GPU at {A100} already has VFs disabled.\n", "")
    # ALL: every NVIDIA GPU at function 00.0; the T4s (no SR-IOV) are skipped.
    assert stand_in(host, "-e", "ALL") == (0, f"Enabling VFs on {A100}\n", "")
    assert host.pci_device(A100).sriov_numvfs == 16


@pytest.mark.parametrize(
    "argv, expected",
    [
        (("-e", "0000:41:00.1"), (1, "", "")),  # no such NVIDIA function
        (("-e", "0000:18:00.0"), (0, "", "")),  # a T4: no SR-IOV, exit 0
        (("-e", pci_devices.NIC), (1, "", "")),  # not NVIDIA
        (("-x", A100), (1, "", sriov_manage.USAGE)),
        ((), (1, "", sriov_manage.USAGE)),
    ],
)
def test_the_stand_in_refuses_as_nvidias_script(make_host, argv, expected):
    host = make_host("a100-sriov-off", "t4x8")
    pci_devices.plant_nic(host.paths.root)
    before = pci_devices.tree_state(host.paths.root)
    assert stand_in(host, *argv) == expected
    assert pci_devices.tree_state(host.paths.root) == before


def test_the_stand_in_cannot_take_a_board_in_use(make_host):
    host = make_host("l40s-vfio")
    host.set_vendor_vgpu_type(L40S_VF, 1156)
    assert stand_in(host, "-d", L40S) == (
        1,
        f"Disabling VFs on {L40S}\n",
        f"Cannot obtain unbindLock for {L40S}\n",
    )
    assert host.pci_device(L40S).sriov_numvfs == 16


def test_the_stand_in_reports_a_refused_write_and_binds_nvidia_back(make_host):
    host = make_host("a100-sriov-off")
    total = os.path.join(host.paths.pci_device(A100), "sriov_totalvfs")
    os.chmod(total, 0o644)
    with open(total, "w") as f:
        f.write("32\n")  # more than the device takes: ERANGE
    code, out, err = stand_in(host, "-e", A100)
    assert (code, out) == (1, f"Enabling VFs on {A100}\n")
    assert err.endswith("sriov_numvfs: write error: Numerical result out of range\n")
    assert Paths(host, A100).bound == "nvidia"
    assert host.pci_device(A100).sriov_numvfs == 0


def test_the_stand_in_never_writes_what_is_not_a_fake_host(tmp_path, monkeypatch):
    monkeypatch.delenv(sriov_manage.ENV_ROOT, raising=False)
    out, err = io.StringIO(), io.StringIO()
    assert sriov_manage.main(["-e", "ALL"], out, err) == 1
    assert "no root is no fake host" in err.getvalue()
    assert sriov_manage.main(["--sysfs-root", str(tmp_path), "-e", "ALL"], out, err) == 1
    assert f"{tmp_path} is no fake host" in err.getvalue()
