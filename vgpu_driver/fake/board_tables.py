"""NVIDIA's time-sliced vGPU boards and where each type may sit on them.

A GPU in mixed-size mode is a *placement region* of slots of 1 GB, as many
as the board's framebuffer in GB; a vGPU takes ``size`` consecutive slots
from its *placement ID*.  Which IDs a type may take is computed by NVIDIA's
vGPU manager from the board's type list (``kvgpumgrSetSupportedPlacementIds``
in ``src/nvidia/src/kernel/virtualization/kernel_vgpu_mgr.c`` of NVIDIA's
open-gpu-kernel-modules); the *Virtual GPU Software User Guide* publishes
the result per board framebuffer (release 17, appendix A.3 "vGPU Placements
for GPUs in Mixed-Size Mode", and the mixed-size maxima of each board's type
tables).  This module applies the same rules to a board's types:

* Before Blackwell the region is halved recursively (1/2 ... 1/16); a type
  whose equal-size maximum is ``2 * parts`` gets both ends of each of the
  ``parts`` partitions, a type whose maximum is not a power of two gets one
  end (the outer one) of each partition of ``prevPow2(max)`` parts
  (``_kvgpumgrSetHeterogeneousResources``).  A 1 GB type that leaves the
  board room (maximum x 1 GB below the framebuffer: "1GB profiles on 48GB
  board") loses the IDs on the driver's deny list: 8 and 32 on Ampere,
  sixteen IDs on GSP boards, Ada and Hopper (``_kvgpumgrIsPlacementValid``).
* GB100 and later space a type's ``max`` placements evenly:
  ``region * j // max`` (``_kvgpumgrSetHeterogeneousResources_GB100``), the
  same in equal-size mode, so equal-size and mixed-size maxima are equal.
  On a 96 GB board a 2 GB type takes 3 slots (``_kvgpumgrGetplacementSize``).
* In equal-size mode Ada and later boards place vGPUs too (homogeneous
  placements, reported by NVML from R565): ``j * size`` up to the type's
  maximum before Blackwell (``_kvgpumgrSetHomogeneousResources``), the
  mixed-size ones from Blackwell on.  Ampere boards have none.
* A placement is creatable while none of its slots is taken
  (``_kvgpumgrUpdateHeterogeneousCreatablePlacementIds``).

Where sources differ the fake takes the conservative reading, and says so:
mixed-size mode is offered on the boards the guide lists (A100 40/80 GB,
A40, A10, Ada, Hopper, Blackwell), not on "Volta and later" as the AI
Enterprise pages put it; a 96 GB board's smallest type here is 2 GB (the
driver's comment allows 32 of them; no 1 GB row is published).  Board type
lists and equal-size maxima are those of the guide's per-board tables; type
names are the guide's, type numbers elsewhere are illustrative.

API for tests and the fake vendor driver: :data:`BOARDS`, :func:`board`,
:func:`supported`, :func:`homogeneous`, :func:`creatable`,
:func:`board_of_gpu` (a fake host profile's GPU entry as a :class:`Board`).
"""

import functools
from types import MappingProxyType
from typing import NamedTuple

AMPERE, ADA, HOPPER, BLACKWELL = "ampere", "ada", "hopper", "blackwell"
ARCHITECTURES = (AMPERE, ADA, HOPPER, BLACKWELL)
# The vGPU manager's limits (MAX_VGPU_DEVICES_PER_PGPU; the 1/16 partition).
MAX_VGPUS_PER_GPU = 32
# NVIDIA's placement ID of a vGPU without one (NVA081_PLACEMENT_ID_INVALID, ctrla081.h).
PLACEMENT_ID_INVALID = 0xFFFF
_DENY_1GB = {
    AMPERE: frozenset({8, 32}),
    # GSP boards (Ada, Hopper): denyListAdaHopper.
    ADA: frozenset({2, 3, 8, 9, 14, 15, 20, 21, 26, 27, 32, 33, 38, 39, 44, 45}),
}
_DENY_1GB[HOPPER] = _DENY_1GB[ADA]


class VgpuType(NamedTuple):
    """A time-sliced type: its framebuffer and its equal-size maximum."""

    name: str
    framebuffer_gb: int
    max_instances: int


class Board(NamedTuple):
    """A board: its architecture, framebuffer (placement region) and types."""

    key: str
    product: str
    architecture: str
    framebuffer_gb: int
    types: tuple[VgpuType, ...]


class Placeable(NamedTuple):
    """A type's placement size in slots and the IDs it may take (or can now)."""

    type: VgpuType
    size: int
    placements: tuple[int, ...]


def _series(prefix, suffix, sizes_and_maxima):
    return tuple(VgpuType(f"NVIDIA {prefix}-{gb}{suffix}", gb, mx) for gb, mx in sizes_and_maxima)


# Equal-size maxima as the guide's type tables give them (framebuffer / size,
# at most 32 per GPU).
_48 = ((1, 32), (2, 24), (3, 16), (4, 12), (6, 8), (8, 6), (12, 4), (16, 3), (24, 2), (48, 1))
_24 = ((1, 24), (2, 12), (3, 8), (4, 6), (6, 4), (8, 3), (12, 2), (24, 1))
_40 = ((4, 10), (5, 8), (8, 5), (10, 4), (20, 2), (40, 1))
_80 = ((4, 20), (5, 16), (8, 10), (10, 8), (16, 5), (20, 4), (40, 2), (80, 1))
# The A100 80GB has no 5 GB type (AI Enterprise 5.0 guide, A.6), the H100 NVL
# no 31 GB one (A.12).
_80_A100 = tuple(row for row in _80 if row[0] != 5)
_94 = ((4, 23), (6, 15), (11, 8), (15, 6), (23, 4), (47, 2), (94, 1))
_96 = (
    (2, 32),
    (3, 32),
    (4, 24),
    (6, 16),
    (8, 12),
    (12, 8),
    (16, 6),
    (24, 4),
    (32, 3),
    (48, 2),
    (96, 1),
)

BOARDS = {
    b.key: b
    for b in (
        Board("a100-40gb", "NVIDIA A100-PCIE-40GB", AMPERE, 40, _series("A100", "C", _40)),
        Board("a100-80gb", "NVIDIA A100 80GB PCIe", AMPERE, 80, _series("A100D", "C", _80_A100)),
        Board("a40", "NVIDIA A40", AMPERE, 48, _series("A40", "Q", _48)),
        Board("a10", "NVIDIA A10", AMPERE, 24, _series("A10", "Q", _24)),
        Board("l40s", "NVIDIA L40S", ADA, 48, _series("L40S", "Q", _48)),
        Board("l4", "NVIDIA L4", ADA, 24, _series("L4", "Q", _24)),
        Board("h100-80gb", "NVIDIA H100 PCIe", HOPPER, 80, _series("H100", "C", _80)),
        Board("h100-nvl", "NVIDIA H100 NVL", HOPPER, 94, _series("H100L", "C", _94)),
        Board(
            "rtx-pro-6000-blackwell-se",
            "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            BLACKWELL,
            96,
            _series("DC", "Q", _96),
        ),
    )
}


def board(key):
    """The board of :data:`BOARDS` called ``key``."""
    return BOARDS[key]


def board_of_gpu(gpu):
    """A fake host model's GPU entry (``architecture``, ``framebuffer_mb``,
    ``types`` with ``id``, ``framebuffer_mb`` and ``max``) as a
    :class:`Board` whose types are named by their type id (``nvidia-1155``);
    None where it lacks what the rules need."""
    if gpu.get("architecture") not in ARCHITECTURES or not gpu.get("framebuffer_mb"):
        return None
    types = tuple(
        VgpuType(spec["id"], gb(spec["framebuffer_mb"]), int(spec["max"]))
        for spec in gpu.get("types", ())
        if spec.get("max") and spec.get("framebuffer_mb")
    )
    return Board(
        gpu.get("address", ""),
        gpu.get("product_name", ""),
        gpu["architecture"],
        gb(gpu["framebuffer_mb"]),
        types,
    )


def gb(framebuffer_mb):
    """A framebuffer in whole GB, as the driver divides profile sizes."""
    return max(round(framebuffer_mb / 1024), 1)


def placement_size(board_, vgpu_type):
    """Slots a vGPU of ``vgpu_type`` takes on ``board_``."""
    if board_.framebuffer_gb == 96 and vgpu_type.framebuffer_gb == 2:
        return 3
    return vgpu_type.framebuffer_gb


def _prev_pow2(n):
    return 1 << (n.bit_length() - 1)


def _denied(board_, vgpu_type):
    if board_.architecture == BLACKWELL or vgpu_type.framebuffer_gb != 1:
        return frozenset()
    if vgpu_type.max_instances >= board_.framebuffer_gb:
        return frozenset()  # the guest's 1 GB carries reserved framebuffer
    return _DENY_1GB[board_.architecture]


def _halving(board_, vgpu_type):
    """Pre-Blackwell placements: the recursive halving of the region."""
    size, most = placement_size(board_, vgpu_type), vgpu_type.max_instances
    one_per_part = _prev_pow2(most)
    found = []

    def visit(low, high, parts, left):
        if parts > MAX_VGPUS_PER_GPU // 2:
            return
        both = parts * 2 == most
        one = (one_per_part < most and one_per_part == parts) or (parts == 1 and most == 1)
        if both or (one and left):
            found.append(low)
        if both or (one and not left):
            found.append(high - size)
        middle = (low + high) // 2
        visit(low, middle, parts * 2, True)
        visit(middle, high, parts * 2, False)

    visit(0, board_.framebuffer_gb, 1, True)
    denied = _denied(board_, vgpu_type)
    return tuple(sorted(p for p in found if p not in denied))


def _evenly_spaced(board_, vgpu_type):
    """Blackwell and later: ``max`` placements evenly spaced."""
    most, region = vgpu_type.max_instances, board_.framebuffer_gb
    return tuple(region * j // most for j in range(most))


# The tables depend on the board alone, and the fake reads them for every
# VF and type after every change: each board's are worked out once, and
# handed out read-only.
@functools.lru_cache(maxsize=128)
def supported(board_):
    """``{type name: Placeable}``: where each type may sit in mixed-size mode."""
    rule = _evenly_spaced if board_.architecture == BLACKWELL else _halving
    return MappingProxyType(
        {t.name: Placeable(t, placement_size(board_, t), rule(board_, t)) for t in board_.types}
    )


@functools.lru_cache(maxsize=128)
def homogeneous(board_):
    """``{type name: Placeable}`` in equal-size mode; empty before Ada."""
    if board_.architecture == AMPERE:
        return MappingProxyType({})
    if board_.architecture == BLACKWELL:
        return supported(board_)
    found = {}
    for t in board_.types:
        size = placement_size(board_, t)
        count = min(board_.framebuffer_gb // size, t.max_instances)
        found[t.name] = Placeable(t, size, tuple(j * size for j in range(count)))
    return MappingProxyType(found)


def occupied(board_, used):
    """Slots taken by ``used``: ``(type name, placement ID)`` of the board's vGPUs."""
    sizes = {t.name: placement_size(board_, t) for t in board_.types}
    return {slot for name, start in used for slot in range(start, start + sizes[name])}


def creatable(board_, used, mixed=True):
    """``[Placeable]`` per type of ``board_``, with the IDs creatable now
    given ``used`` (``(type name, placement ID)`` pairs); ``mixed`` False
    gives equal-size mode's homogeneous placements (where a used size is
    the only size left)."""
    return list(_creatable(board_, tuple(sorted(used)), mixed))


# After a change the fake asks this for each VF and type of the board with
# the same vGPUs: the answer depends on the set of them, not their order.
@functools.lru_cache(maxsize=256)
def _creatable(board_, used, mixed):
    taken = occupied(board_, used)
    table = supported(board_) if mixed else homogeneous(board_)
    used_sizes = {t.framebuffer_gb for t in board_.types for name, _ in used if name == t.name}
    found = []
    for entry in table.values():
        if not mixed and used_sizes and used_sizes != {entry.type.framebuffer_gb}:
            found.append(entry._replace(placements=()))
            continue
        free = tuple(p for p in entry.placements if taken.isdisjoint(range(p, p + entry.size)))
        found.append(entry._replace(placements=free))
    return tuple(found)


def host_profile(
    board_,
    address,
    numvfs=16,
    first_type=2000,
    version="550.127.06",
    model="nvidia-vfio",
    device="0x2000",
):
    """A fake host profile (:mod:`vgpu_driver.fake.profiles`'s format) whose
    one GPU at ``address`` is a board of ``board_``'s family under vendor
    VFIO with ``numvfs`` VFs on, every type of the family offered as
    ``nvidia-<first_type + n>`` (type numbers illustrative)."""
    return {
        "name": board_.key,
        "nvidia_vgpu_manager": version,
        "gpus": [
            {
                "address": address,
                "model": model,
                "vendor": "0x10de",
                "device": device,
                "product_name": board_.product,
                "framebuffer_mb": board_.framebuffer_gb * 1024,
                "architecture": board_.architecture,
                "heterogeneous_sizes": True,
                "sriov": {"totalvfs": numvfs, "numvfs": numvfs, "offset": 4, "stride": 1},
                "types": [
                    {
                        "id": f"nvidia-{first_type + n}",
                        "name": t.name,
                        "device_api": "vfio-pci",
                        "framebuffer_mb": t.framebuffer_gb * 1024,
                        "max": t.max_instances,
                    }
                    for n, t in enumerate(board_.types)
                ],
            }
        ],
    }
