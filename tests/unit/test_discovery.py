"""The production reader and discovery, on trees written by the fake kernel."""

import contextlib
import os
import uuid

import pytest

from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import sysfs
from vgpu_driver.sysfs import base
from vgpu_driver.sysfs import linux

PROFILE_SHAPES = {
    # profile: (GPU addresses, mode, parents per GPU, types per parent)
    "t4x8": (
        [
            "0000:18:00.0",
            "0000:19:00.0",
            "0000:35:00.0",
            "0000:36:00.0",
            "0000:e7:00.0",
            "0000:e8:00.0",
            "0000:f4:00.0",
            "0000:f5:00.0",
        ],
        "mdev",
        1,
        17,
    ),
    "a100-sriov": (["0000:41:00.0"], "mdev", 16, 6),
    "m60-multi": (["0000:84:00.0", "0000:85:00.0", "0000:86:00.0", "0000:87:00.0"], "mdev", 1, 11),
    "mtty": (["mtty_mtty"], "virtual", 1, 2),
    "l40s-vfio": (["0000:c1:00.0"], "vendor-vfio", 16, 6),
}


@pytest.mark.parametrize("profile", sorted(PROFILE_SHAPES))
def test_every_profile_is_discovered(make_host, profile):
    addresses, mode, parents, types = PROFILE_SHAPES[profile]
    host = make_host(profile)
    snapshot = discovery.discover(sysfs.open_host(host.paths.root))
    assert [g.address for g in snapshot.gpus] == addresses
    for gpu in snapshot.gpus:
        assert gpu.mode == mode
        assert len(gpu.parents) == parents
        assert all(len(p.types) == types for p in gpu.parents)
    assert snapshot.mdevs == ()


def test_the_reader_is_the_production_one(make_host, tmp_path):
    host = make_host("t4x8")
    assert type(sysfs.open_host(host.paths.root)).list_parents is linux.LinuxSysfs.list_parents
    for landmark in ("bus", "class"):
        (tmp_path / "plain" / landmark).mkdir(parents=True)
    assert type(sysfs.open_host(str(tmp_path / "plain"))) is linux.LinuxSysfs


def test_t4_types_carry_the_vendor_description(make_host):
    host = make_host("t4x8")
    parent = host.list_parents()[0]
    t4_16c = parent.type("nvidia-321")
    assert (t4_16c.name, t4_16c.device_api) == ("GRID T4-16C", "vfio-pci")
    assert (t4_16c.framebuffer_mb, t4_16c.max_instance) == (16384, 1)
    assert t4_16c.attributes["max_resolution"] == "4096x2160"


def test_mdevs_are_resolved_through_their_links(make_host):
    host = make_host("a100-sriov", "t4x8")
    ids = [str(uuid.uuid4()) for _ in range(3)]
    host.create_mdev("0000:41:00.5", "nvidia-469", ids[0])
    host.create_mdev("0000:41:01.0", "nvidia-469", ids[1])
    host.create_mdev("0000:e7:00.0", "nvidia-319", ids[2])
    snapshot = discovery.discover(host)
    assert {(m.uuid, m.parent, m.type_id) for m in snapshot.mdevs} == {
        (ids[0], "0000:41:00.5", "nvidia-469"),
        (ids[1], "0000:41:01.0", "nvidia-469"),
        (ids[2], "0000:e7:00.0", "nvidia-319"),
    }
    a100 = snapshot.gpu("0000:41:00.0")
    assert a100.vgpu_types_in_use() == {"nvidia-469": 2}
    assert snapshot.gpu_of_parent("0000:41:01.0") is a100
    assert snapshot.gpu("0000:41:01.0") is a100
    assert a100.pci.sriov_totalvfs == 16 and a100.pci.vendor == "0x10de"


def test_vendor_vfio_vgpus_are_seen(make_host):
    host = make_host("l40s-vfio")
    host.set_vendor_vgpu_type("0000:c1:00.4", 1158)
    gpu = discovery.discover(host).gpus[0]
    assert gpu.vgpu_types_in_use() == {"nvidia-1158": 1}
    assert gpu.parents[0].current_vgpu_type == "nvidia-1158"
    assert gpu.type_info("nvidia-1158").name == "NVIDIA L40S-16Q"


def test_unsafe_entries_in_the_tree_are_skipped(make_host, caplog):
    host = make_host("t4x8")
    os.mkdir(host.paths.join("bus", "mdev", "devices", "not-a-uuid"))
    os.mkdir(os.path.join(host.paths.parent_types("0000:18:00.0"), "bad name"))
    assert host.list_mdevs() == []
    assert len(host.list_parents()[0].types) == 17
    assert "not-a-uuid" in caplog.text and "bad name" in caplog.text


def test_descriptions_and_creatable_lists_parse_leniently():
    assert base.parse_description("num_heads=4, framebuffer=2048M\nmax_instance=8") == {
        "num_heads": "4",
        "framebuffer": "2048M",
        "max_instance": "8",
    }
    assert base.parse_description("Single port serial") == {}
    assert base.framebuffer_mb("1G") == 1024 and base.framebuffer_mb("x") is None
    assert linux.parse_creatable_vgpu_types(
        "ID    : vGPU Name\n1145  : NVIDIA L40S-1B\n1146 NVIDIA L40S-2B\n"
    ) == ((1145, "NVIDIA L40S-1B"), (1146, "NVIDIA L40S-2B"))


def test_a_sysfs_without_gpus_is_an_empty_host(tmp_path):
    for landmark in ("bus", "class"):
        (tmp_path / landmark).mkdir()
    snapshot = discovery.discover(sysfs.open_host(str(tmp_path)))
    assert snapshot.gpus == () and snapshot.mdevs == ()


@pytest.mark.parametrize(
    "make_root, reason",
    [
        (lambda p: p / "missing", "does not exist"),
        (lambda p: (p / "file").write_text("") or p / "file", "is not a directory"),
        (lambda p: p, "has no bus/ and no class/"),
        (lambda p: (p / "bus").mkdir() or p, "has no class/"),
    ],
)
def test_an_impossible_root_is_refused_not_read_as_empty(tmp_path, make_root, reason):
    root = make_root(tmp_path)
    with pytest.raises(exception.InvalidSysfsRoot, match=reason):
        linux.LinuxSysfs(str(root))


@pytest.fixture
def opens():
    """A context in which every path given to ``os.open`` is recorded, in
    the list it yields: what a read opened, and only that read."""

    @contextlib.contextmanager
    def counting():
        opened = []
        real_open = os.open

        def counting_open(path, *args, **kwargs):
            opened.append(os.fsdecode(path))
            return real_open(path, *args, **kwargs)

        os.open = counting_open
        try:
            yield opened
        finally:
            os.open = real_open

    return counting


def test_the_vfs_a_read_found_are_not_probed_for_sr_iov(make_host, opens):
    """A VF has no SR-IOV files (drivers/pci/iov.c shows them on PFs only):
    the VFs read as parents in the same pass are not opened for them, and
    the PF is still found."""
    host = make_host("a100-sriov")
    reader = sysfs.open_host(host.paths.root)
    with opens() as opened:
        snapshot = discovery.discover(reader)
    vfs = {p.name for p in snapshot.gpu("0000:41:00.0").parents}
    probed = {os.path.basename(os.path.dirname(p)) for p in opened if p.endswith("/sriov_totalvfs")}
    assert len(vfs) == 16 and not probed & vfs
    assert "0000:41:00.0" in probed and snapshot.gpu("0000:41:00.0").sriov


def test_a_read_for_some_types_reads_only_theirs(make_host, opens):
    """The inventory's read opens the attributes of the configured types
    only; the others are still listed, and the tree is the same."""
    host = make_host("a100-sriov")
    reader = sysfs.open_host(host.paths.root)
    full = discovery.discover(reader)
    with opens() as opened:
        some = discovery.discover(reader, frozenset({"nvidia-468"}))
    type_files = [p for p in opened if "/mdev_supported_types/" in p]
    assert type_files and all("/mdev_supported_types/nvidia-468/" in p for p in type_files)
    for gpu_full, gpu_some in zip(full.gpus, some.gpus, strict=True):
        for p_full, p_some in zip(gpu_full.parents, gpu_some.parents, strict=True):
            assert p_some.type_ids == p_full.type_ids
            assert [t.type_id for t in p_some.types] == ["nvidia-468"]
            assert p_some.type("nvidia-468") == p_full.type("nvidia-468")
            assert all(p_some.lists(t) for t in p_full.type_ids)
            assert not p_some.lists("nvidia-999")
