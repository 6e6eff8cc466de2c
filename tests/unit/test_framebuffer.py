"""The inventory of a mixed-size board against the fake vendor driver.

The property that matters: a request Placement would grant against the
inventory computed after the last change is one the board then accepts,
and a request the board could hold is one Placement grants, one request at
a time, over random sequences of creations and removals on an L40S in
mixed-size mode (NVIDIA's 48 GB table, Ada's 1 GB row) read through NVML.
"""

import random
import sys

import pytest

from vgpu_driver import framebuffer
from vgpu_driver import nvml
from vgpu_driver.fake import nvml as fake_nvml
from vgpu_driver.fake import placements

L40S = "0000:c1:00.0"
BOARD_SLOTS = 48
SIZE_OF = {1155: 4, 1156: 8, 1157: 12, 1158: 16, 1159: 24, 1160: 48}
MIXES = [(1155, 1156, 1157), (1155, 1158, 1159, 1160), (1157, 1159), (1156,),
         tuple(SIZE_OF)]


def grants(inventory, used_mib, request_mib):
    """Placement's rule for one request against one inventory."""
    return (inventory.min_unit <= request_mib <= inventory.max_unit
            and request_mib % inventory.step_size == 0
            and used_mib + request_mib <= inventory.capacity)


@pytest.mark.parametrize("board_mb, architecture", [(49152, None), (49152, "ada"),
                                                    (24576, None)])
def test_nvidias_placement_tables_nest(board_mb, architecture):
    """What the inventory's exactness rests on: each placement of a size
    holds a placement of every smaller size."""
    sizes = sorted(placements.TABLES[placements.slots(board_mb)])
    for big in sizes:
        for start in placements.supported(board_mb, big * 1024, architecture):
            inside = range(start, start + big)
            for small in (s for s in sizes if s < big):
                assert any(p in inside and p + small <= inside.stop for p in
                           placements.supported(board_mb, small * 1024, architecture)), \
                    (big, start, small)


@pytest.fixture
def mixed_l40s(make_host, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml)
    host = make_host("l40s-vfio")
    fake_nvml.use_host(host.paths.root)
    nvml.set_heterogeneous_mode(L40S, True)
    yield host
    fake_nvml.use_host(None)


def board_state(host, types):
    """``(inventory, {VF: type})`` as the driver would read them now."""
    present = {str(vf.address): vf.current_type for vf in host.list_vendor_vfio()
               if vf.current_type}
    free_vfs = sum(1 for vf in host.list_vendor_vfio() if not vf.current_type)
    used = sum(SIZE_OF[t] for t in present.values())
    found = nvml.placements(L40S, types)
    return framebuffer.inventory(BOARD_SLOTS, found, used, free_vfs), present


def creatable_now(host, number):
    return bool(host.placements(L40S, number)[2])


@pytest.mark.parametrize("seed", range(6))
def test_placement_grants_exactly_what_the_board_then_accepts(mixed_l40s, seed):
    host, rng = mixed_l40s, random.Random(seed)
    types = MIXES[seed % len(MIXES)]
    granted = refused = 0
    for _step in range(120):
        inventory, present = board_state(host, types)
        used_mib = sum(SIZE_OF[t] for t in present.values()) * framebuffer.SLOT_MIB
        assert inventory.total == BOARD_SLOTS * 1024 and inventory.reserved >= 0
        for number in types:
            free_vf = any(not vf.current_type for vf in host.list_vendor_vfio())
            assert grants(inventory, used_mib, SIZE_OF[number] * 1024) == (
                free_vf and creatable_now(host, number)), (number, inventory, present)
        if present and rng.random() < 0.35:
            host.set_vendor_vgpu_type(rng.choice(sorted(present)), 0)
            continue
        number = rng.choice(types)
        if not grants(inventory, used_mib, SIZE_OF[number] * 1024):
            refused += 1
            continue
        vf = next(str(v.address) for v in host.list_vendor_vfio() if not v.current_type)
        host.set_vendor_vgpu_type(vf, number)    # the board accepts what was granted
        granted += 1
    assert granted and refused, (granted, refused)


def test_a_fragmented_board_reserves_the_holes_no_configured_size_fits(mixed_l40s):
    """Every 4 GB placement of an Ada L40S taken (8: IDs 0, 8, 12, 20, 24,
    32, 36, 44), then those at 8 and 32 freed: 24 slots are free, but an
    8 GB vGPU (IDs 0, 16, 24, 40) fits nowhere; the two 4 GB holes are the
    capacity left and the other 16 free slots are reserved."""
    host = mixed_l40s
    vfs = [str(vf.address) for vf in host.list_vendor_vfio()]
    for vf in vfs[:8]:
        host.set_vendor_vgpu_type(vf, 1155)
    assert not creatable_now(host, 1155)
    for vf in vfs[:8]:
        if host.placement_of(vf) in (8, 32):
            host.set_vendor_vgpu_type(vf, 0)
    inventory, present = board_state(host, (1155, 1156))
    assert len(present) == 6
    assert (inventory.max_unit, inventory.reserved, inventory.capacity) == (
        4096, 16 * 1024, (24 + 8) * 1024)
    assert not creatable_now(host, 1156) and creatable_now(host, 1155)


def test_without_a_free_vf_nothing_is_left_to_grant(mixed_l40s):
    """One vGPU per VF: a board whose VFs all hold one has framebuffer left
    but nothing to put it in, so the free pool is all reserved."""
    mixed_l40s.set_vendor_vgpu_type(str(mixed_l40s.list_vendor_vfio()[0].address), 1155)
    found = nvml.placements(L40S, (1155, 1156))
    assert found[1155].creatable and found[1156].creatable
    with_vfs = framebuffer.inventory(BOARD_SLOTS, found, used_slots=4, free_vfs=15)
    without = framebuffer.inventory(BOARD_SLOTS, found, used_slots=4, free_vfs=0)
    # The 4 GB vGPU took ID 0: slots 4-7 are no placement of 4 or 8 GB now.
    assert (with_vfs.capacity, with_vfs.max_unit, with_vfs.reserved) == (
        (4 + 40) * 1024, 8192, 4 * 1024)
    assert (without.capacity, without.max_unit, without.reserved) == (
        4 * 1024, 4096, 44 * 1024)


def test_the_inventory_is_placements_own_shape():
    inventory = framebuffer.inventory(
        BOARD_SLOTS, {1157: nvml.Placements(12, (0, 12, 24, 36), (0, 12, 24, 36)),
                      1159: nvml.Placements(24, (0, 24), (0, 24))}, 0, 16)
    assert inventory.as_placement() == {
        "total": 49152, "reserved": 0, "min_unit": 12288, "max_unit": 24576,
        "step_size": 12288, "allocation_ratio": 1.0}
    with pytest.raises(ValueError):
        framebuffer.inventory(BOARD_SLOTS, {}, 0, 16)
