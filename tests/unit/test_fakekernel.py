"""The fake kernel answers writes the way the kernel and NVIDIA's driver do."""

import errno
import os
import threading
import time
import types
import uuid

import pytest

from vgpu_driver import exception
from vgpu_driver.fake import mdev_parents
from vgpu_driver.sysfs import linux

A100_VFS = [f"0000:41:{d:02x}.{f}" for d in range(3) for f in range(8)][4:20]


def new_uuid():
    return str(uuid.uuid4())


def available(host, parent, type_id):
    for info in host.list_parents():
        if info.name == parent:
            return info.type(type_id).available_instances
    raise AssertionError(f"no parent {parent}")


def create_file(host, parent, type_id):
    return os.path.join(host.paths.parent_type(parent, type_id), "create")


def assert_errno(code, func, *args):
    with pytest.raises(OSError) as caught:
        func(*args)
    assert caught.value.errno == code, os.strerror(caught.value.errno)


class TestLayout:
    def test_links_are_relative_and_resolve_into_devices(self, make_host):
        host = make_host("a100-sriov")
        uid = new_uuid()
        host.create_mdev("0000:41:00.4", "nvidia-468", uid)
        for link in (
            host.paths.parent("0000:41:00.4"),
            host.paths.mdev(uid),
            host.paths.pci_device("0000:41:00.4"),
        ):
            assert not os.path.isabs(os.readlink(link))
            assert os.path.realpath(link).startswith(host.paths.join("devices") + os.sep)
        vf = os.path.realpath(host.paths.parent("0000:41:00.4"))
        assert os.path.realpath(os.path.join(vf, "physfn")).endswith("/0000:41:00.0")
        assert os.path.realpath(os.path.join(vf, uid, "mdev_type")).endswith(
            "mdev_supported_types/nvidia-468"
        )
        assert os.path.islink(
            os.path.join(vf, "mdev_supported_types", "nvidia-468", "devices", uid)
        )

    def test_sriov_attributes(self, make_host):
        host = make_host("a100-sriov")
        pf = host.pci_device("0000:41:00.0")
        assert (pf.sriov_totalvfs, pf.sriov_numvfs) == (16, 16)
        assert [str(vf) for vf in pf.virtfns] == A100_VFS
        assert "0000:41:00.0" not in [p.name for p in host.list_parents()]

    def test_mtty_parent_is_virtual(self, make_host):
        host = make_host("mtty")
        (parent,) = host.list_parents()
        assert parent.name == "mtty" and parent.address is None
        assert parent.device_path.endswith("devices/virtual/mtty/mtty")


class TestCreate:
    @pytest.mark.parametrize(
        "value",
        [
            "",
            "1234",
            new_uuid()[:35],
            new_uuid() + "\n\n",
            "z" * 36,
            "12345678-1234-1234-1234-1234567890-a",
        ],
    )
    def test_malformed_uuid_is_einval(self, make_host, value):
        host = make_host("t4x8")
        assert_errno(
            errno.EINVAL, host.write_attr, create_file(host, "0000:18:00.0", "nvidia-222"), value
        )
        assert host.list_mdevs() == []

    def test_trailing_newline_and_upper_case_are_accepted(self, make_host):
        host = make_host("t4x8")
        uid = new_uuid()
        host.write_attr(create_file(host, "0000:18:00.0", "nvidia-222"), uid.upper() + "\n")
        assert [m.uuid for m in host.list_mdevs()] == [uid]

    def test_duplicate_uuid_on_any_parent_is_eexist(self, make_host):
        host = make_host("t4x8")
        uid = new_uuid()
        host.create_mdev("0000:18:00.0", "nvidia-222", uid)
        with pytest.raises(exception.MdevWriteError) as caught:
            host.create_mdev("0000:19:00.0", "nvidia-222", uid)
        assert caught.value.errno == errno.EEXIST
        assert "already exists" in str(caught.value)

    def test_count_goes_down_and_back_up(self, make_host):
        host = make_host("t4x8")
        uids = [new_uuid() for _ in range(3)]
        for uid in uids:
            host.create_mdev("0000:18:00.0", "nvidia-223", uid)
        assert available(host, "0000:18:00.0", "nvidia-223") == 5
        host.remove_mdev(uids[0])
        assert available(host, "0000:18:00.0", "nvidia-223") == 6

    def test_zero_capacity_is_eusers_on_nvidia(self, make_host):
        host = make_host("t4x8")
        for _ in range(16):
            host.create_mdev("0000:18:00.0", "nvidia-222", new_uuid())
        assert available(host, "0000:18:00.0", "nvidia-222") == 0
        with pytest.raises(exception.MdevWriteError) as caught:
            host.create_mdev("0000:18:00.0", "nvidia-222", new_uuid())
        assert caught.value.errno == errno.EUSERS
        assert "no free instance" in str(caught.value)

    def test_zero_capacity_is_enospc_on_mtty(self, make_host):
        host = make_host("mtty")
        for _ in range(12):
            host.create_mdev("mtty", "mtty-2", new_uuid())
        assert available(host, "mtty", "mtty-1") == 0
        with pytest.raises(exception.MdevWriteError) as caught:
            host.create_mdev("mtty", "mtty-1", new_uuid())
        assert caught.value.errno == errno.ENOSPC

    def test_mtty_types_share_ports(self, make_host):
        host = make_host("mtty")
        host.create_mdev("mtty", "mtty-2", new_uuid())
        host.create_mdev("mtty", "mtty-1", new_uuid())
        assert available(host, "mtty", "mtty-1") == 21
        assert available(host, "mtty", "mtty-2") == 10

    def test_unregistered_parent_is_enodev(self, make_host):
        host = make_host("t4x8")
        # A writer that resolved the device before the driver began to unbind.
        path = os.path.realpath(create_file(host, "0000:18:00.0", "nvidia-222"))
        host.unregister_parent("0000:18:00.0")
        assert_errno(errno.ENODEV, host.write_attr, path, new_uuid())

    def test_vanished_parent_is_enodev(self, make_host):
        host = make_host("a100-sriov")
        host.set_vfs("0000:41:00.0", 0)
        with pytest.raises(exception.MdevWriteError) as caught:
            host.create_mdev("0000:41:00.4", "nvidia-468", new_uuid())
        assert caught.value.errno == errno.ENODEV
        assert "VFs are enabled" in str(caught.value)

    def test_read_only_attribute_is_eio(self, make_host):
        host = make_host("t4x8")
        path = os.path.join(
            host.paths.parent_type("0000:18:00.0", "nvidia-222"), "available_instances"
        )
        assert_errno(errno.EIO, host.write_attr, path, "3")

    def test_writes_outside_the_root_are_refused(self, make_host, tmp_path):
        host = make_host("t4x8")
        outside = tmp_path / "elsewhere"
        outside.write_text("")
        with pytest.raises(exception.InvalidSysfsName):
            host.write_attr(str(outside), "1")


class TestTimeSliced:
    def test_one_type_at_a_time(self, make_host):
        host = make_host("t4x8")
        host.create_mdev("0000:18:00.0", "nvidia-231", new_uuid())
        assert available(host, "0000:18:00.0", "nvidia-231") == 7
        assert available(host, "0000:18:00.0", "nvidia-222") == 0
        assert available(host, "0000:19:00.0", "nvidia-222") == 16
        with pytest.raises(exception.MdevWriteError) as caught:
            host.create_mdev("0000:18:00.0", "nvidia-222", new_uuid())
        assert caught.value.errno == errno.EUSERS

    def test_type_frees_up_when_its_last_mdev_goes(self, make_host):
        host = make_host("t4x8")
        uid = new_uuid()
        host.create_mdev("0000:18:00.0", "nvidia-231", uid)
        host.remove_mdev(uid)
        assert available(host, "0000:18:00.0", "nvidia-222") == 16


class TestSriov:
    def test_each_vf_hosts_one_vgpu(self, make_host):
        host = make_host("a100-sriov")
        host.create_mdev(A100_VFS[0], "nvidia-468", new_uuid())
        assert available(host, A100_VFS[0], "nvidia-468") == 0
        with pytest.raises(exception.MdevWriteError):
            host.create_mdev(A100_VFS[0], "nvidia-468", new_uuid())

    def test_siblings_only_offer_the_same_framebuffer_size(self, make_host):
        host = make_host("a100-sriov")
        assert all(
            available(host, A100_VFS[1], t) == 1 for t in ("nvidia-468", "nvidia-469", "nvidia-473")
        )
        host.create_mdev(A100_VFS[0], "nvidia-471", new_uuid())  # A100-10C, 10240M
        offered = {
            t.type_id: t.available_instances
            for p in host.list_parents()
            if p.name == A100_VFS[1]
            for t in p.types
        }
        assert offered == {
            "nvidia-468": 0,
            "nvidia-469": 0,
            "nvidia-470": 0,
            "nvidia-471": 1,
            "nvidia-472": 0,
            "nvidia-473": 0,
        }
        with pytest.raises(exception.MdevWriteError):
            host.create_mdev(A100_VFS[1], "nvidia-468", new_uuid())

    def test_per_gpu_maximum_caps_the_vfs(self, make_host):
        host = make_host("a100-sriov")
        for vf in A100_VFS[:10]:
            host.create_mdev(vf, "nvidia-468", new_uuid())  # A100-4C: 10 per GPU
        assert [available(host, vf, "nvidia-468") for vf in A100_VFS[10:]] == [0] * 6
        with pytest.raises(exception.MdevWriteError) as caught:
            host.create_mdev(A100_VFS[10], "nvidia-468", new_uuid())
        assert caught.value.errno == errno.EUSERS

    def test_numvfs_follows_the_pci_core(self, make_host):
        """Under pci-pf-stub (the driver NVIDIA's script moves the PF to)."""
        host = make_host("a100-sriov")
        pf = host.paths.pci_device("0000:41:00.0")
        pf_numvfs = os.path.join(pf, "sriov_numvfs")
        assert_errno(errno.ENOENT, host.write_attr, pf_numvfs, "0")  # nvidia's
        host.write_attr(host.paths.join("bus/pci/drivers/nvidia/unbind"), "0000:41:00.0")
        host.write_attr(os.path.join(pf, "driver_override"), "pci-pf-stub\n")
        host.write_attr(host.paths.join("bus/pci/drivers/pci-pf-stub/bind"), "0000:41:00.0")
        assert_errno(errno.ERANGE, host.write_attr, pf_numvfs, "17")
        assert_errno(errno.EINVAL, host.write_attr, pf_numvfs, "four")
        host.write_attr(pf_numvfs, "16")  # as it is: no-op
        assert_errno(errno.EBUSY, host.write_attr, pf_numvfs, "8")
        host.write_attr(pf_numvfs, "0")
        assert host.list_parents() == []
        assert not os.path.lexists(host.paths.pci_device(A100_VFS[0]))
        host.write_attr(pf_numvfs, "4")
        assert [p.name for p in host.list_parents()] == A100_VFS[:4]
        assert linux.read_attr(pf_numvfs) == "4"


class TestRemove:
    def test_zero_is_a_no_op_and_garbage_is_einval(self, make_host):
        host = make_host("t4x8")
        uid = new_uuid()
        host.create_mdev("0000:18:00.0", "nvidia-222", uid)
        remove = os.path.join(host.paths.mdev(uid), "remove")
        host.write_attr(remove, "0")
        assert_errno(errno.EINVAL, host.write_attr, remove, "yes")
        assert [m.uuid for m in host.list_mdevs()] == [uid]
        host.write_attr(remove, "1\n")
        assert host.list_mdevs() == []
        assert not os.path.lexists(host.paths.mdev(uid))

    def test_remove_blocks_while_a_guest_holds_the_device(self, make_host, monkeypatch):
        host = make_host("t4x8")
        uid = new_uuid()
        host.create_mdev("0000:18:00.0", "nvidia-222", uid)
        host.hold(uid)
        waiting = threading.Event()

        def sleep(seconds):  # the remover found the device held and waits
            waiting.set()
            time.sleep(seconds)

        monkeypatch.setattr(mdev_parents, "time", types.SimpleNamespace(sleep=sleep))
        remover = threading.Thread(target=host.remove_mdev, args=(uid,))
        remover.start()
        assert waiting.wait(5), "the remove did not wait for the guest"
        assert remover.is_alive() and [m.uuid for m in host.list_mdevs()] == [uid]
        host.release(uid)
        remover.join(timeout=5)
        assert not remover.is_alive() and host.list_mdevs() == []


class TestVendorVfio:
    def test_current_vgpu_type_creates_and_clears(self, make_host):
        host = make_host("l40s-vfio")
        first, second = host.list_vendor_vfio()[:2]
        assert (1155, "NVIDIA L40S-4Q") in first.creatable
        host.set_vendor_vgpu_type(first.address, 1156)  # L40S-8Q
        vfs = {vf.address: vf for vf in host.list_vendor_vfio()}
        assert vfs[first.address].current_type == 1156
        assert vfs[first.address].creatable == ()
        assert [n for n, _ in vfs[second.address].creatable] == [1156]
        with pytest.raises(exception.MdevWriteError) as caught:
            host.set_vendor_vgpu_type(second.address, 1155)
        assert caught.value.errno == errno.EINVAL
        host.set_vendor_vgpu_type(first.address, 0)
        assert len(host.list_vendor_vfio()[1].creatable) == 6


def test_reboot_drops_mdevs_and_vfs(make_host):
    host = make_host("a100-sriov", "t4x8")
    host.create_mdev(A100_VFS[0], "nvidia-468", new_uuid())
    host.create_mdev("0000:18:00.0", "nvidia-222", new_uuid())
    host.reboot()
    assert host.list_mdevs() == []
    assert [p.name for p in host.list_parents()][:1] == ["0000:18:00.0"]
    assert host.pci_device("0000:41:00.0").sriov_numvfs == 0
    assert available(host, "0000:18:00.0", "nvidia-222") == 16


def test_writes_from_another_process_see_the_same_kernel(make_host):
    host = make_host("t4x8")
    uid = new_uuid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        try:
            type(host)(host.paths.root).create_mdev("0000:18:00.0", "nvidia-222", uid)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert [m.uuid for m in host.list_mdevs()] == [uid]
    assert available(host, "0000:18:00.0", "nvidia-222") == 15
