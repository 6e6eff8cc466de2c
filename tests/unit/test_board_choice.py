"""The order of boards for a vGPU request, from what Placement holds."""

import pytest

from vgpu_driver import board_choice
from vgpu_driver import framebuffer
from vgpu_driver import size_classes

GB = framebuffer.SLOT_MIB


def size_rc(gb):
    return size_classes.class_name(gb)


def l40s(free, used=None):
    """A 48 GB board's room: ``free``/``used`` as ``{GB: vGPUs}``."""
    used = used or {}
    return board_choice.BoardCounts(
        free={size_rc(gb): n for gb, n in free.items()},
        used={size_rc(gb): used.get(gb, 0) for gb in free},
    )


EMPTY = l40s({4: 8, 8: 4, 12: 4, 24: 2})
# A 12 GB vGPU at slot 0: half 0 broken, half 1 whole.
ONE_TWELVE = l40s({4: 6, 8: 3, 12: 3, 24: 1}, {12: 1})


def test_a_broken_large_room_comes_before_a_whole_one():
    assert board_choice.order({"empty": EMPTY, "broken": ONE_TWELVE}, ["empty", "broken"]) == [
        "broken",
        "empty",
    ]


def test_then_the_board_with_less_useful_room():
    # Both have one 24 GB room left; the second has less free room besides.
    roomy = l40s({4: 6, 8: 3, 12: 3, 24: 1}, {12: 1})
    tight = l40s({4: 5, 8: 2, 12: 2, 24: 1}, {12: 1, 4: 1})
    assert board_choice.order({"roomy": roomy, "tight": tight}, ["roomy", "tight"]) == [
        "tight",
        "roomy",
    ]


def test_ties_keep_the_order_given():
    rooms = {"a": EMPTY, "b": EMPTY, "c": EMPTY}
    assert board_choice.order(rooms, ["c", "a", "b"]) == ["c", "a", "b"]


def test_equal_size_boards_fullest_first():
    rooms = {
        "half": board_choice.BoardCounts(free={"VGPU": 8}, used={"VGPU": 8}),
        "empty": board_choice.BoardCounts(free={"VGPU": 16}, used={"VGPU": 0}),
        "nearly": board_choice.BoardCounts(free={"VGPU": 1}, used={"VGPU": 15}),
    }
    assert board_choice.order(rooms, ["empty", "half", "nearly"]) == ["nearly", "half", "empty"]


def test_demand_counts_the_vgpus_in_use_plus_one_of_each_size():
    shares = board_choice.demand([ONE_TWELVE, l40s({4: 7, 8: 4, 12: 4, 24: 2}, {4: 3})])
    # 4 GB: 1 + 3, 8 GB: 1, 12 GB: 1 + 1, 24 GB: 1 -> of 8.
    assert shares == pytest.approx({4 * GB: 4 / 8, 8 * GB: 1 / 8, 12 * GB: 2 / 8, 24 * GB: 1 / 8})


def test_the_demand_weighs_which_free_room_matters():
    # Same 24 GB room; one has more free 4 GB vGPUs, the other more 12 GB.
    fours = l40s({4: 6, 8: 2, 12: 2, 24: 1}, {8: 1})
    twelves = l40s({4: 4, 8: 2, 12: 3, 24: 1}, {8: 1})
    rooms = {"fours": fours, "twelves": twelves}
    many_fours = {4 * GB: 0.9, 12 * GB: 0.1}
    many_twelves = {4 * GB: 0.1, 12 * GB: 0.9}
    assert board_choice.rank(twelves, many_fours) < board_choice.rank(fours, many_fours)
    assert board_choice.rank(fours, many_twelves) < board_choice.rank(twelves, many_twelves)
    assert set(board_choice.order(rooms, ["fours", "twelves"])) == set(rooms)


def test_counts_of_placement_records_leaves_out_the_framebuffer_and_other_classes():
    inventories = {
        framebuffer.RESOURCE_CLASS: {"total": 48 * GB, "reserved": 0},
        size_rc(24): {"total": 2, "reserved": 1, "allocation_ratio": 1.0},
        size_rc(4): {"total": 8, "reserved": 0, "allocation_ratio": 1.0},
        "VCPU": {"total": 16, "reserved": 0, "allocation_ratio": 4.0},
    }
    usages = {framebuffer.RESOURCE_CLASS: 4 * GB, size_rc(4): 1}
    room = board_choice.counts_of(inventories, usages)
    assert room == board_choice.BoardCounts(
        free={size_rc(24): 1, size_rc(4): 7}, used={size_rc(24): 0, size_rc(4): 1}
    )
    assert room.sizes == {24 * GB: 1, 4 * GB: 7}


def test_counts_of_a_provider_summary():
    summary = {
        "resources": {
            "VGPU": {"capacity": 4, "used": 5},  # over-used after a shrink: no room
            framebuffer.RESOURCE_CLASS: {"capacity": 48 * GB, "used": 0},
        }
    }
    assert board_choice.counts_of_summary(summary) == board_choice.BoardCounts(
        free={"VGPU": 0}, used={"VGPU": 5}
    )
