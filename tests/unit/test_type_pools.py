"""Type pools: a board of several NVIDIA types that takes the size of its
first vGPU, end to end on a fake L40S in equal-size mode.

``[devices] shared_board_mode = pool``: the board is served in the
mixed-size encoding (framebuffer MiB and one class per size), offers every
size while empty, its first vGPU's size only while it holds one (up to
NVIDIA's maximum), and every size again once the last one goes.
"""

import dataclasses

import pytest

from tests.unit.test_mixed_size_boards import EIGHT
from tests.unit.test_mixed_size_boards import FOUR
from tests.unit.test_mixed_size_boards import GB
from tests.unit.test_mixed_size_boards import L40S
from tests.unit.test_mixed_size_boards import MIXED
from tests.unit.test_mixed_size_boards import RC
from tests.unit.test_mixed_size_boards import TWELVE
from tests.unit.test_mixed_size_boards import TWENTY_FOUR
from tests.unit.test_mixed_size_boards import allocate
from tests.unit.test_mixed_size_boards import mixed_conf_lines
from tests.unit.test_mixed_size_boards import size_capacity
from tests.unit.test_mixed_size_boards import typed
from vgpu_driver import config_check_boards
from vgpu_driver import exception
from vgpu_driver import inventory
from vgpu_driver import status_assembly
from vgpu_driver import vgpu_scheduler
from vgpu_driver.inventory import pool
from vgpu_driver.mdevs import strategies
from vgpu_driver.privsep import device
from vgpu_driver.privsep import policy

POOL_LINES = ["[devices]", "shared_board_mode = pool"]
# The L40S's equal-size maxima (NVIDIA's per-board table, the fake's profile).
EMPTY = {4: 12, 8: 6, 12: 4, 24: 2}


@pytest.fixture
def pool_board(make_host, make_driver):
    """``(host, driver)``: an L40S, in equal-size mode, pooled among four sizes."""
    host = make_host("l40s-vfio")
    vgpu = make_driver(host, extra=[*POOL_LINES, *mixed_conf_lines()], types=",".join(MIXED))
    return host, vgpu


def board_provider(vgpu):
    return vgpu.provider_tree("cn1").by_gpu(L40S)


class TestInventory:
    def test_an_empty_board_offers_every_size_of_its_types(self, pool_board):
        _host, vgpu = pool_board
        provider = board_provider(vgpu)
        assert provider.pool and provider.resource_class == RC
        assert (provider.total, provider.reserved, provider.min_unit, provider.step_size) == (
            48 * GB,
            0,
            4 * GB,
            4 * GB,
        )
        assert size_capacity(provider) == EMPTY
        assert provider.reason.endswith(
            "empty: fit 12 x 4096 MiB, 6 x 8192 MiB, 4 x 12288 MiB, 2 x 24576 MiB"
        )

    def test_its_first_vgpu_fixes_the_size(self, pool_board):
        host, vgpu = pool_board
        (vf,) = allocate(vgpu, "vm-8", EIGHT, 8 * GB)
        assert typed(host) == {vf: EIGHT}
        provider = board_provider(vgpu)
        # 8 GB: one held and five more; every other size: nothing.
        assert size_capacity(provider) == {4: 0, 8: 6, 12: 0, 24: 0}
        # The framebuffer left free (48 GB less the 8 GB held) is just the
        # room of five more 8 GB vGPUs.
        assert provider.total - provider.reserved - 8 * GB == 5 * 8 * GB
        assert provider.reason.endswith("of 8192 MiB vGPUs: fit 5 more")

    def test_another_size_is_refused_by_the_board_and_nothing_is_kept(self, pool_board):
        host, vgpu = pool_board
        allocate(vgpu, "vm-8", EIGHT, 8 * GB)
        before = typed(host)
        with pytest.raises(exception.WrongTypePresent):
            allocate(vgpu, "vm-4", FOUR, 4 * GB)
        assert typed(host) == before
        assert "vm-4" not in {c.instance_uuid for c in vgpu.journal.claims()}

    def test_the_last_vgpu_gone_offers_every_size_again(self, pool_board):
        host, vgpu = pool_board
        allocate(vgpu, "vm-8a", EIGHT, 8 * GB)
        allocate(vgpu, "vm-8b", EIGHT, 8 * GB)
        vgpu.release("vm-8a")
        assert size_capacity(board_provider(vgpu)) == {4: 0, 8: 6, 12: 0, 24: 0}
        vgpu.release("vm-8b")
        assert typed(host) == {}
        assert size_capacity(board_provider(vgpu)) == EMPTY
        (vf,) = allocate(vgpu, "vm-24", TWENTY_FOUR, 24 * GB)
        assert typed(host) == {vf: TWENTY_FOUR}

    def test_nvidias_maximum_bounds_the_size_not_the_free_vfs(self, pool_board):
        host, vgpu = pool_board
        vfs = allocate(vgpu, "vm-12", TWELVE, 4 * 12 * GB)
        assert typed(host) == dict.fromkeys(vfs, TWELVE) and len(vfs) == 4
        provider = board_provider(vgpu)
        assert provider.reason.endswith("of 12288 MiB vGPUs: full")
        assert provider.total - provider.reserved == 4 * 12 * GB  # all of it held
        with pytest.raises(exception.NoGpuCapacity):
            allocate(vgpu, "vm-12b", TWELVE, 12 * GB)

    def test_an_unheld_typed_vf_still_fixes_the_size(self, pool_board):
        host, vgpu = pool_board
        (vf,) = allocate(vgpu, "vm-4", FOUR, 4 * GB)
        with vgpu.journal.transaction() as txn:  # a claim dropped by hand
            txn.remove("vm-4")
        snapshot = vgpu.manager.snapshot(refresh=True)
        tree = inventory.compute(
            snapshot,
            vgpu.mdev_config,
            "cn1",
            in_use=set(),
            boards=inventory.read_boards(host, snapshot, vgpu.mdev_config),
        )
        # It holds one of the twelve and keeps the other sizes out.
        assert size_capacity(tree.by_gpu(L40S)) == {4: 11, 8: 0, 12: 0, 24: 0}
        # The host reconciler's pass before each update clears it.
        assert size_capacity(board_provider(vgpu)) == EMPTY
        assert vf not in typed(host)

    def test_claims_placement_does_not_count_are_reserved(self, pool_board):
        _host, vgpu = pool_board
        allocate(vgpu, "vm-8", EIGHT, 8 * GB)
        provider = vgpu.provider_tree("cn1", lambda name: {}).by_gpu(L40S)
        assert dict(provider.reserved_for)[inventory.CLAIMS] == 8 * GB
        assert size_capacity(provider)[8] == 5

    def test_a_board_in_mixed_size_mode_gets_no_provider_and_says_how_to_fix(
        self, make_host, make_driver
    ):
        host = make_host("l40s-vfio")
        host.set_mixed_sizes(L40S, True)
        vgpu = make_driver(host, extra=[*POOL_LINES, *mixed_conf_lines()], types=",".join(MIXED))
        tree = vgpu.provider_tree("cn1")
        assert tree.by_gpu(L40S) is None
        assert dict(tree.unserved)[L40S].endswith(f"run vgpu-manage sriov sizes {L40S} equal")

    def test_the_planner_limit_is_nvidias_maximum(self, pool_board):
        host, vgpu = pool_board
        strategy = strategies.VendorVfioStrategy(host, None, vgpu.mdev_config)
        gpu = vgpu.manager.snapshot(refresh=True).gpu(L40S)
        assert {t: strategy.limit(gpu, t) for t in MIXED} == {
            FOUR: 12,
            EIGHT: 6,
            TWELVE: 4,
            TWENTY_FOUR: 2,
        }


class TestReading:
    def test_types_the_board_does_not_support_get_no_size(self, pool_board):
        host, vgpu = pool_board
        gpu = vgpu.manager.snapshot(refresh=True).gpu(L40S)
        reading = pool.read_board(host, gpu, (FOUR, "nvidia-468"))
        assert not reading.mixed and reading.error is None
        assert dict(reading.maxima) == {FOUR: 12}
        assert reading.placements[FOUR].size == 4

    def test_a_type_of_another_board_is_said(self, make_host, make_driver):
        host = make_host("l40s-vfio")
        vgpu = make_driver(
            host,
            extra=[*POOL_LINES, *mixed_conf_lines((FOUR, "nvidia-468"))],
            types=f"{FOUR},nvidia-468",
        )
        tree = vgpu.provider_tree("cn1")
        assert dict(tree.unserved)[L40S].startswith("cannot serve nvidia-468 in a type pool")


class TestChecksAndViews:
    def test_config_check_says_a_pool_in_mixed_size_mode(self, pool_board):
        host, vgpu = pool_board
        host.set_mixed_sizes(L40S, True)
        snapshot = vgpu.manager.snapshot(refresh=True)
        boards = inventory.read_boards(host, snapshot, vgpu.mdev_config)
        (problem,) = config_check_boards.mixed_size_modes(vgpu.mdev_config, boards)
        assert "configured as a type pool" in str(problem)
        assert f"sriov sizes {L40S} equal" in str(problem)

    def test_config_check_is_quiet_on_a_pool_in_equal_size_mode(self, pool_board):
        host, vgpu = pool_board
        snapshot = vgpu.manager.snapshot(refresh=True)
        boards = inventory.read_boards(host, snapshot, vgpu.mdev_config)
        assert config_check_boards.mixed_size_modes(vgpu.mdev_config, boards) == []
        schedulers = {L40S: vgpu_scheduler.FIXED_SHARE}
        assert (
            config_check_boards.fixed_share_on_mixed_boards(vgpu.mdev_config, snapshot, schedulers)
            == []
        )

    def test_status_names_the_pool(self, pool_board):
        _host, vgpu = pool_board
        allocate(vgpu, "vm-8", EIGHT, 8 * GB)
        snapshot = vgpu.manager.snapshot(refresh=True)
        view = status_assembly.assemble(
            "cn1", snapshot, vgpu.provider_tree("cn1"), vgpu.journal.claims(), {}
        )
        (board,) = view.gpus
        assert (board.unit, board.used, board.type_name) == ("MiB", 8 * GB, "type pool, in MiB")
        assert "type-pool framebuffer" in view.summary()


class TestReboot:
    def test_a_pool_comes_back_in_equal_size_mode(self, pool_board):
        host, vgpu = pool_board
        vfs = allocate(vgpu, "vm-8", EIGHT, 2 * 8 * GB)
        host.reboot()
        host.set_vfs(L40S, 16)  # sriov enable
        outcomes = vgpu.reconciler.restore()
        assert {(o.mdev_uuid, o.result) for o in outcomes} == {(vf, "restored") for vf in vfs}
        assert not host.heterogeneous_mode(L40S)
        assert typed(host) == dict.fromkeys(vfs, EIGHT)
        assert size_capacity(board_provider(vgpu)) == {4: 0, 8: 6, 12: 0, 24: 0}


T4 = "0000:18:00.0"
# GRID T4 types of 2 GB (8 per GPU), 4 GB (4) and another 4 GB type (4).
T4_TWO, T4_FOUR, T4_FOUR_OTHER = "nvidia-226", "nvidia-227", "nvidia-231"


@pytest.fixture
def t4_pool(make_host, make_driver):
    """``(host, driver)``: eight T4 (time-sliced, mdevs), the first pooled."""
    host = make_host("t4x8")
    types = (T4_TWO, T4_FOUR, T4_FOUR_OTHER)
    lines = [*POOL_LINES]
    for type_id in types:
        lines += [f"[mdev_{type_id}]", f"device_addresses = {T4}"]
    return host, make_driver(host, extra=lines, types=",".join(types))


def allocate_on(vgpu, gpu, instance, type_id, mib):
    provider = vgpu.provider_tree("cn1").by_gpu(gpu)
    return vgpu.allocate(
        instance,
        {"rp": {"resources": {RC: mib}}},
        {"rp": provider},
        type_traits={inventory.type_traits(type_id, None)[0]},
    )


class TestTimeSlicedPool:
    def test_an_empty_t4_offers_every_size_and_every_trait(self, t4_pool):
        _host, vgpu = t4_pool
        provider = vgpu.provider_tree("cn1").by_gpu(T4)
        assert provider.pool and size_capacity(provider) == {2: 8, 4: 4}
        assert {t for t in provider.traits if t.startswith("CUSTOM_MDEV_")} == {
            inventory.type_traits(t, None)[0] for t in (T4_TWO, T4_FOUR, T4_FOUR_OTHER)
        }

    def test_its_first_mdev_fixes_the_type_not_just_the_size(self, t4_pool):
        host, vgpu = t4_pool
        (uuid,) = allocate_on(vgpu, T4, "vm-4", T4_FOUR, 4 * GB)
        assert {m.uuid: m.type_id for m in host.list_mdevs()} == {uuid: T4_FOUR}
        provider = vgpu.provider_tree("cn1").by_gpu(T4)
        assert size_capacity(provider) == {2: 0, 4: 4}
        # A flavor of the other 4 GB type no longer matches: the GPU would
        # refuse it, one type at a time.
        assert {t for t in provider.traits if t.startswith("CUSTOM_MDEV_")} == {
            inventory.type_traits(T4_FOUR, None)[0]
        }
        with pytest.raises(exception.WrongTypePresent):
            allocate_on(vgpu, T4, "vm-4b", T4_FOUR_OTHER, 4 * GB)
        vgpu.release("vm-4")
        assert host.list_mdevs() == []
        assert size_capacity(vgpu.provider_tree("cn1").by_gpu(T4)) == {2: 8, 4: 4}
        allocate_on(vgpu, T4, "vm-2", T4_TWO, 2 * 2 * GB)
        assert size_capacity(vgpu.provider_tree("cn1").by_gpu(T4)) == {2: 8, 4: 0}

    @pytest.mark.parametrize("pools", [False, True])
    def test_the_privileged_side_gives_a_t4_its_types_only_in_a_pool(self, t4_pool, pools):
        _host, vgpu = t4_pool
        config = dataclasses.replace(vgpu.mdev_config, pools=pools)
        gpu = device.Gpu(T4, device.MODE_MDEV, (T4,))
        expected = tuple(sorted((T4_TWO, T4_FOUR, T4_FOUR_OTHER))) if pools else ()
        assert policy.configured_types(gpu, config) == expected
        assert inventory.configured_type(vgpu.manager.snapshot().gpu(T4), config)[0] == expected
