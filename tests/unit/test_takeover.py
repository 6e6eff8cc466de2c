"""Taking over a host nova's driver managed: which providers, which mdevs."""

import uuid

import pytest

from tests import confs
from vgpu_driver import discovery
from vgpu_driver import inventory
from vgpu_driver import takeover
from vgpu_driver.conf import mdev_types

A100 = "0000:41:00.0"
A100_VFS = [f"0000:41:{d:02x}.{f}" for d in range(3) for f in range(8)][4:20]
GPU_RP = "cn1_pci_0000_41_00_0"


def vf_provider(address, classes=("VGPU",)):
    """A provider as nova's libvirt driver names one per mdev parent."""
    suffix = "pci_" + address.replace(":", "_").replace(".", "_")
    return takeover.ExistingProvider(f"cn1_{suffix}", f"uuid-{address}", frozenset(classes))


@pytest.fixture
def plan_for(make_conf):
    def make(host, existing, conf_text="[devices]\nenabled_mdev_types = nvidia-468\n"):
        config = mdev_types.from_conf(make_conf(conf_text))
        snapshot = discovery.discover(host)
        tree = inventory.compute(snapshot, config, "cn1")
        return takeover.plan("cn1", tree, snapshot, existing)

    return make


@pytest.mark.parametrize(
    "name,expected",
    [
        ("cn1_pci_0000_41_00_4", "0000:41:00.4"),
        ("cn1_pci_0000_41_01_2", "0000:41:01.2"),
        ("cn1_mtty_mtty", "mtty_mtty"),
        ("cn2_pci_0000_41_00_4", None),  # another host's
        ("cn1_pci_0000_41_00_9", None),  # not a PCI function
        ("cn1_NUMA0", None),
        ("cn1", None),
    ],
)
def test_device_address_of_a_provider_name(name, expected):
    assert takeover.device_address("cn1", name) == expected


def test_every_vf_provider_maps_to_the_a100s(make_host, plan_for):
    existing = [vf_provider(vf) for vf in A100_VFS]
    plan = plan_for(make_host("a100-sriov"), existing)
    assert [m.source for m in plan.moves] == sorted(existing, key=lambda p: p.name)
    assert {m.target.name for m in plan.moves} == {GPU_RP}
    assert [t.name for t in plan.targets] == [GPU_RP]
    assert plan.moves[0].address == "0000:41:00.4"


def test_a_provider_named_as_ours_is_already_ours(make_host, plan_for):
    """nova names a time-sliced GPU's provider after its PF, as we do."""
    host = make_host("t4x8")
    existing = [takeover.ExistingProvider("cn1_pci_0000_18_00_0", "u1", frozenset({"VGPU"}))]
    assert not plan_for(host, existing, "[devices]\nenabled_mdev_types = nvidia-231\n")


def test_providers_of_other_resources_are_never_taken(make_host, plan_for):
    existing = [
        vf_provider(A100_VFS[0], classes=("CUSTOM_PCI_10DE_20F1",)),  # PCI in Placement
        vf_provider(A100_VFS[1], classes=("VGPU", "CUSTOM_OTHER")),
        vf_provider(A100_VFS[2], classes=()),
        takeover.ExistingProvider("cn1_NUMA0", "u", frozenset({"VGPU"})),
        takeover.ExistingProvider("other_pci_0000_41_00_7", "u2", frozenset({"VGPU"})),
    ]
    assert not plan_for(make_host("a100-sriov"), existing)


def test_a_gpu_we_do_not_serve_keeps_nova_s_providers(make_host, plan_for):
    existing = [vf_provider(A100_VFS[0])]
    assert not plan_for(make_host("a100-sriov"), existing, confs.NOVA_GUIDE_M60)


def test_vfs_that_are_not_there_are_not_guessed(make_host, plan_for):
    host = make_host("a100-sriov")
    host.set_vfs(A100, 0)
    host.set_vfs(A100, 4)
    plan = plan_for(host, [vf_provider(vf) for vf in A100_VFS])
    assert [m.address for m in plan.moves] == A100_VFS[:4]


def test_allocations_are_moved_and_merged_per_gpu(make_host, plan_for):
    plan = plan_for(make_host("a100-sriov"), [vf_provider(vf) for vf in A100_VFS])
    allocations = {
        "one": {
            "allocations": {
                "root": {"generation": 3, "resources": {"VCPU": 1, "MEMORY_MB": 512}},
                f"uuid-{A100_VFS[3]}": {"generation": 1, "resources": {"VGPU": 1}},
            },
            "project_id": "p",
            "user_id": "u",
            "consumer_generation": 1,
        },
        "two": {
            "allocations": {
                f"uuid-{A100_VFS[0]}": {"generation": 1, "resources": {"VGPU": 1}},
                f"uuid-{A100_VFS[1]}": {"generation": 1, "resources": {"VGPU": 1}},
            },
            "project_id": "p",
            "user_id": "u",
            "consumer_generation": 2,
        },
        "none": {"allocations": {"root": {"resources": {"VCPU": 1}}}},
    }
    moved = takeover.move_allocations(allocations, plan, {GPU_RP: "gpu-uuid"})
    assert moved == {"one": {A100: 1}, "two": {A100: 2}}
    assert allocations["one"]["allocations"] == {
        "root": {"generation": 3, "resources": {"VCPU": 1, "MEMORY_MB": 512}},
        "gpu-uuid": {"resources": {"VGPU": 1}},
    }
    assert allocations["two"]["allocations"] == {"gpu-uuid": {"resources": {"VGPU": 2}}}
    assert allocations["two"]["consumer_generation"] == 2
    assert allocations["none"]["allocations"] == {"root": {"resources": {"VCPU": 1}}}


def test_units_are_counted_in_the_class_the_gpu_serves(make_host, plan_for):
    conf_text = (
        "[devices]\nenabled_mdev_types = nvidia-468\n[mdev_nvidia-468]\nmdev_class = CUSTOM_A100\n"
    )
    existing = [vf_provider(A100_VFS[0], classes=("CUSTOM_A100",))]
    plan = plan_for(make_host("a100-sriov"), existing, conf_text)
    allocations = {"c": {"allocations": {f"uuid-{A100_VFS[0]}": {"resources": {"CUSTOM_A100": 1}}}}}
    takeover.move_allocations(allocations, plan, {GPU_RP: "g"})
    assert allocations["c"]["allocations"] == {"g": {"resources": {"CUSTOM_A100": 1}}}


def test_mismatches_name_consumers_without_their_mdevs():
    claim = type("C", (), {"instance_uuid": "one", "gpu": A100, "state": "attached"})
    held = takeover.held_per_gpu([claim])
    assert held == {"one": {A100: 1}}
    moved = {"one": {A100: 1}, "migration": {A100: 1}}
    assert takeover.mismatches(moved, held) == [("migration", A100, 1, 0)]


# -- adoption of the mdevs guests already use -------------------------------------------


def nova_made_mdevs(make_host, count):
    """A host where nova's driver created ``count`` mdevs, one per VF."""
    made = [str(uuid.uuid4()) for _ in range(count)]
    host = make_host(
        "a100-sriov",
        mdevs=[
            {"parent": vf, "type": "nvidia-468", "uuid": u}
            for vf, u in zip(A100_VFS, made, strict=False)
        ],
    )
    return host, made


def test_mdevs_guests_use_are_adopted_as_attached(make_host, make_driver):
    host, made = nova_made_mdevs(make_host, 3)
    vgpu = make_driver(host, "restore_wait = 5")
    vgpu.domains.define("guest-a", made[:2])
    vgpu.domains.define("guest-b", made[2:3])
    adopted = takeover.adopt(vgpu.manager)
    assert sorted(
        (c.mdev_uuid, c.instance_uuid, c.state, c.gpu, c.type_id) for c in adopted
    ) == sorted(
        [
            (made[0], "guest-a", "attached", A100, "nvidia-468"),
            (made[1], "guest-a", "attached", A100, "nvidia-468"),
            (made[2], "guest-b", "attached", A100, "nvidia-468"),
        ]
    )
    assert {c.parent for c in adopted} == set(A100_VFS[:3])
    assert takeover.adopt(vgpu.manager) == []  # once only


def test_unused_and_claimed_mdevs_are_left_alone(make_host, make_driver):
    host, made = nova_made_mdevs(make_host, 2)
    vgpu = make_driver(host, "restore_wait = 5")
    providers = {"rp": vgpu.provider_tree("cn1").by_gpu(A100)}
    # Ours: the allocation reuses one of the free mdevs and claims it.
    (ours,) = vgpu.allocate("guest-ours", {"rp": {"resources": {"VGPU": 1}}}, providers)
    vgpu.domains.define("guest-ours", [ours])
    assert takeover.adopt(vgpu.manager) == []
    assert [c.instance_uuid for c in vgpu.journal.claims()] == ["guest-ours"]


def test_init_host_adopts_and_a_reboot_then_restores_them(make_host, make_driver):
    host, made = nova_made_mdevs(make_host, 2)
    vgpu = make_driver(host, "restore_wait = 5")
    vgpu.domains.define("guest-a", made)
    vgpu.init_host()
    assert sorted(c.mdev_uuid for c in vgpu.journal.claims("guest-a")) == sorted(made)
    # Claimed, they outlive a host reboot: the next start creates them again.
    host.reboot()
    host.set_vfs(A100, 16)
    restarted = make_driver(host, "restore_wait = 5")
    restarted.domains.define("guest-a", made)
    outcomes = restarted.init_host()
    assert {o.result for o in outcomes} == {"restored"}
    assert sorted(m.uuid for m in host.list_mdevs()) == sorted(made)
    # And new guests get other mdevs: the adopted ones count as used.
    providers = {"rp": restarted.provider_tree("cn1").by_gpu(A100)}
    got = restarted.allocate("guest-new", {"rp": {"resources": {"VGPU": 1}}}, providers)
    assert not set(got) & set(made)
