"""A board that serves several vGPU sizes at once, end to end on a fake L40S.

Several ``[mdev_<type>]`` groups name the board; in mixed-size mode its
provider is one inventory of framebuffer MiB, a flavor asks for its type's
MiB and requires the type's trait, and the allocation types a VF with the
type the trait names.  The fake vendor driver places each vGPU at the
lowest placement ID NVIDIA's tables allow for its size.
"""

import re

import pytest

from vgpu_driver import exception
from vgpu_driver import framebuffer
from vgpu_driver import inventory
from vgpu_driver import status
from vgpu_driver import status_assembly
from vgpu_driver.conf import mdev_types

L40S = "0000:c1:00.0"
RC = framebuffer.RESOURCE_CLASS
GB = framebuffer.SLOT_MIB
FOUR, EIGHT, TWELVE, TWENTY_FOUR = "nvidia-1155", "nvidia-1156", "nvidia-1157", "nvidia-1159"
MIXED = (FOUR, EIGHT, TWELVE, TWENTY_FOUR)


def mixed_conf_lines(types=MIXED, address=L40S, **extra):
    lines = []
    for type_id in types:
        lines += [f"[mdev_{type_id}]", f"device_addresses = {address}"]
        lines += [f"{name} = {value}" for name, value in extra.get(type_id, {}).items()]
    return lines


@pytest.fixture
def board(make_host, make_driver):
    """``(host, driver)``: an L40S whose configuration gives it four sizes."""

    def make(mixed=True):
        host = make_host("l40s-vfio")
        if mixed:
            host.set_mixed_sizes(L40S, True)
        vgpu = make_driver(host, extra=mixed_conf_lines(), types=",".join(MIXED))
        return host, vgpu

    return make


def trait(type_id):
    return inventory.type_traits(type_id, None)[0]


def allocate(vgpu, instance, type_id, mib):
    provider = vgpu.provider_tree("cn1").by_gpu(L40S)
    return vgpu.allocate(
        instance, {"rp": {"resources": {RC: mib}}}, {"rp": provider}, type_traits={trait(type_id)}
    )


def fitting(provider):
    """``{size GB: vGPUs of it that fit now}``, as the provider says it."""
    return {
        int(mib) // GB: int(count)
        for count, mib in re.findall(r"(\d+) x (\d+) MiB", provider.reason)
    }


def size_capacity(provider):
    """``{size GB: what Placement may hold in its class}``."""
    return {int(rc.split("_")[3]) // GB: found.capacity for rc, found in provider.size_inventories}


def typed(host):
    return {
        str(vf.address): f"nvidia-{vf.current_type}"
        for vf in host.list_vendor_vfio()
        if vf.current_type
    }


class TestConfiguration:
    def test_vendor_types_may_share_a_board(self, make_conf):
        config, problems = mdev_types.load(
            make_conf(
                "\n".join(
                    [
                        "[devices]",
                        f"enabled_mdev_types = {FOUR},{EIGHT}",
                        *mixed_conf_lines((FOUR, EIGHT)),
                    ]
                )
            )
        )
        assert [p for p in problems if p.severity == "error"] == []
        assert config.mixed_by_address[L40S] == (FOUR, EIGHT)
        assert dict(config.by_address) == {}
        assert config.mixed_types == {FOUR, EIGHT}
        assert config.mdev_classes == {RC}

    def test_single_type_configs_are_unchanged(self, make_conf):
        config, problems = mdev_types.load(
            make_conf(
                "\n".join(
                    [
                        "[devices]",
                        f"enabled_mdev_types = {FOUR},{EIGHT}",
                        f"[mdev_{FOUR}]",
                        f"device_addresses = {L40S}",
                        f"[mdev_{EIGHT}]",
                        "device_addresses = 0000:c2:00.0",
                    ]
                )
            )
        )
        assert problems == []
        assert config.mixed_types == frozenset()
        assert config.mdev_classes == {"VGPU"}

    def test_other_types_cannot_share_a_board(self, make_conf):
        types = ("i915-GVTg_V5_4", "i915-GVTg_V5_8")
        _config, problems = mdev_types.load(
            make_conf(
                "\n".join(
                    [
                        "[devices]",
                        f"enabled_mdev_types = {','.join(types)}",
                        *mixed_conf_lines(types, address="0000:00:02.0"),
                    ]
                )
            )
        )
        (problem,) = problems
        assert problem.severity == "error"
        assert (
            "a device serves one type, unless every type listing it is an NVIDIA "
            "type (nvidia-<number>)" in str(problem)
        )

    @pytest.mark.parametrize(
        "option, value", [("mdev_class", "CUSTOM_FOUR"), ("max_instances", "3")]
    )
    def test_options_a_shared_board_cannot_honour_are_errors(self, make_conf, option, value):
        _config, problems = mdev_types.load(
            make_conf(
                "\n".join(
                    [
                        "[devices]",
                        f"enabled_mdev_types = {FOUR},{EIGHT}",
                        *mixed_conf_lines((FOUR, EIGHT), **{FOUR: {option: value}}),
                    ]
                )
            )
        )
        (problem,) = problems
        assert problem.option == f"[mdev_{FOUR}] {option}"
        assert "shares a mixed-size board" in str(problem)


class TestByModel:
    def test_nvidia_types_naming_one_model_share_its_boards(self, make_host, make_driver):
        host = make_host("l40s-vfio")
        host.set_mixed_sizes(L40S, True)
        vgpu = make_driver(
            host,
            types=f"{FOUR},{TWELVE}",
            extra=[
                f"[mdev_{FOUR}]",
                "device_ids = 10de:26b9",
                f"[mdev_{TWELVE}]",
                "device_ids = 10de:26b9",
            ],
        )
        provider = vgpu.provider_tree("cn1").by_gpu(L40S)
        assert provider.sizes == ((FOUR, 4 * GB), (TWELVE, 12 * GB))
        assert provider.resource_class == RC
        (vf,) = allocate(vgpu, "vm-12", TWELVE, 12 * GB)
        assert typed(host) == {vf: TWELVE}


class TestInventory:
    def test_a_board_serving_mdevs_does_not_mix_sizes(self, make_host, make_driver):
        t4 = "0000:18:00.0"
        types = ("nvidia-222", "nvidia-223")
        vgpu = make_driver(
            make_host("t4x8"), extra=mixed_conf_lines(types, address=t4), types=",".join(types)
        )
        tree = vgpu.provider_tree("cn1")
        assert tree.by_gpu(t4) is None
        assert dict(tree.unserved)[t4] == (
            "its addresses are listed under several types (nvidia-222, nvidia-223); a GPU "
            "serves one type, unless it is a board serving vendor-VFIO vGPUs, which mixes "
            "sizes, or an NVIDIA GPU in a type pool ([devices] shared_board_mode = pool): "
            "fix device_addresses"
        )

    def test_equal_size_mode_gets_no_provider_and_says_how_to_fix(self, board):
        _host, vgpu = board(mixed=False)
        tree = vgpu.provider_tree("cn1")
        assert tree.providers == ()
        assert dict(tree.unserved)[L40S] == (
            f"configured for mixed sizes ({', '.join(sorted(MIXED))}) but in equal-size "
            f"mode: run vgpu-manage sriov sizes {L40S} mixed"
        )

    def test_an_empty_board_offers_its_whole_framebuffer(self, board):
        _host, vgpu = board()
        provider = vgpu.provider_tree("cn1").by_gpu(L40S)
        assert provider.inventory()[RC] == {
            "total": 48 * GB,
            "reserved": 0,
            "min_unit": 4 * GB,
            "max_unit": 48 * GB,
            "step_size": 4 * GB,
            "allocation_ratio": 1.0,
        }
        # Ada's 4 GB row has 8 placements; 8 and 12 GB 4 each; 24 GB 2.
        assert size_capacity(provider) == {4: 8, 8: 4, 12: 4, 24: 2}
        assert set(provider.inventory()) == {RC} | {
            f"CUSTOM_VGPU_SIZE_{s * GB}_MIB" for s in (4, 8, 12, 24)
        }
        assert {trait(t) for t in MIXED} <= set(provider.traits)
        assert provider.sizes == tuple(
            (t, s * GB) for t, s in zip(sorted(MIXED), (4, 8, 12, 24), strict=True)
        )

    def test_each_vgpu_gets_its_type_and_the_inventory_follows_the_board(self, board):
        host, vgpu = board()
        four = allocate(vgpu, "vm-4", FOUR, 4 * GB)
        twelve = allocate(vgpu, "vm-12", TWELVE, 12 * GB)
        eight = allocate(vgpu, "vm-8", EIGHT, 8 * GB)
        assert typed(host) == {four[0]: FOUR, twelve[0]: TWELVE, eight[0]: EIGHT}
        # 4 GB at slot 0, 12 GB at 12, 8 GB at 24: no half of the board is
        # empty for 24 GB, and slots 4-7 fit none of the four sizes.
        provider = vgpu.provider_tree("cn1").by_gpu(L40S)
        assert (fitting(provider), provider.reserved) == ({4: 4, 8: 1, 12: 1}, 4 * GB)
        assert provider.reserved_for == ((inventory.FRAGMENTED, 4 * GB),)
        assert provider.reason == (
            "mixed sizes: fit now 4 x 4096 MiB, 1 x 8192 MiB, 1 x 12288 MiB; 4096 MiB fragmented"
        )
        # Each size class holds its vGPU and what still fits.
        assert size_capacity(provider) == {4: 1 + 4, 8: 1 + 1, 12: 1 + 1, 24: 0}
        with pytest.raises(exception.NoGpuCapacity):
            allocate(vgpu, "vm-24", TWENTY_FOUR, 24 * GB)
        assert len(typed(host)) == 3

    def test_a_full_board_says_so(self, board):
        _host, vgpu = board()
        allocate(vgpu, "vm-a", TWENTY_FOUR, 24 * GB)
        allocate(vgpu, "vm-b", TWENTY_FOUR, 24 * GB)
        provider = vgpu.provider_tree("cn1").by_gpu(L40S)
        assert (provider.reserved, fitting(provider)) == (0, {})
        assert provider.reason.startswith(f"none of {', '.join(sorted(MIXED))} fits now")

    def test_release_gives_the_framebuffer_back(self, board):
        host, vgpu = board()
        allocate(vgpu, "vm-4", FOUR, 4 * GB)
        (vf,) = allocate(vgpu, "vm-12", TWELVE, 12 * GB)
        vgpu.release("vm-12")
        # Kept typed, the VF's slots would serve 12 GB vGPUs alone.
        assert vf not in typed(host)
        # Slots 4-7, beside the 4 GB vGPU at 0, still fit none of the sizes.
        provider = vgpu.provider_tree("cn1").by_gpu(L40S)
        assert (fitting(provider)[24], provider.reserved) == (1, 4 * GB)
        allocate(vgpu, "vm-24", TWENTY_FOUR, 24 * GB)

    def test_claims_placement_does_not_count_are_reserved_in_mib(self, board):
        _host, vgpu = board()
        allocate(vgpu, "vm-8", EIGHT, 8 * GB)
        provider = vgpu.provider_tree("cn1", lambda name: {}).by_gpu(L40S)
        assert dict(provider.reserved_for)[inventory.CLAIMS] == 8 * GB

    def test_an_unused_typed_vf_keeps_its_slots_from_the_others(self, board):
        host, vgpu = board()
        vf = allocate(vgpu, "vm-8", EIGHT, 8 * GB)[0]
        with vgpu.journal.transaction() as txn:  # a claim dropped by hand
            txn.remove("vm-8")
        assert typed(host) == {vf: EIGHT}
        snapshot = vgpu.manager.snapshot(refresh=True)
        tree = inventory.compute(
            snapshot,
            vgpu.mdev_config,
            "cn1",
            in_use=set(),
            boards=inventory.read_boards(host, snapshot, vgpu.mdev_config),
        )
        assert tree.by_gpu(L40S).reserved == 8 * GB
        # The host reconciler's pass before each update takes it back, as it
        # takes back a stale type.
        assert vgpu.provider_tree("cn1").by_gpu(L40S).reserved == 0
        assert typed(host) == {}


class TestRequests:
    @pytest.mark.parametrize(
        "traits, mib, why",
        [
            ({trait(FOUR), trait(EIGHT)}, 4 * GB, "the flavor requires several of its types"),
            ({"CUSTOM_MDEV_NVIDIA_1"}, 4 * GB, "name none of its types"),
            ({trait(EIGHT)}, 12 * GB, "not a whole number of nvidia-1156 vGPUs"),
            (set(), 5 * GB, "none is of that size"),
        ],
    )
    def test_an_allocation_naming_no_single_type_is_refused(self, board, traits, mib, why):
        host, vgpu = board()
        provider = vgpu.provider_tree("cn1").by_gpu(L40S)
        with pytest.raises(exception.MixedSizeTypeUnknown, match=why):
            vgpu.allocate(
                "vm", {"rp": {"resources": {RC: mib}}}, {"rp": provider}, type_traits=traits
            )
        assert typed(host) == {}
        assert vgpu.journal.claims() == []

    def test_without_traits_the_size_names_the_type(self, board):
        host, vgpu = board()
        provider = vgpu.provider_tree("cn1").by_gpu(L40S)
        (vf,) = vgpu.allocate("vm", {"rp": {"resources": {RC: 12 * GB}}}, {"rp": provider})
        assert typed(host) == {vf: TWELVE}

    def test_two_vgpus_of_one_type(self, board):
        host, vgpu = board()
        vfs = allocate(vgpu, "vm", EIGHT, 16 * GB)
        assert typed(host) == dict.fromkeys(vfs, EIGHT)
        assert len(vfs) == 2


class TestReboot:
    def test_vfs_then_mode_then_types_come_back_in_that_order(self, board):
        host, vgpu = board()
        vfs = {
            vf: t
            for t, gb in ((FOUR, 4), (TWELVE, 12), (EIGHT, 8))
            for vf in allocate(vgpu, f"vm-{gb}", t, gb * GB)
        }
        host.reboot()
        assert not host.heterogeneous_mode(L40S)
        assert {o.result for o in vgpu.reconciler.restore()} == {"waiting"}
        host.set_vfs(L40S, 16)  # the VFs first: sriov enable
        assert not host.heterogeneous_mode(L40S)
        outcomes = vgpu.reconciler.restore()
        # Written in equal-size mode, the first type would have locked the
        # board to its size, and the other two been refused.
        assert {(o.mdev_uuid, o.result) for o in outcomes} == {(vf, "restored") for vf in vfs}
        assert host.heterogeneous_mode(L40S)
        assert typed(host) == vfs
        assert max(fitting(vgpu.provider_tree("cn1").by_gpu(L40S))) == 12

    def test_a_board_that_cannot_take_the_mode_fails_the_restore_and_says_why(self, board):
        host, vgpu = board()
        (vf,) = allocate(vgpu, "vm-8", EIGHT, 8 * GB)
        assert vf == "0000:c1:00.4"
        host.reboot()
        host.set_vfs(L40S, 16)
        host.set_vendor_vgpu_type("0000:c1:00.5", 1155)  # typed by someone else, first
        (outcome,) = vgpu.reconciler.restore()
        assert (outcome.mdev_uuid, outcome.result) == (vf, "failed")
        assert outcome.reason.startswith("its board cannot mix sizes: ")
        assert not host.heterogeneous_mode(L40S)


class TestStatus:
    def test_a_mixed_board_counts_framebuffer_beside_boards_that_count_vgpus(
        self, make_host, make_driver
    ):
        host = make_host("l40s-vfio", "a100-sriov")
        host.set_mixed_sizes(L40S, True)
        vgpu = make_driver(
            host, extra=mixed_conf_lines((FOUR, TWELVE)), types=f"{FOUR},{TWELVE},nvidia-468"
        )
        allocate(vgpu, "vm-12", TWELVE, 12 * GB)
        tree = vgpu.provider_tree("cn1")
        snapshot = vgpu.manager.snapshot(refresh=True)
        view = status_assembly.assemble("cn1", snapshot, tree, vgpu.journal.claims(), {})
        board = {g.gpu: g for g in view.gpus}[L40S]
        assert (board.unit, board.used, board.total, board.type_name) == (
            "MiB",
            12 * GB,
            48 * GB,
            "mixed sizes, in MiB",
        )
        assert "vGPUs [..........] 0/10 used" in view.summary()
        assert f"mixed-size framebuffer {status.bar(12 * GB, 48 * GB)} MiB used" in view.summary()


class TestRace:
    def test_what_placement_granted_against_one_inventory_the_board_refuses_cleanly(self, board):
        """Three 8 GB vGPUs granted against one inventory, before it is
        updated: Placement's sum fits (24 GB free) but only two 8 GB
        placements are left, so the third is refused at claim time."""
        host, vgpu = board()
        for name in ("vm-0", "vm-12", "vm-24", "vm-36"):  # 12 GB at 0, 12, 24, 36
            allocate(vgpu, name, TWELVE, 12 * GB)
        vgpu.release("vm-0")
        vgpu.release("vm-24")  # free: slots 0-11 and 24-35
        provider = vgpu.provider_tree("cn1").by_gpu(L40S)
        assert (provider.reserved, fitting(provider)) == (0, {4: 4, 8: 2, 12: 2})
        before = typed(host)
        granted = {"rp": {"resources": {RC: 8 * GB}}}
        got = [
            vgpu.allocate(name, granted, {"rp": provider}, {trait(EIGHT)})[0]
            for name in ("vm-a", "vm-b")
        ]
        with pytest.raises(exception.NoGpuCapacity):
            vgpu.allocate("vm-c", granted, {"rp": provider}, {trait(EIGHT)})
        assert typed(host) == {**before, **dict.fromkeys(got, EIGHT)}
        assert "vm-c" not in {c.instance_uuid for c in vgpu.journal.claims()}
