"""The Placement inventory of a board that mixes vGPU sizes.

On a board in mixed-size mode every vGPU takes a run of framebuffer
*slots* of about 1 GB at a *placement ID* NVIDIA's driver allows for its
size, so the board's framebuffer is one shared, fragmentable pool.
Per-type VGPU inventories would each ignore the others and oversubscribe
it; instead the board is one inventory of :data:`RESOURCE_CLASS`, counted
in MiB of slots (a vGPU of N slots takes ``N * 1024``), and a flavor asks
for its type's amount beside a trait naming the type.

Alone it is not exact: it cannot say how many vGPUs of one size the free
slots hold (a free 12 GB region may hold only two 4 GB placements), and
NVIDIA's tables need not nest (on Blackwell a 32 GB placement holds no
24 GB one).  So each placement size also has a class counted in vGPUs
(:mod:`vgpu_driver.size_classes`), which makes Placement exact for every
one-type request; this class only keeps the framebuffer's account: its
``max_unit`` is the whole board (2 x 24 GB fit on an empty 48 GB board),
the slots no creatable placement of any configured type covers (holes too
small or misaligned for them) are ``reserved``, and with no free VF, or
nothing creatable, the whole free pool is.  Two requests racing between
two updates can still both pass Placement: the board refuses the second
at claim time and nova reschedules it.
"""

from __future__ import annotations

import dataclasses
import math
import string
import types
from collections.abc import Collection
from collections.abc import Iterable
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

from vgpu_driver import exception
from vgpu_driver import names

if TYPE_CHECKING:
    from vgpu_driver.host_snapshot import HostSnapshot
    from vgpu_driver.host_snapshot import PhysicalGPU
    from vgpu_driver.inventory import ProviderTree
    from vgpu_driver.nvml import Placements
    from vgpu_driver.sysfs.base import SysfsHost

RESOURCE_CLASS = "CUSTOM_VGPU_FRAMEBUFFER_MIB"
SLOT_MIB = 1024


@dataclasses.dataclass(frozen=True)
class FramebufferInventory:
    """One board's inventory of :data:`RESOURCE_CLASS`, in MiB."""

    total: int
    reserved: int
    min_unit: int
    max_unit: int
    step_size: int

    def as_placement(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "reserved": self.reserved,
            "min_unit": self.min_unit,
            "max_unit": self.max_unit,
            "step_size": self.step_size,
            "allocation_ratio": 1.0,
        }

    @property
    def capacity(self) -> int:
        """What Placement may still grant on top of what is in use."""
        return self.total - self.reserved


def covered(placements: Mapping[str, Placements]) -> set[int]:
    """The slots the creatable placements of ``placements`` (a mapping of
    type to :class:`vgpu_driver.nvml.Placements`) cover."""
    return {
        slot
        for found in placements.values()
        for start in found.creatable
        for slot in range(start, start + found.size)
    }


def inventory(
    board_slots: int, placements: Mapping[str, Placements], used_slots: int, free_vfs: int
) -> FramebufferInventory:
    """The inventory of a board of ``board_slots`` slots whose vGPUs take
    ``used_slots``; ``placements``: ``{type: Placements}`` of each configured
    type, read together; ``free_vfs``: VFs without a vGPU (one per vGPU)."""
    if not placements:
        raise ValueError("a mixed-size board needs at least one configured type")
    sizes = sorted({found.size for found in placements.values()})
    creatable = any(found.creatable for found in placements.values())
    usable = len(covered(placements)) if creatable and free_vfs > 0 else 0
    reserved = max(board_slots - used_slots - usable, 0)
    return FramebufferInventory(
        total=board_slots * SLOT_MIB,
        reserved=reserved * SLOT_MIB,
        min_unit=sizes[0] * SLOT_MIB,
        max_unit=board_slots * SLOT_MIB,
        step_size=math.gcd(*sizes) * SLOT_MIB,
    )


@dataclasses.dataclass(frozen=True)
class BoardReading:
    """What NVML says of one board configured for several sizes: its mode,
    and the placements of the types it is configured for or holds
    (``{type id: vgpu_driver.nvml.Placements}``); ``error`` when NVML
    could not be asked."""

    mixed: bool = False
    placements: types.MappingProxyType[str, Placements] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({})
    )
    error: str | None = None
    # A pool board (equal-size mode): ``{type id: most vGPUs of it}``, its
    # types' ``placements`` then giving only their size.
    maxima: types.MappingProxyType[str, int] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({})
    )


def read_board(host: SysfsHost, gpu: PhysicalGPU, type_ids: Iterable[str]) -> BoardReading:
    """The :class:`BoardReading` of ``gpu`` for ``type_ids`` and the types
    its VFs hold, in one pass (NVML's mode first: no placements without it)."""
    held = {p.current_vgpu_type for p in gpu.parents if p.current_vgpu_type}
    wanted = sorted({*type_ids, *held}, key=names.vendor_type_number)
    try:
        if not host.mixed_sizes(gpu.address):
            return BoardReading(mixed=False)
        found = host.vgpu_placements(gpu.address, [names.vendor_type_number(t) for t in wanted])
    except (exception.NvmlUnavailable, exception.MixedSizeModeRefused) as exc:
        return BoardReading(error=str(exc))
    return BoardReading(
        mixed=True,
        placements=types.MappingProxyType(
            {names.vendor_type_id(number): placed for number, placed in found.items()}
        ),
    )


def read_boards(
    host: SysfsHost,
    snapshot: HostSnapshot,
    served: Mapping[str, Collection[str]],
) -> types.MappingProxyType[str, BoardReading]:
    """``{board address: BoardReading}`` of the vendor-VFIO boards ``served``
    (``{gpu address: (type id, ...)}``, see
    :func:`vgpu_driver.inventory.configured_types`) gives several types."""
    readings: dict[str, BoardReading] = {}
    for gpu in snapshot.gpus:
        type_ids = served.get(gpu.address, ())
        if len(type_ids) > 1 and gpu.parents:
            readings[gpu.address] = read_board(host, gpu, type_ids)
    return types.MappingProxyType(readings)


def board_slots(placements: Mapping[str, Placements]) -> int:
    """A board's slots as far as the placements of ``placements`` (``{type:
    Placements}``) reach: its framebuffer as the configured types see it."""
    reach: int = max(
        start + found.size for found in placements.values() for start in found.supported
    )
    return reach


# What a slot of a BoardMap holds, besides a vGPU's mark.
FREE = "."  # free, and a configured size can be created over it now
FRAGMENTED_SLOT = "-"  # free, but no configured size fits over it now
UNKNOWN = "?"  # a vGPU NVML does not place, or fragmented: not told apart
MARKS = string.ascii_lowercase + string.ascii_uppercase


@dataclasses.dataclass(frozen=True)
class LocatedVgpu:
    mark: str
    type_id: str
    placement: int
    size: int  # slots


@dataclasses.dataclass(frozen=True)
class BoardMap:
    """Where the vGPUs of a mixed-size board sit: one character per slot
    (a vGPU's mark, or :data:`FREE`, :data:`FRAGMENTED_SLOT`,
    :data:`UNKNOWN`), the vGPUs by placement, and how many vGPUs NVML did
    not place; ``error`` when NVML could not be asked."""

    slots: str = ""
    vgpus: tuple[LocatedVgpu, ...] = ()
    unlocated: int = 0
    error: str | None = None

    def legend(self) -> str:
        return " ".join(f"{v.mark}={v.type_id}@{v.placement}" for v in self.vgpus)


def board_map(
    reading: BoardReading,
    type_ids: Iterable[str],
    located: Iterable[tuple[int, int]],
    typed_vfs: int,
) -> BoardMap:
    """The :class:`BoardMap` of a board whose NVML ``reading`` covers
    ``type_ids`` (its configured types), from ``located`` (``((type number,
    placement ID), ...)``, :meth:`SysfsHost.vgpu_locations`) and the number
    of its typed VFs."""
    configured = {t: reading.placements[t] for t in type_ids}
    slots: list[str | None] = [None] * board_slots(configured)
    vgpus: list[LocatedVgpu] = []
    for number, placement in located:
        found = reading.placements.get(names.vendor_type_id(number))
        if found is None or len(vgpus) == len(MARKS) or placement + found.size > len(slots):
            continue
        vgpu = LocatedVgpu(MARKS[len(vgpus)], names.vendor_type_id(number), placement, found.size)
        vgpus.append(vgpu)
        slots[placement : placement + found.size] = [vgpu.mark] * found.size
    unlocated = max(typed_vfs - len(vgpus), 0)
    usable = covered(configured)
    rest = UNKNOWN if unlocated else FRAGMENTED_SLOT
    drawn = "".join(mark or (FREE if slot in usable else rest) for slot, mark in enumerate(slots))
    return BoardMap(slots=drawn, vgpus=tuple(vgpus), unlocated=unlocated)


def map_board(
    host: SysfsHost, gpu: PhysicalGPU, type_ids: Iterable[str], reading: BoardReading
) -> BoardMap:
    """:func:`board_map` of ``gpu``, asking NVML where its vGPUs are."""
    try:
        located = host.vgpu_locations(gpu.address)
    except (exception.NvmlUnavailable, exception.MixedSizeModeRefused) as exc:
        return BoardMap(error=str(exc))
    typed = sum(1 for p in gpu.parents if p.current_vgpu_type)
    return board_map(reading, type_ids, located, typed)


def map_boards(
    host: SysfsHost, snapshot: HostSnapshot, tree: ProviderTree, boards: Mapping[str, BoardReading]
) -> types.MappingProxyType[str, BoardMap]:
    """``{board address: BoardMap}`` of the boards in mixed-size mode that
    have a mixed-size provider in ``tree`` (:class:`vgpu_driver.inventory.ProviderTree`),
    ``boards`` being what :func:`read_boards` said of them."""
    maps: dict[str, BoardMap] = {}
    for gpu in snapshot.gpus:
        provider = tree.by_gpu(gpu.address)
        reading = boards.get(gpu.address)
        if provider is not None and provider.mixed and reading is not None and reading.mixed:
            type_ids = tuple(type_id for type_id, _mib in provider.sizes)
            maps[gpu.address] = map_board(host, gpu, type_ids, reading)
    return types.MappingProxyType(maps)
