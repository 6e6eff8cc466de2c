"""Snapshot + config -> one provider per physical GPU, with honest capacity."""

import uuid

import pytest

from tests import confs
from vgpu_driver import claims
from vgpu_driver import discovery
from vgpu_driver import inventory
from vgpu_driver.conf import mdev_types

A100_VFS = [f"0000:41:{d:02x}.{f}" for d in range(3) for f in range(8)][4:20]
MANAGER_550 = "CUSTOM_NVIDIA_VGPU_MANAGER_550_127_06"  # the shipped profiles' manager
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


@pytest.fixture
def tree_of(make_conf):
    def compute(host, conf_text, nodename="cn1", in_use=None):
        config = mdev_types.from_conf(make_conf(conf_text))
        snapshot = discovery.discover(host)
        # What NVML says of vendor-VFIO boards, as nova-compute's update reads it.
        rooms = inventory.read_rooms(host, snapshot, config)
        tree = inventory.compute(snapshot, config, nodename, in_use, rooms=rooms)
        # The update's read, of the configured types only, gives the same tree.
        assert (
            inventory.compute(
                discovery.discover(host, frozenset(config.enabled)),
                config,
                nodename,
                in_use,
                rooms=rooms,
            )
            == tree
        )
        return tree

    return compute


def totals(tree):
    return {p.gpu: (p.total, p.reserved) for p in tree.providers}


def test_a100_is_one_provider_of_ten_not_sixteen(make_host, tree_of):
    tree = tree_of(
        make_host("a100-sriov"),
        """
        [devices]
        enabled_mdev_types = nvidia-468
        """,
    )
    (provider,) = tree.providers
    assert provider.name == "cn1_pci_0000_41_00_0"
    assert (provider.total, provider.reserved, provider.max_unit) == (10, 0, 10)
    assert provider.parent_provider == "cn1"
    assert provider.traits == (
        "CUSTOM_MDEV_NVIDIA_468",
        MANAGER_550,
        "CUSTOM_OWNER_VGPU_DRIVER",
        "CUSTOM_VGPU_NVIDIA_A100_4C",
    )
    assert provider.inventory() == {
        "VGPU": {
            "total": 10,
            "reserved": 0,
            "min_unit": 1,
            "max_unit": 10,
            "step_size": 1,
            "allocation_ratio": 1.0,
        }
    }


@pytest.mark.parametrize(
    "type_id,expected",
    [
        ("nvidia-473", 1),
        ("nvidia-472", 2),
        ("nvidia-471", 4),
        ("nvidia-470", 5),
        ("nvidia-469", 8),
        ("nvidia-468", 10),
    ],
)
def test_a100_per_gpu_maxima(make_host, tree_of, type_id, expected):
    tree = tree_of(make_host("a100-sriov"), f"[devices]\nenabled_mdev_types = {type_id}\n")
    assert totals(tree) == {"0000:41:00.0": (expected, 0)}


def test_a100_existing_vgpus_count_in_the_total(make_host, tree_of):
    host = make_host(
        "a100-sriov",
        mdevs=[
            {"parent": vf, "type": "nvidia-469", "uuid": str(uuid.uuid4())} for vf in A100_VFS[:3]
        ],
    )
    tree = tree_of(host, "[devices]\nenabled_mdev_types = nvidia-469\n")
    assert totals(tree) == {"0000:41:00.0": (8, 0)}


def test_vf_address_in_config_serves_the_whole_gpu(make_host, tree_of):
    tree = tree_of(
        make_host("a100-sriov", "t4x8"),
        """
        [devices]
        enabled_mdev_types = nvidia-468, nvidia-222
        [mdev_nvidia-468]
        device_addresses = 0000:41:00.6
        [mdev_nvidia-222]
        device_addresses = 0000:18:00.0
        """,
    )
    assert totals(tree) == {"0000:18:00.0": (16, 0), "0000:41:00.0": (10, 0)}
    assert len(tree.unserved) == 7


def test_vfs_of_one_gpu_under_two_types_are_refused(make_host, tree_of):
    tree = tree_of(
        make_host("a100-sriov"),
        """
        [devices]
        enabled_mdev_types = nvidia-468, nvidia-469
        [mdev_nvidia-468]
        device_addresses = 0000:41:00.4
        [mdev_nvidia-469]
        device_addresses = 0000:41:00.5
        """,
    )
    assert tree.providers == ()
    assert tree.unserved == (
        (
            "0000:41:00.0",
            "its addresses are listed under several "
            "types (nvidia-468, nvidia-469); a GPU serves one type, unless "
            "it is a board serving vendor-VFIO vGPUs, which mixes sizes, or an "
            "NVIDIA GPU in a type pool ([devices] shared_board_mode = pool): "
            "fix device_addresses",
        ),
    )


def test_m60_as_in_nova_guide(make_host, tree_of):
    tree = tree_of(make_host("m60-multi"), confs.NOVA_GUIDE_M60)
    assert [(p.name, p.type_id, p.total) for p in tree.providers] == [
        ("cn1_pci_0000_84_00_0", "nvidia-35", 16),
        ("cn1_pci_0000_85_00_0", "nvidia-35", 16),
        ("cn1_pci_0000_86_00_0", "nvidia-36", 8),
    ]
    assert tree.provider("cn1_pci_0000_87_00_0") is None
    assert [gpu for gpu, _ in tree.unserved] == ["0000:87:00.0"]


def test_t4x8_default_type_and_custom_class(make_host, tree_of):
    tree = tree_of(
        make_host("t4x8"),
        """
        [devices]
        enabled_mdev_types = nvidia-232
        [mdev_nvidia-232]
        mdev_class = CUSTOM_T4_4Q
        """,
    )
    assert totals(tree) == {gpu: (4, 0) for gpu in T4}
    assert {p.resource_class for p in tree.providers} == {"CUSTOM_T4_4Q"}
    assert tree.providers[0].traits == (
        "CUSTOM_MDEV_NVIDIA_232",
        MANAGER_550,
        "CUSTOM_OWNER_VGPU_DRIVER",
        "CUSTOM_VGPU_GRID_T4_4Q",
    )


def test_mtty_sample(make_host, tree_of):
    host = make_host(
        "mtty", mdevs=[{"parent": "mtty", "type": "mtty-1", "uuid": str(uuid.uuid4())}]
    )
    tree = tree_of(
        host,
        """
        [devices]
        enabled_mdev_types = mtty-2
        [mdev_mtty-2]
        device_addresses = mtty_mtty
        """,
    )
    (provider,) = tree.providers
    assert (provider.name, provider.total, provider.reserved) == ("cn1_mtty_mtty", 11, 0)


def test_gpu_blocked_by_another_type_reserves_everything(make_host, tree_of):
    host = make_host(
        "t4x8",
        mdevs=[
            {"parent": "0000:18:00.0", "type": "nvidia-222", "uuid": str(uuid.uuid4())}
            for _ in range(2)
        ],
    )
    tree = tree_of(host, "[devices]\nenabled_mdev_types = nvidia-231\n")
    blocked = tree.by_gpu("0000:18:00.0")
    assert (blocked.total, blocked.reserved) == (8, 8)
    assert blocked.reason == (
        "blocked by existing mdevs (2 of nvidia-222); remove the unused ones to serve nvidia-231"
    )
    assert blocked.reserved_for == ((inventory.BLOCKED, 8),)
    assert tree.by_gpu("0000:19:00.0").reserved_for == ()
    # Once guests are known to use them, the GPU is draining instead.
    in_use = {m.uuid for m in host.list_mdevs()}
    draining = tree_of(host, "[devices]\nenabled_mdev_types = nvidia-231\n", in_use=in_use).by_gpu(
        "0000:18:00.0"
    )
    assert draining.reason.startswith("draining: ")
    assert draining.reserved_for == ((inventory.DRAINING, 8),)
    assert (tree.by_gpu("0000:19:00.0").total, tree.by_gpu("0000:19:00.0").reserved) == (8, 0)


def test_sriov_gpu_blocked_by_another_size(make_host, tree_of):
    host = make_host(
        "a100-sriov",
        mdevs=[{"parent": A100_VFS[0], "type": "nvidia-471", "uuid": str(uuid.uuid4())}],
    )
    tree = tree_of(host, "[devices]\nenabled_mdev_types = nvidia-468\n")
    (provider,) = tree.providers
    assert (provider.total, provider.reserved) == (10, 10)
    assert "1 of nvidia-471" in provider.reason


def test_max_instances_caps_partially_in_address_order(make_host, tree_of):
    host = make_host(
        "t4x8", mdevs=[{"parent": "0000:f5:00.0", "type": "nvidia-222", "uuid": str(uuid.uuid4())}]
    )
    tree = tree_of(
        host,
        """
        [devices]
        enabled_mdev_types = nvidia-222
        [mdev_nvidia-222]
        max_instances = 20
        """,
    )
    expected = {gpu: (16, 16) for gpu in T4}
    expected.update({"0000:18:00.0": (16, 0), "0000:19:00.0": (4, 0), "0000:f5:00.0": (1, 0)})
    assert totals(tree) == expected
    assert len(tree.providers) == 8
    assert "max_instances=20" in tree.by_gpu("0000:35:00.0").reason
    assert tree.by_gpu("0000:35:00.0").reserved_for == ((inventory.MAX_INSTANCES, 16),)
    assert tree.by_gpu("0000:19:00.0").reserved_for == ()


def test_max_instances_never_hides_existing_mdevs(make_host, tree_of):
    host = make_host(
        "t4x8",
        mdevs=[
            {"parent": "0000:18:00.0", "type": "nvidia-223", "uuid": str(uuid.uuid4())}
            for _ in range(3)
        ],
    )
    tree = tree_of(
        host,
        """
        [devices]
        enabled_mdev_types = nvidia-223
        [mdev_nvidia-223]
        max_instances = 2
        device_addresses = 0000:18:00.0,0000:19:00.0
        """,
    )
    assert totals(tree) == {"0000:18:00.0": (3, 0), "0000:19:00.0": (8, 8)}


def test_type_the_gpu_does_not_offer(make_host, tree_of):
    tree = tree_of(make_host("mtty"), "[devices]\nenabled_mdev_types = nvidia-35\n")
    assert tree.providers == ()
    assert tree.unserved == (("mtty_mtty", "does not offer nvidia-35 (offers: mtty-1, mtty-2)"),)


def test_nothing_enabled_means_no_providers(make_host, tree_of):
    tree = tree_of(make_host("t4x8"), "")
    assert tree.providers == ()
    assert {why for _, why in tree.unserved} == {
        "no mdev type is enabled ([devices] enabled_mdev_types)"
    }


def test_vendor_vfio_gpu(make_host, tree_of):
    host = make_host("l40s-vfio")
    host.set_vendor_vgpu_type("0000:c1:00.4", 1156)
    tree = tree_of(
        host,
        """
        [devices]
        enabled_mdev_types = nvidia-1156
        [mdev_nvidia-1156]
        max_instances = 6
        """,
    )
    (provider,) = tree.providers
    assert (provider.total, provider.reserved) == (6, 0)
    assert provider.traits == (
        "CUSTOM_MDEV_NVIDIA_1156",
        MANAGER_550,
        "CUSTOM_OWNER_VGPU_DRIVER",
        "CUSTOM_VGPU_NVIDIA_L40S_8Q",
    )


def _claim(gpu, instance, state="attached"):
    return claims.Claim(
        mdev_uuid=str(uuid.uuid4()),
        instance_uuid=instance,
        gpu=gpu,
        parent=gpu,
        type_id="nvidia-231",
        state=state,
        created=True,
        created_at=0.0,
        updated_at=0.0,
    )


def test_only_claims_beyond_their_instances_allocation_are_unallocated():
    claim_list = [
        _claim(T4[0], "covered"),
        _claim(T4[0], "covered"),
        _claim(T4[0], "grown"),
        _claim(T4[0], "grown"),
        _claim(T4[1], "elsewhere", state="migrating_in"),
        _claim(T4[1], "gone", state="releasing"),
        _claim(T4[2], "unknown"),
    ]
    allocated = {
        T4[0]: {"covered": {"VGPU": 2}, "grown": {"VGPU": 1}, "scheduled": {"VGPU": 4}},
        T4[1]: {"covered": {"VGPU": 1}},
    }
    assert inventory.unallocated_claims(claim_list, allocated) == {T4[0]: 1, T4[1]: 2, T4[2]: 1}
    assert inventory.unallocated_claims([], allocated) == {}


def test_unallocated_claims_are_reserved_up_to_the_total(make_host, make_conf):
    config = mdev_types.from_conf(make_conf("[devices]\nenabled_mdev_types = nvidia-231\n"))
    snapshot = discovery.discover(make_host("t4x8"))
    tree = inventory.compute(snapshot, config, "cn1", unallocated={T4[0]: 3, T4[1]: 99})
    assert totals(tree)[T4[0]] == (8, 3)
    assert totals(tree)[T4[1]] == (8, 8)
    assert totals(tree)[T4[2]] == (8, 0)
    assert tree.by_gpu(T4[0]).reserved_for == ((inventory.CLAIMS, 3),)
    assert tree.by_gpu(T4[1]).reserved_for == ((inventory.CLAIMS, 8),)
    assert tree.by_gpu(T4[2]).reserved_for == ()


def test_reserved_units_add_up_to_what_they_are_held_for(make_host, make_conf):
    """A GPU capped by max_instances holding a claim Placement lacks, and
    one blocked by another type: every reserved unit has one reason."""
    host = make_host(
        "t4x8", mdevs=[{"parent": T4[1], "type": "nvidia-222", "uuid": str(uuid.uuid4())}]
    )
    config = mdev_types.from_conf(
        make_conf(
            "[devices]\nenabled_mdev_types = nvidia-231\n[mdev_nvidia-231]\nmax_instances = 4\n"
        )
    )
    tree = inventory.compute(
        discovery.discover(host), config, "cn1", unallocated={T4[0]: 1, T4[1]: 1, T4[2]: 2}
    )
    assert tree.by_gpu(T4[0]).reserved_for == ((inventory.CLAIMS, 1),)
    assert tree.by_gpu(T4[1]).reserved_for == ((inventory.BLOCKED, 8),)
    assert tree.by_gpu(T4[2]).reserved_for == ((inventory.MAX_INSTANCES, 8),)
    for provider in tree.providers:
        assert sum(units for _kind, units in provider.reserved_for) == provider.reserved
        assert {kind for kind, _units in provider.reserved_for} <= set(inventory.RESERVED_FOR)


def test_the_vgpu_manager_s_version_is_a_trait_of_nvidia_gpus_only(make_host, tree_of):
    """A live migration of vendor-VFIO vGPUs reads the source's version from
    its providers; a driver upgrade changes it, an unloaded module drops it,
    and a GPU that is not NVIDIA's never carries it."""
    host = make_host("l40s-vfio")
    conf = """
        [devices]
        enabled_mdev_types = nvidia-1156
        """
    assert MANAGER_550 in tree_of(host, conf).providers[0].traits
    host.load_vgpu_manager("570.133.10")
    (provider,) = tree_of(host, conf).providers
    assert MANAGER_550 not in provider.traits
    assert "CUSTOM_NVIDIA_VGPU_MANAGER_570_133_10" in provider.traits
    assert inventory.manager_version_of("CUSTOM_NVIDIA_VGPU_MANAGER_570_133_10") == "570.133.10"
    host.load_vgpu_manager(None)
    assert not [
        t
        for t in tree_of(host, conf).providers[0].traits
        if t.startswith("CUSTOM_NVIDIA_VGPU_MANAGER_")
    ]
    mtty = make_host("mtty")
    mtty.load_vgpu_manager("550.127.06")
    (virtual,) = tree_of(
        mtty,
        """
        [devices]
        enabled_mdev_types = mtty-2
        """,
    ).providers
    assert MANAGER_550 not in virtual.traits
