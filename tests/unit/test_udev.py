"""What a udev event means for the GPUs, and the polling stand-in."""

from vgpu_driver.fake import uevents
from vgpu_driver.sysfs import changes
from vgpu_driver.sysfs import linux
from vgpu_driver.sysfs import udev

T4 = "0000:18:00.0"
A100 = "0000:41:00.0"
A100_VF = "0000:41:00.4"
MDEV = "4b20d080-1b54-4048-85b3-a6a62d165c01"


def test_an_mdev_event_names_its_parent_and_gpu(make_host):
    host = make_host("a100-sriov")
    devpath = f"/devices/pci0000:41/{A100_VF}/{MDEV}"
    assert udev.parse_event(host.paths.root, "mdev", devpath, {}) == (A100_VF, A100)


def test_a_vf_event_names_its_gpu_while_the_vf_exists(make_host):
    host = make_host("a100-sriov")
    devpath = f"/devices/pci0000:41/{A100_VF}"
    props = {"PCI_SLOT_NAME": A100_VF}
    assert udev.parse_event(host.paths.root, "pci", devpath, props) == (A100_VF, A100)
    host.set_vfs(A100, 0)
    # Gone: the caller knows which GPU the VF was part of.
    assert udev.parse_event(host.paths.root, "pci", devpath, props) == (A100_VF, None)


def test_a_time_sliced_gpu_is_its_own_gpu(make_host):
    host = make_host("t4x8")
    assert udev.parse_event(host.paths.root, "pci", f"/devices/pci0000:18/{T4}", {}) == (T4, T4)


def test_events_of_no_gpu_are_ignored(make_host):
    root = make_host("t4x8").paths.root
    assert udev.parse_event(root, "pci", "/devices/pci0000:00", {}) is None
    assert udev.parse_event(root, "mdev", f"/devices/pci0000:18/{T4}/not-a-uuid", {}) is None
    assert udev.parse_event(root, "net", "/devices/virtual/net/lo", {}) is None


def test_no_udev_means_polling_and_says_why(make_host):
    host = make_host("t4x8")
    assert udev.start(host, "off").reason == "[vgpu] hotplug_events is off"
    # A tree that is not the kernel's sysfs: udev speaks of other devices.
    polling = udev.start(linux.LinuxSysfs(host.paths.root), "auto")
    assert isinstance(polling, changes.Polling) and "is not the kernel's" in polling.reason
    assert polling.take_changes().everything
    assert polling.waiter().wait(0.01) is False
    assert isinstance(udev.start(object(), "udev"), changes.Polling)


def test_the_udev_message_header_is_libudevs():
    data = uevents.message("add", "/devices/x", "pci", {"A": "b"})
    assert data[:8] == b"libudev\0" and data[8:12] == bytes.fromhex("feedcafe")
    offset = int.from_bytes(data[16:20], "little")
    assert offset == 40 and data[offset:].split(b"\0")[:3] == [
        b"ACTION=add",
        b"DEVPATH=/devices/x",
        b"SUBSYSTEM=pci",
    ]
    # The subsystem's hash, in network order, for libudev's socket filter
    # (tests/functional/test_hotplug.py shows the filter lets it through).
    assert data[24:28] == uevents.murmurhash2(b"pci").to_bytes(4, "big")
