"""One nova.conf for a fleet: GPUs resolved to types by model and count."""

import json
import uuid

import pytest

from tests import confs
from tests.unit.test_cli import run  # noqa: F401 - the vgpu-manage fixture
from vgpu_driver import discovery
from vgpu_driver import driver
from vgpu_driver import inventory
from vgpu_driver.conf import fleet
from vgpu_driver.conf import mdev_types
from vgpu_driver.fake import domains

T4 = [
    "0000:18:00.0",
    "0000:19:00.0",
    "0000:35:00.0",
    "0000:36:00.0",
    "0000:e7:00.0",
    "0000:e8:00.0",
    "0000:f4:00.0",
    "0000:f5:00.0",
]
A100 = "0000:41:00.0"


def tree_of(make_conf, host, text=confs.FLEET):
    config = mdev_types.from_conf(make_conf(text))
    return inventory.compute(discovery.discover(host), config, "cn1")


def types_of(tree):
    return {p.gpu: p.type_id for p in tree.providers}


def problems(make_conf, text):
    _config, found = mdev_types.load(make_conf(text))
    return [str(p) for p in found]


def test_eight_t4_first_four_serve_the_counted_type(make_host, make_conf):
    tree = tree_of(make_conf, make_host("t4x8"))
    assert types_of(tree) == {
        **{g: "nvidia-319" for g in T4[:4]},
        **{g: "nvidia-320" for g in T4[4:]},
    }
    assert {p.gpu: p.total for p in tree.providers} == {
        **{g: 4 for g in T4[:4]},
        **{g: 2 for g in T4[4:]},
    }
    assert tree.unserved == ()


def test_same_file_serves_a100_boards_and_t4s(make_host, make_conf):
    tree = tree_of(make_conf, make_host("a100-sriov", "t4x8"))
    a100 = tree.by_gpu(A100)
    assert (a100.type_id, a100.total, a100.resource_class) == ("nvidia-468", 10, "CUSTOM_A100_4C")
    assert [p.gpu for p in tree.providers if p.type_id == "nvidia-468"] == [A100]
    assert {g: t for g, t in types_of(tree).items() if g != A100} == {
        **{g: "nvidia-319" for g in T4[:4]},
        **{g: "nvidia-320" for g in T4[4:]},
    }


def test_a_gpu_keeps_the_type_it_holds_vgpus_of(make_host, make_conf):
    host = make_host(
        "t4x8", mdevs=[{"parent": T4[0], "type": "nvidia-320", "uuid": str(uuid.uuid4())}]
    )
    types = types_of(tree_of(make_conf, host))
    assert types[T4[0]] == "nvidia-320"
    assert [g for g in T4 if types[g] == "nvidia-319"] == T4[1:5]
    assert [g for g in T4 if types[g] == "nvidia-320"] == [T4[0], *T4[5:]]


def test_explicit_address_wins_and_counts(make_host, make_conf):
    tree = tree_of(
        make_conf,
        make_host("t4x8"),
        confs.FLEET
        + f"""
    [mdev_nvidia-319]
    device_addresses = {T4[7]}
    """,
    )
    types = types_of(tree)
    assert types[T4[7]] == "nvidia-319"
    assert [g for g in T4 if types[g] == "nvidia-319"] == [*T4[:3], T4[7]]


def test_counts_full_leaves_gpus_unserved_and_says_why(make_host, make_conf):
    tree = tree_of(
        make_conf,
        make_host("t4x8"),
        """
        [devices]
        enabled_mdev_types = nvidia-319
        [mdev_nvidia-319]
        device_ids = 10de:1EB8
        gpu_count = 2
        """,
    )
    assert list(types_of(tree)) == T4[:2]
    assert dict(tree.unserved) == {
        g: "matches device_ids of nvidia-319 (gpu_count 2), all of them taken by GPUs before it"
        for g in T4[2:]
    }


def test_unmatched_models_fall_to_the_type_without_ids(make_host, make_conf):
    tree = tree_of(
        make_conf,
        make_host("a100-sriov", "t4x8"),
        """
        [devices]
        enabled_mdev_types = nvidia-468, nvidia-222
        [mdev_nvidia-468]
        device_ids = 10de:20f1
        """,
    )
    assert types_of(tree) == {A100: "nvidia-468", **{g: "nvidia-222" for g in T4}}


def test_address_only_files_keep_their_meaning(make_host, make_conf):
    config = mdev_types.from_conf(make_conf(confs.NOVA_GUIDE_M60))
    snapshot = discovery.discover(make_host("m60-multi"))
    assert config.for_host(snapshot) is config


def test_two_uncounted_types_on_one_model_is_an_error(make_conf):
    found = problems(
        make_conf,
        """
        [devices]
        enabled_mdev_types = i915-GVTg_V5_4, i915-GVTg_V5_8
        [mdev_i915-GVTg_V5_4]
        device_ids = 8086:3e92
        [mdev_i915-GVTg_V5_8]
        device_ids = 8086:3e92
        """,
    )
    assert found == [
        "error: [mdev_i915-GVTg_V5_8] device_ids = '8086:3e92': types "
        "i915-GVTg_V5_4 and i915-GVTg_V5_8 both take 8086:3e92 GPUs and neither "
        "has a gpu_count to decide; give one of them a gpu_count"
    ]


def test_uncounted_nvidia_types_on_one_model_share_its_boards(make_host, make_conf):
    """On T4s, which serve mdevs, that sharing gives each T4 no provider."""
    conf = make_conf("""
        [devices]
        enabled_mdev_types = nvidia-319, nvidia-320
        [mdev_nvidia-319]
        device_ids = 10de:1eb8
        [mdev_nvidia-320]
        device_ids = 10de:1eb8
        """)
    config, found = mdev_types.load(conf)
    assert found == []
    assert config.mixed_types == {"nvidia-319", "nvidia-320"}
    tree = inventory.compute(discovery.discover(make_host("t4x8")), config, "cn1")
    assert tree.providers == ()
    assert {why for _gpu, why in tree.unserved} == {
        "its addresses are listed under several types (nvidia-319, nvidia-320); a GPU serves "
        "one type, unless it is a board serving vendor-VFIO vGPUs, which mixes sizes, or an "
        "NVIDIA GPU in a type pool ([devices] shared_board_mode = pool): fix device_addresses"
    }


@pytest.mark.parametrize(
    "group,expected",
    [
        (
            "device_ids = 10de-1eb8",
            "error: [mdev_nvidia-319] device_ids = '10de-1eb8': not a PCI "
            "vendor:device id (e.g. 10de:1eb8, see lspci -nn)",
        ),
        (
            "gpu_count = 2",
            "error: [mdev_nvidia-319] gpu_count = 2: needs device_ids (the GPU model it counts)",
        ),
    ],
)
def test_bad_fleet_options_are_refused(make_conf, group, expected):
    text = f"[devices]\nenabled_mdev_types = nvidia-319\n[mdev_nvidia-319]\n{group}\n"
    assert problems(make_conf, text) == [expected]


def test_device_id_parsing():
    assert fleet.parse_device_id("0x10DE:0x1EB8") == "10de:1eb8"
    with pytest.raises(ValueError):
        fleet.parse_device_id("10de:1eb")


def test_allocation_and_reclaim_use_the_resolution(make_host, make_conf, tmp_path):
    host = make_host("t4x8")
    conf = make_conf(
        confs.FLEET
        + f"""
    [vgpu]
    sysfs_root = {host.paths.root}
    state_dir = {tmp_path / "state"}
    """
    )
    vgpu = driver.VGPUDriver(conf, domains.InProcessDomains(), host=host)
    provider = vgpu.provider_tree("cn1").by_gpu(T4[5])
    got = vgpu.allocate("i-1", {"rp": {"resources": {"VGPU": 2}}}, {"rp": provider})
    assert {m.type_id for m in host.list_mdevs() if m.uuid in got} == {"nvidia-320"}
    snapshot = vgpu.manager.snapshot(refresh=True)
    assert inventory.configured_types(snapshot, vgpu.manager.config)[T4[5]] == ("nvidia-320",)
    assert vgpu.provider_tree("cn1").by_gpu(T4[5]).type_id == "nvidia-320"


def test_config_check_prints_the_gpu_map(make_host, run):  # noqa: F811
    host = make_host("a100-sriov", "t4x8")
    code, out, _ = run("--sysfs-root", host.paths.root, "config", "check", conf=confs.FLEET)
    assert code == 0
    assert out.splitlines() == [
        "0000:18:00.0 (10de:1eb8) -> nvidia-319: device_ids 10de:1eb8, GPU 1 of gpu_count 4",
        "0000:19:00.0 (10de:1eb8) -> nvidia-319: device_ids 10de:1eb8, GPU 2 of gpu_count 4",
        "0000:35:00.0 (10de:1eb8) -> nvidia-319: device_ids 10de:1eb8, GPU 3 of gpu_count 4",
        "0000:36:00.0 (10de:1eb8) -> nvidia-319: device_ids 10de:1eb8, GPU 4 of gpu_count 4",
        "0000:41:00.0 (10de:20f1) -> nvidia-468: device_ids 10de:20f1",
        "0000:e7:00.0 (10de:1eb8) -> nvidia-320: device_ids 10de:1eb8",
        "0000:e8:00.0 (10de:1eb8) -> nvidia-320: device_ids 10de:1eb8",
        "0000:f4:00.0 (10de:1eb8) -> nvidia-320: device_ids 10de:1eb8",
        "0000:f5:00.0 (10de:1eb8) -> nvidia-320: device_ids 10de:1eb8",
        "ok: 3 enabled type(s), 9 mdev-capable device(s) on this host",
    ]


def test_inventory_command_uses_the_resolution(make_host, run):  # noqa: F811
    host = make_host("a100-sriov", "t4x8")
    code, out, _ = run("--sysfs-root", host.paths.root, "inventory", "-f", "json", conf=confs.FLEET)
    rows = {r["gpu"]: (r["type"], r["total"], r["resource_class"]) for r in json.loads(out)}
    assert code == 0
    assert rows == {
        **{g: ("nvidia-319", 4, "VGPU") for g in T4[:4]},
        **{g: ("nvidia-320", 2, "VGPU") for g in T4[4:]},
        A100: ("nvidia-468", 10, "CUSTOM_A100_4C"),
    }


def test_config_check_accepts_a_fleet_file_on_a_host_without_one_model(make_host, run):  # noqa: F811
    """The same file serves hosts with and without A100 boards: a model absent
    here is not a mistake, but a type no GPU of a present model offers is."""
    host = make_host("t4x8")
    code, out, _ = run("--sysfs-root", host.paths.root, "config", "check", conf=confs.FLEET)
    assert code == 0, out
    assert "nvidia-468" not in out
    assert out.splitlines()[-1] == "ok: 3 enabled type(s), 8 mdev-capable device(s) on this host"
    typo = confs.FLEET.replace("nvidia-320", "nvidia-32O")
    code, out, _ = run("--sysfs-root", host.paths.root, "config", "check", conf=typo)
    assert code == 1
    assert "nvidia-32O" in out and "no device on this host offers this type" in out
