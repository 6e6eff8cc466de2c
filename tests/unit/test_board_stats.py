"""What a host publishes of its boards, and the weight the scheduler gives it."""

import json

from tests.unit.test_type_pools import EIGHT
from tests.unit.test_type_pools import GB
from tests.unit.test_type_pools import L40S
from tests.unit.test_type_pools import allocate
from tests.unit.test_type_pools import pool_board  # noqa: F401 - the fixture
from vgpu_driver import board_stats
from vgpu_driver import inventory

FOUR_GB, EIGHT_GB, TWENTY_FOUR_GB = (
    "CUSTOM_VGPU_SIZE_4096_MIB",
    "CUSTOM_VGPU_SIZE_8192_MIB",
    "CUSTOM_VGPU_SIZE_24576_MIB",
)


def board(free, used=None):
    return board_stats.decode(
        json.dumps({"b": {"free": free, "used": used or dict.fromkeys(free, 0)}})
    )["b"]


EMPTY = board({FOUR_GB: 12, EIGHT_GB: 6, TWENTY_FOUR_GB: 2})
FOUR_GB_BROKEN = board({FOUR_GB: 9, EIGHT_GB: 0, TWENTY_FOUR_GB: 0}, {FOUR_GB: 3})
FOUR_GB_FULLER = board({FOUR_GB: 2, EIGHT_GB: 0, TWENTY_FOUR_GB: 0}, {FOUR_GB: 10})


def test_a_pool_board_is_published_as_placement_would_count_it(pool_board):  # noqa: F811
    _host, vgpu = pool_board
    allocate(vgpu, "vm-8", EIGHT, 2 * 8 * GB)
    tree = vgpu.provider_tree("cn1")
    published = json.loads(board_stats.encode(tree))
    name = inventory.provider_name("cn1", vgpu.manager.snapshot().gpu(L40S))
    assert published[name]["free"] == {
        FOUR_GB: 0,
        EIGHT_GB: 4,
        "CUSTOM_VGPU_SIZE_12288_MIB": 0,
        TWENTY_FOUR_GB: 0,
    }
    assert published[name]["used"][EIGHT_GB] == 2
    assert board_stats.decode(board_stats.encode(tree))[name].free[EIGHT_GB] == 4


def test_a_host_of_boards_of_one_type_publishes_nothing(make_host, make_driver):
    host = make_host("a100-sriov")
    assert board_stats.encode(make_driver(host).provider_tree("cn1")) is None


def test_a_stat_that_does_not_parse_is_no_board():
    for text in (None, "", "not json", '{"b": {"free": 3}}', "[1]"):
        assert board_stats.decode(text) == {}, text


def test_the_flavors_size_classes_are_read_whatever_the_group():
    specs = {
        "resources_VGPU:CUSTOM_VGPU_FRAMEBUFFER_MIB": "8192",
        "resources_VGPU:CUSTOM_VGPU_SIZE_4096_MIB": "2",
        "resources:VCPU": "2",
        "trait_VGPU:CUSTOM_MDEV_NVIDIA_1155": "required",
    }
    assert board_stats.requested_sizes(specs) == {FOUR_GB: 2}
    assert board_stats.requested_sizes({"resources:VGPU": "1"}) == {}


def test_a_host_with_a_broken_board_of_the_size_outweighs_one_of_empty_boards():
    wanted = {FOUR_GB: 1}
    broken = board_stats.host_weight([EMPTY, FOUR_GB_BROKEN], wanted)
    empty = board_stats.host_weight([EMPTY, EMPTY], wanted)
    fuller = board_stats.host_weight([EMPTY, FOUR_GB_FULLER], wanted)
    assert fuller > broken > empty > 0


def test_only_boards_that_take_the_request_count():
    # The broken board holds 4 GB vGPUs: an 8 GB request takes an empty board.
    assert board_stats.host_weight([FOUR_GB_FULLER], {EIGHT_GB: 1}) is None
    assert board_stats.host_weight([FOUR_GB_FULLER], {FOUR_GB: 3}) is None
    assert board_stats.host_weight([FOUR_GB_FULLER, EMPTY], {EIGHT_GB: 1}) == (
        board_stats.host_weight([EMPTY], {EIGHT_GB: 1})
    )
    assert board_stats.host_weight([EMPTY], {}) is None
