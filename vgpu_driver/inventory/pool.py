"""The provider of a pool board: several NVIDIA types, one size at a time.

With ``[devices] shared_board_mode = pool`` a vendor-VFIO board listed
under several types stays in NVIDIA's equal-size mode, where "the content
of the creatable_vgpu_types for all virtual functions on the physical GPU
is set to only the vGPU types with the same amount of frame buffer" as the
board's first vGPU (*Virtual GPU Software User Guide* 17.0, 2.10.8.2), up
to the type's per-board maximum (``nvmlVgpuTypeGetMaxInstances``); once the
last vGPU goes (its VF's type cleared on release) every size is creatable
again.  So while the board is empty it offers every size of its types, and
then only its vGPUs' size.  A GPU whose vGPUs are mdevs pools too: an
SR-IOV board over mdev keeps the same rule (after one vGPU on a sibling
VF, "only types of the same framebuffer size stay available", as NVIDIA's
A2 shows in Harvester's fixtures); a time-sliced GPU such as the T4, its
own mdev parent, hosts one *type* at a time, so once typed it offers its
type alone and carries only that type's trait, Placement then refusing a
type of the same size the GPU would refuse.  There the sizes and maxima
are the types' ``framebuffer=`` and ``max_instance=``.

It is served in the encoding of a mixed-size board (one inventory of
framebuffer MiB, one per vGPU size, :mod:`vgpu_driver.size_classes`), so
one flavor serves both kinds of board.  One request at a time, Placement
grants exactly what the board takes: the size class of ``s`` grants ``N``
iff the board is empty or holds size ``s``, and ``N`` more fit under the
maximum and in the free VFs; the framebuffer class keeps free just the
room of the size the board can still take.  Two requests of two sizes
granted on one empty board between two updates: the board refuses the
second (its VFs no longer list that size) and nova reschedules it.
"""

from __future__ import annotations

import collections
import math
import types
from collections.abc import Collection
from collections.abc import Mapping
from collections.abc import Sequence
from typing import TYPE_CHECKING

from vgpu_driver import exception
from vgpu_driver import framebuffer
from vgpu_driver import host_snapshot
from vgpu_driver import names
from vgpu_driver import nvml
from vgpu_driver import size_classes
from vgpu_driver.inventory import providers
from vgpu_driver.inventory import vf_room

if TYPE_CHECKING:
    from vgpu_driver.framebuffer import BoardReading
    from vgpu_driver.host_snapshot import HostSnapshot
    from vgpu_driver.host_snapshot import PhysicalGPU
    from vgpu_driver.sysfs.base import SysfsReader

SLOT_MIB = framebuffer.SLOT_MIB


def read_board(host: SysfsReader, gpu: PhysicalGPU, type_ids: Collection[str]) -> BoardReading:
    """What a pool board's types take, for the types of ``type_ids`` and
    those its vGPUs hold: each one's size (as a
    :class:`~vgpu_driver.nvml.Placements` without IDs) and its most vGPUs
    per board.  Under vendor VFIO NVML's, with the board's mode, in one
    pass; for mdevs, their types' descriptions (``framebuffer=``,
    ``max_instance=``, which NVIDIA's vGPU manager writes in sysfs)."""
    wanted = sorted({*type_ids, *gpu.vgpu_types_in_use()}, key=names.vendor_type_number)
    if gpu.mode == host_snapshot.MODE_MDEV:
        return _described(gpu, wanted)
    try:
        if _mixed_sizes(host, gpu.address):
            return framebuffer.BoardReading(mixed=True)
        found = host.vgpu_equal_sizes(gpu.address, [names.vendor_type_number(t) for t in wanted])
    except (exception.NvmlUnavailable, exception.MixedSizeModeRefused) as exc:
        return framebuffer.BoardReading(error=str(exc))
    return _reading({names.vendor_type_id(n): found[n] for n in found})


def _described(gpu: PhysicalGPU, type_ids: Collection[str]) -> BoardReading:
    """:func:`read_board` of a GPU whose vGPUs are mdevs, from sysfs."""
    found = {}
    for type_id in type_ids:
        info = gpu.type_info(type_id)
        if info is not None and info.framebuffer_mb and info.max_instance:
            found[type_id] = (info.framebuffer_mb, info.max_instance)
    return _reading(found)


def _reading(found: Mapping[str, tuple[int, int]]) -> BoardReading:
    """The reading of ``{type id: (MiB, most)}``; a size that is no whole
    number of slots cannot be a size class, so its type is left out."""
    sizes: dict[str, nvml.Placements] = {}
    maxima: dict[str, int] = {}
    for type_id, (mib, most) in found.items():
        if mib > 0 and not mib % SLOT_MIB:
            sizes[type_id] = nvml.Placements(mib // SLOT_MIB, (), ())
            maxima[type_id] = most
    return framebuffer.BoardReading(
        placements=types.MappingProxyType(sizes), maxima=types.MappingProxyType(maxima)
    )


def _mixed_sizes(host: SysfsReader, address: str) -> bool:
    """Whether the board is in mixed-size mode; a board NVML says cannot
    mix sizes is in equal-size mode."""
    try:
        return host.mixed_sizes(address)
    except exception.MixedSizeModeRefused:
        return False


def pool_provider(
    snapshot: HostSnapshot,
    gpu: PhysicalGPU,
    type_ids: Sequence[str],
    reading: BoardReading | None,
    nodename: str,
    in_use: Collection[str] | None = None,
    unallocated: int | Mapping[str, int] | None = None,
) -> tuple[providers.GpuProvider | None, str | None]:
    """``(GpuProvider, None)`` of a pool board serving ``type_ids``, or
    ``(None, why it cannot)``.

    VFs that guests or claims hold (``in_use``) count as used; a typed VF
    nobody holds still fixes the board's size and takes one of its vGPUs;
    claims Placement does not count (``unallocated``: ``{class: units}``)
    are reserved.
    """
    why_not = _why_not_pool(gpu, type_ids, reading)
    if why_not or reading is None:
        return None, why_not
    size_of = {t: reading.placements[t].size for t in type_ids}
    vgpus = _vgpus(gpu)
    of_type = collections.Counter(t for _id, t in vgpus)
    taken = collections.Counter(reading.placements[t].size for _id, t in vgpus)
    # A GPU whose vGPUs share it by time slices hosts one type at a time
    # (NVIDIA's rule before mixed sizes); an SR-IOV board, one size.
    one_type = not vf_room.one_per_vf(gpu)
    if len(taken) > 1 or (one_type and len(of_type) > 1):
        return None, (
            "its vGPUs are of several sizes or types, which equal-size mode does "
            "not allow: is the board in mixed-size mode?"
        )
    held = collections.Counter(
        reading.placements[t].size for v, t in vgpus if in_use is None or v in in_use
    )
    vfs = len(gpu.parents) if not one_type else None
    free_vfs = (
        sum(1 for p in gpu.parents if not p.busy and (in_use is None or p.name not in in_use))
        if vfs is not None
        else max(reading.maxima.values())
    )
    most = most_by_size(size_of, reading.maxima, vfs)
    current = next(iter(of_type), None) if one_type else None
    limits = most if current is None else _one_type_limits(most, reading, current, vfs)
    room = room_by_size(limits, taken, free_vfs)
    if not isinstance(unallocated, Mapping):
        unallocated = {framebuffer.RESOURCE_CLASS: unallocated or 0}
    by_size = _size_inventories(most, held, room, unallocated)
    board = max(count * size for size, count in most.items())
    held_slots = sum(size * count for size, count in held.items())
    # Free: just the room of the size the board can take the most of.
    spare = max(board - held_slots - max(count * size for size, count in room.items()), 0)
    claims_mib = min(unallocated.get(framebuffer.RESOURCE_CLASS, 0), held_slots * SLOT_MIB)
    reserved_for = providers.shared_board_reserved(spare * SLOT_MIB, claims_mib)
    return providers.GpuProvider(
        name=providers.provider_name(nodename, gpu),
        parent_provider=nodename,
        gpu=gpu.address,
        type_id=",".join(type_ids),
        type_name=None,
        resource_class=framebuffer.RESOURCE_CLASS,
        total=board * SLOT_MIB,
        reserved=spare * SLOT_MIB + claims_mib,
        min_unit=min(most) * SLOT_MIB,
        max_unit=board * SLOT_MIB,
        step_size=math.gcd(*most) * SLOT_MIB,
        traits=providers.shared_board_traits(snapshot, gpu, (current,) if current else type_ids),
        reason=_pool_reason(type_ids, next(iter(taken), None), room, current),
        reserved_for=reserved_for,
        sizes=tuple((t, size_of[t] * SLOT_MIB) for t in type_ids),
        size_inventories=tuple(sorted(by_size.items())),
        pool=True,
    ), None


def most_by_size(
    size_of: Mapping[str, int], maxima: Mapping[str, int], vfs: int | None
) -> dict[int, int]:
    """``{size: most vGPUs of it the board holds}``: the largest maximum
    among the types of that size, and on an SR-IOV board (``vfs``) one VF
    each."""
    most: dict[int, int] = {}
    for type_id, size in size_of.items():
        count = maxima[type_id] if vfs is None else min(maxima[type_id], vfs)
        most[size] = max(most.get(size, 0), count)
    return most


def _one_type_limits(
    most: Mapping[int, int], reading: BoardReading, current: str, vfs: int | None
) -> dict[int, int]:
    """The limits of a GPU of one type at a time holding ``current``: its
    maximum in its size, nothing in the others."""
    size = reading.placements[current].size
    limit = reading.maxima[current] if vfs is None else min(reading.maxima[current], vfs)
    return {s: limit if s == size else 0 for s in {*most, size}}


def _vgpus(gpu: PhysicalGPU) -> list[tuple[str, str]]:
    """``[(vGPU id, type id)]`` of the GPU: its mdevs and its typed VFs."""
    found = [(m.uuid, m.type_id) for m in gpu.mdevs]
    return found + [(p.name, p.current_vgpu_type) for p in gpu.parents if p.current_vgpu_type]


def room_by_size(
    most: Mapping[int, int], taken: Mapping[int, int], free_vfs: int
) -> dict[int, int]:
    """``{size: vGPUs of it that may still be created}``: none of a size
    other than the one the board holds (``taken``: ``{size: typed VFs}``),
    else its maximum less those, one free VF each."""
    return {
        size: max(min(count - taken.get(size, 0), free_vfs), 0) if not taken or size in taken else 0
        for size, count in most.items()
    }


def _size_inventories(
    most: Mapping[int, int],
    held: Mapping[int, int],
    room: Mapping[int, int],
    unallocated: Mapping[str, int],
) -> dict[str, size_classes.SizeInventory]:
    """``{size class: SizeInventory}``: of each size, what Placement counts
    (held, less the claims it does not count) plus what may still be
    granted (``room``); the rest of its maximum reserved."""
    found = {}
    for size, count in most.items():
        name = size_classes.class_name(size)
        counted = max(held.get(size, 0) - unallocated.get(name, 0), 0)
        total = max(count, counted + room[size], 1)
        found[name] = size_classes.SizeInventory(
            total=total, reserved=total - counted - room[size], available=room[size]
        )
    return found


def _pool_reason(
    type_ids: Sequence[str], taken: int | None, room: Mapping[int, int], current: str | None
) -> str:
    """What a pool board can still take, for the operator's views
    (``current``: the one type a GPU of one type at a time holds)."""
    listed = ", ".join(type_ids)
    if taken is None:
        fits = ", ".join(
            f"{count} x {size * SLOT_MIB} MiB" for size, count in sorted(room.items()) if count
        )
        return f"type pool ({listed}), empty: fit {fits or 'nothing (no free VF)'}"
    held = f"{current} vGPUs" if current else "vGPUs"
    state = f"fit {room[taken]} more" if room[taken] else "full"
    return f"type pool ({listed}) of {taken * SLOT_MIB} MiB {held}: {state}"


def _why_not_pool(
    gpu: PhysicalGPU, type_ids: Sequence[str], reading: BoardReading | None
) -> str | None:
    """Why a board configured as a pool of ``type_ids`` gets no provider
    from what NVML said (``reading``), or None."""
    listed = ", ".join(type_ids)
    if reading is None or reading.error:
        why = reading.error if reading else "NVML was not asked"
        return f"configured as a type pool ({listed}), but NVML cannot say: {why}"
    if reading.mixed:
        return (
            f"configured as a type pool ({listed}) but in mixed-size mode: run "
            f"vgpu-manage sriov sizes {gpu.address} equal"
        )
    unknown = [t for t in type_ids if t not in reading.placements]
    if unknown:
        return (
            f"cannot serve {', '.join(unknown)} in a type pool: not a vGPU type of "
            "this board (see vgpu-manage types)"
        )
    held = sorted(t for t in gpu.vgpu_types_in_use() if t not in reading.placements)
    if held:
        return (
            f"its VFs hold {', '.join(held)}, whose size NVML does not tell; it "
            "gets a provider once they are gone"
        )
    return None
