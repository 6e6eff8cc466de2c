"""The inventory of a mixed-size board against the fake vendor driver.

The property that matters: a request Placement would grant against the
inventories computed after the last change (the framebuffer class and the
size classes, :mod:`vgpu_driver.size_classes`) is one the board then
accepts, and a request of 1, 2 or 3 vGPUs of one type the board could hold
is one Placement grants, one request at a time, over random sequences of
creations and removals on an L40S in mixed-size mode (NVIDIA's 48 GB table,
Ada's 1 GB row) read through NVML.  Placement's rule is modelled here; the
functional tests run it with Placement itself.
"""

import collections
import random
import sys

import pytest

from vgpu_driver import framebuffer
from vgpu_driver import nvml
from vgpu_driver import size_classes
from vgpu_driver.fake import nvml as fake_nvml

L40S = "0000:c1:00.0"
BOARD_SLOTS = 48
SIZE_OF = {1155: 4, 1156: 8, 1157: 12, 1158: 16, 1159: 24, 1160: 48}
MIXES = [(1155, 1156, 1157), (1155, 1158, 1159, 1160), (1157, 1159), (1156,), tuple(SIZE_OF)]


def fits(record, used, amount):
    """Placement's rule for one class of a request against its inventory."""
    return (
        record["min_unit"] <= amount <= record["max_unit"]
        and amount % record["step_size"] == 0
        and used + amount <= (record["total"] - record["reserved"]) * record["allocation_ratio"]
    )


def grants(records, usage, request):
    """Placement's rule: every class of the request fits."""
    return all(
        rc in records and fits(records[rc], usage.get(rc, 0), amount)
        for rc, amount in request.items()
    )


def request_of(number, count):
    size = SIZE_OF[number]
    return {framebuffer.RESOURCE_CLASS: count * size * 1024, size_classes.class_name(size): count}


@pytest.fixture
def mixed_l40s(make_host, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml)
    host = make_host("l40s-vfio")
    fake_nvml.use_host(host.paths.root)
    nvml.set_heterogeneous_mode(L40S, True)
    yield host
    fake_nvml.use_host(None)


def board_state(host, types):
    """``(inventory records, usage, {VF: type})`` as the driver would read
    them now, every vGPU held by a guest whose allocation counts it."""
    present = {
        str(vf.address): vf.current_type for vf in host.list_vendor_vfio() if vf.current_type
    }
    free_vfs = sum(1 for vf in host.list_vendor_vfio() if not vf.current_type)
    used = sum(SIZE_OF[t] for t in present.values())
    found = nvml.placements(L40S, types)
    held = collections.Counter(SIZE_OF[t] for t in present.values())
    records = {
        framebuffer.RESOURCE_CLASS: framebuffer.inventory(
            BOARD_SLOTS, found, used, free_vfs
        ).as_placement()
    }
    records.update(
        (rc, found.as_placement())
        for rc, found in size_classes.inventories(found, held, {}, free_vfs).items()
    )
    usage = collections.Counter()
    for number in present.values():
        usage.update(request_of(number, 1))
    return records, usage, present


def creatable_now(host, number):
    return bool(host.placements(L40S, number)[2])


def board_accepts(host, number, count, keep=False):
    """Whether ``count`` free VFs take the type one after another; undone
    unless ``keep`` and accepted."""
    done = []
    for vf in [str(v.address) for v in host.list_vendor_vfio() if not v.current_type]:
        if len(done) == count:
            break
        try:
            host.set_vendor_vgpu_type(vf, number)
        except Exception:  # noqa: BLE001 - the board refused: what is asked
            break
        done.append(vf)
    accepted = len(done) == count
    if not (keep and accepted):
        for vf in done:
            host.set_vendor_vgpu_type(vf, 0)
    return accepted


@pytest.mark.parametrize("seed", range(6))
def test_placement_grants_exactly_what_the_board_then_accepts(mixed_l40s, seed):
    host, rng = mixed_l40s, random.Random(seed)
    types = MIXES[seed % len(MIXES)]
    granted = refused = 0
    for _step in range(40):
        records, usage, present = board_state(host, types)
        for number in types:
            for count in (1, 2, 3):
                assert grants(records, usage, request_of(number, count)) == board_accepts(
                    host, number, count
                ), (number, count, records, present)
        if present and rng.random() < 0.35:
            host.set_vendor_vgpu_type(rng.choice(sorted(present)), 0)
            continue
        number, count = rng.choice(types), rng.choice((1, 1, 2, 3))
        if not grants(records, usage, request_of(number, count)):
            refused += 1
            continue
        assert board_accepts(host, number, count, keep=True)
        granted += 1
    assert granted and refused, (granted, refused)


def test_the_two_cases_the_framebuffer_class_alone_gets_wrong(mixed_l40s):
    """Slots 36-47 the only free region: 12 GB of framebuffer, but only two
    4 GB placements (36, 44), so 3 x 4 GB is refused; an empty board takes
    2 x 24 GB although no single vGPU is 48 GB."""
    host = mixed_l40s
    types = (1155, 1157, 1159)
    records, usage, _present = board_state(host, types)
    assert grants(records, usage, request_of(1159, 2)) and board_accepts(host, 1159, 2)
    assert board_accepts(host, 1157, 3, keep=True)  # 0, 12, 24
    records, usage, _present = board_state(host, types)
    assert (
        records[framebuffer.RESOURCE_CLASS]["total"] - usage[framebuffer.RESOURCE_CLASS]
        == 12 * 1024
    )
    assert not grants(records, usage, request_of(1155, 3))
    assert not board_accepts(host, 1155, 3)
    assert grants(records, usage, request_of(1155, 2)) and board_accepts(host, 1155, 2)


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
    records, _usage, present = board_state(host, (1155, 1156))
    assert len(present) == 6
    fb = records[framebuffer.RESOURCE_CLASS]
    assert (fb["reserved"], fb["total"] - fb["reserved"]) == (16 * 1024, (24 + 8) * 1024)
    assert [
        records[size_classes.class_name(s)]["total"]
        - records[size_classes.class_name(s)]["reserved"]
        for s in (4, 8)
    ] == [6 + 2, 0]
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
    assert (with_vfs.capacity, with_vfs.reserved) == ((4 + 40) * 1024, 4 * 1024)
    assert (without.capacity, without.reserved) == (4 * 1024, 44 * 1024)
    # The held 4 GB vGPU, and 7 more 4 GB (8, 12, ..., 44) or 3 8 GB (16, 24, 40).
    held = {4: 1}
    assert [r.capacity for r in size_classes.inventories(found, held, {}, 15).values()] == [
        1 + 7,
        3,
    ]
    assert [r.capacity for r in size_classes.inventories(found, held, {}, 0).values()] == [1, 0]


def test_the_inventory_is_placements_own_shape():
    inventory = framebuffer.inventory(
        BOARD_SLOTS,
        {
            1157: nvml.Placements(12, (0, 12, 24, 36), (0, 12, 24, 36)),
            1159: nvml.Placements(24, (0, 24), (0, 24)),
        },
        0,
        16,
    )
    assert inventory.as_placement() == {
        "total": 49152,
        "reserved": 0,
        "min_unit": 12288,
        "max_unit": 49152,
        "step_size": 12288,
        "allocation_ratio": 1.0,
    }
    with pytest.raises(ValueError):
        framebuffer.inventory(BOARD_SLOTS, {}, 0, 16)


def test_size_classes_count_disjoint_placements_and_free_vfs():
    found = {
        1157: nvml.Placements(12, (0, 12, 24, 36), (12, 24, 36)),
        1159: nvml.Placements(24, (0, 24), (24,)),
    }
    by_class = size_classes.inventories(found, {12: 1}, {}, 16)
    assert {rc: r.as_placement() for rc, r in by_class.items()} == {
        "CUSTOM_VGPU_SIZE_12288_MIB": {
            "total": 4,
            "reserved": 0,
            "min_unit": 1,
            "max_unit": 4,
            "step_size": 1,
            "allocation_ratio": 1.0,
        },
        "CUSTOM_VGPU_SIZE_24576_MIB": {
            "total": 2,
            "reserved": 1,
            "min_unit": 1,
            "max_unit": 2,
            "step_size": 1,
            "allocation_ratio": 1.0,
        },
    }
    # Two free VFs: two vGPUs at most, whatever the placements say; a held
    # vGPU no allocation counts in its class is reserved.
    by_class = size_classes.inventories(found, {12: 1}, {12: 1}, 2)
    assert by_class["CUSTOM_VGPU_SIZE_12288_MIB"].capacity == 2
    assert size_classes.disjoint([0, 2, 3, 5, 6, 9], 3) == 4  # 0, 3, 6, 9
    assert size_classes.disjoint([2, 0, 4], 3) == 2  # 0, 4
    assert size_classes.disjoint([], 3) == 0


def test_lists_that_disagree_count_only_what_they_agree_on(caplog):
    """Two types of one size listing different IDs, and a creatable ID no
    list supports: only what every list supports and creates counts."""
    found = {
        1: nvml.Placements(4, (0, 8, 12), (0, 8, 12, 20)),
        2: nvml.Placements(4, (0, 8, 12), (0, 12)),
    }
    (only,) = size_classes.inventories(found, {}, {}, 16).values()
    assert (only.total, only.capacity) == (3, 2)
    assert "list different placements" in caplog.text and "not supported" in caplog.text
