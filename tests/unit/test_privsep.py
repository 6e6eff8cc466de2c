"""The privileged entry point writes only whitelisted attributes under the root."""

import os

import pytest

from vgpu_driver import exception
from vgpu_driver import privsep


@pytest.fixture
def in_process():
    privsep.sysfs_writer.set_client_mode(False)
    yield
    privsep.sysfs_writer.set_client_mode(True)


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "sys"
    type_dir = root / "devices" / "pci0000:84" / "0000:84:00.0" / "mdev_supported_types" / "t"
    type_dir.mkdir(parents=True)
    (type_dir / "create").write_text("")
    (type_dir / "available_instances").write_text("4\n")
    (root / "class" / "mdev_bus").mkdir(parents=True)
    os.symlink("../../devices/pci0000:84/0000:84:00.0", root / "class/mdev_bus/0000:84:00.0")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "create").write_text("")
    return root, type_dir


def test_writes_a_whitelisted_attribute_through_links(in_process, tree):
    root, type_dir = tree
    privsep.write_attr(str(root), str(root / "class/mdev_bus/0000:84:00.0"
                                      "/mdev_supported_types/t/create"), "some-uuid")
    assert (type_dir / "create").read_text() == "some-uuid"


def test_refuses_other_attributes(in_process, tree):
    root, type_dir = tree
    with pytest.raises(exception.InvalidSysfsName, match="sysfs attribute"):
        privsep.write_attr(str(root), str(type_dir / "available_instances"), "99")
    assert (type_dir / "available_instances").read_text() == "4\n"


def test_refuses_paths_that_leave_the_root(in_process, tree, tmp_path):
    root, _ = tree
    os.symlink(tmp_path / "outside", root / "escape")
    for path in (tmp_path / "outside" / "create", root / "escape" / "create",
                 root / ".." / "outside" / "create"):
        with pytest.raises(exception.InvalidSysfsName, match="outside"):
            privsep.write_attr(str(root), str(path), "x")
    assert (tmp_path / "outside" / "create").read_text() == ""
