"""Garbage in sysfs is reported per file and never read as a value."""

import logging
import os

from vgpu_driver import discovery
from vgpu_driver import inventory
from vgpu_driver.conf import mdev_types
from vgpu_driver.sysfs import pci_reads

T4 = "0000:18:00.0"


def corrupt(host, parent, type_id, attribute, data):
    path = os.path.join(host.paths.parent_type(parent, type_id), attribute)
    with open(path, "wb") as f:
        f.write(data)
    return os.path.realpath(path)


def tree(host, make_conf, type_id="nvidia-231"):
    config = mdev_types.from_conf(make_conf(f"[devices]\nenabled_mdev_types = {type_id}\n"))
    return inventory.compute(discovery.discover(host), config, "cn1")


def test_a_garbage_count_reserves_the_gpu_and_names_the_file(make_host, make_conf, caplog):
    host = make_host("t4x8")
    path = corrupt(host, T4, "nvidia-231", "available_instances", b"abc\n")
    caplog.set_level(logging.WARNING)
    providers = {p.gpu: p for p in tree(host, make_conf).providers}
    t4 = providers[T4]
    assert t4.reserved == t4.total == 8
    assert t4.reason == (
        f"unreadable sysfs value {path}: b'abc\\n' is unreadable "
        "(not a count); check the vendor driver"
    )
    assert f"Unreadable sysfs value: {path}" in caplog.text
    others = [p for gpu, p in providers.items() if gpu != T4]
    assert len(others) == 7 and all(p.reserved == 0 and p.reason is None for p in others)


def test_a_negative_count_is_not_a_count(make_host, make_conf):
    host = make_host("t4x8")
    corrupt(host, T4, "nvidia-231", "available_instances", b"-3\n")
    info = discovery.discover(host).gpu(T4).type_info("nvidia-231")
    assert info.available_instances == 0 and "(not a count)" in info.unreadable[0]


def test_a_binary_name_gives_no_mojibake_trait(make_host, make_conf):
    host = make_host("t4x8")
    corrupt(host, T4, "nvidia-231", "name", b"GRID \xff\xfe T4\n")
    t4 = tree(host, make_conf).by_gpu(T4)
    assert t4.traits == (
        "CUSTOM_MDEV_NVIDIA_231",
        "CUSTOM_NVIDIA_VGPU_MANAGER_550_127_06",
        "CUSTOM_OWNER_VGPU_DRIVER",
    )
    assert t4.reserved == t4.total and "(not UTF-8 text)" in t4.reason


def test_a_dangling_parent_link_is_no_device(make_host, caplog):
    host = make_host("t4x8")
    os.symlink(
        "../../devices/pci0000:99/0000:99:00.0",
        os.path.join(host.paths.parent_base(), "0000:99:00.0"),
    )
    caplog.set_level(logging.WARNING)
    assert "0000:99:00.0" not in [p.name for p in host.list_parents()]
    assert len(host.list_parents()) == 8
    assert "Skipping parent 0000:99:00.0" in caplog.text


L40S_VF = "0000:c1:00.4"


def test_vendor_type_numbers_are_plain_ascii_numbers():
    text = (
        "Available vGPU types:\n1155 : NVIDIA L40S-4Q\n-5 : Negative\n"
        "\u0661\u0662 : Arabic-Indic digits\n0123 : Leading zero\n"
        "1234567890 : Ten digits\n1156 : NVIDIA L40S-8Q\n"
    )
    assert pci_reads.parse_creatable_vgpu_types(text) == (
        (1155, "NVIDIA L40S-4Q"),
        (1156, "NVIDIA L40S-8Q"),
    )


def test_a_garbage_current_vgpu_type_leaves_the_vf_out(make_host, caplog):
    host = make_host("l40s-vfio")
    path = os.path.join(host.paths.vendor_vfio_dir(L40S_VF), "current_vgpu_type")
    caplog.set_level(logging.WARNING)
    for garbage in ("-5\n", "\u0661\n", "12abc\n"):
        with open(os.path.realpath(path), "w") as f:
            f.write(garbage)
        assert host.vendor_vf(L40S_VF) is None
        vfs = {str(vf.address) for vf in host.list_vendor_vfio()}
        assert L40S_VF not in vfs and len(vfs) == 15
    assert f"Unreadable sysfs value: {path}: '-5' is not a vGPU type number" in caplog.text


def test_a_vgpu_manager_version_that_is_no_version_is_unknown(make_host, caplog):
    """No trait is made of it (nor a migration judged by it): logged, None."""
    host = make_host("t4x8")
    assert host.vgpu_manager_version() == "550.127.06"
    path = host.paths.module_version("nvidia")
    for garbage in (b"550.127.06 beta\n", b"\xff\xfe\n", b"../../x\n", b"550\n"):
        with open(path, "wb") as f:
            f.write(garbage)
        caplog.clear()
        caplog.set_level(logging.WARNING)
        assert host.vgpu_manager_version() is None
        assert f"Unreadable sysfs value: {path}" in caplog.text
    os.remove(path)
    assert host.vgpu_manager_version() is None
