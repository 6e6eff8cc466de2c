"""The Placement inventory of a board that mixes vGPU sizes.

On a board in mixed-size mode every vGPU takes a run of framebuffer
*slots* of about 1 GB at a *placement ID* NVIDIA's driver allows for its
size, so the board's framebuffer is one shared, fragmentable pool.
Per-type VGPU inventories would each ignore the others and oversubscribe
it; instead the board is one inventory of :data:`RESOURCE_CLASS`, counted
in MiB of slots (a vGPU of N slots takes ``N * 1024``), and a flavor asks
for its type's amount beside a trait naming the type.

The inventory is exact for requests arriving one at a time, because
NVIDIA's placement tables nest: every placement of a size contains a
placement of each smaller size (true of every table the fake vendor
driver carries, :mod:`vgpu_driver.fake.placements`; checked by the
tests).  So the configured sizes that are still creatable are exactly
those up to the largest creatable one, which becomes ``max_unit``; the
slots no creatable placement of any configured type covers (holes too
small or misaligned for them) are ``reserved``; and with no free VF, or
nothing creatable, the whole free pool is.  Two requests racing between
two updates can still both pass Placement: the board refuses the second
at claim time and nova reschedules it.
"""

import dataclasses
import math
import types

from vgpu_driver import exception
from vgpu_driver import names

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

    def as_placement(self):
        return {"total": self.total, "reserved": self.reserved, "min_unit": self.min_unit,
                "max_unit": self.max_unit, "step_size": self.step_size,
                "allocation_ratio": 1.0}

    @property
    def capacity(self):
        """What Placement may still grant on top of what is in use."""
        return self.total - self.reserved


def covered(placements):
    """The slots the creatable placements of ``placements`` (a mapping of
    type to :class:`vgpu_driver.nvml.Placements`) cover."""
    return {slot for found in placements.values() for start in found.creatable
            for slot in range(start, start + found.size)}


def inventory(board_slots, placements, used_slots, free_vfs):
    """The inventory of a board of ``board_slots`` slots whose vGPUs take
    ``used_slots``; ``placements``: ``{type: Placements}`` of each configured
    type, read together; ``free_vfs``: VFs without a vGPU (one per vGPU)."""
    if not placements:
        raise ValueError("a mixed-size board needs at least one configured type")
    sizes = sorted({found.size for found in placements.values()})
    creatable = [found.size for found in placements.values() if found.creatable]
    usable = len(covered(placements)) if creatable and free_vfs > 0 else 0
    largest = max(creatable) if usable else sizes[0]
    reserved = max(board_slots - used_slots - usable, 0)
    return FramebufferInventory(
        total=board_slots * SLOT_MIB, reserved=reserved * SLOT_MIB,
        min_unit=sizes[0] * SLOT_MIB, max_unit=largest * SLOT_MIB,
        step_size=math.gcd(*sizes) * SLOT_MIB)


@dataclasses.dataclass(frozen=True)
class BoardReading:
    """What NVML says of one board configured for several sizes: its mode,
    and the placements of the types it is configured for or holds
    (``{type id: vgpu_driver.nvml.Placements}``); ``error`` when NVML
    could not be asked."""

    mixed: bool = False
    placements: types.MappingProxyType = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({}))
    error: str | None = None


def read_board(host, gpu, type_ids):
    """The :class:`BoardReading` of ``gpu`` for ``type_ids`` and the types
    its VFs hold, in one pass (NVML's mode first: no placements without it)."""
    held = {p.current_vgpu_type for p in gpu.parents if p.current_vgpu_type}
    wanted = sorted({*type_ids, *held}, key=names.vendor_type_number)
    try:
        if not host.mixed_sizes(gpu.address):
            return BoardReading(mixed=False)
        found = host.vgpu_placements(gpu.address, [names.vendor_type_number(t)
                                                   for t in wanted])
    except (exception.NvmlUnavailable, exception.MixedSizeModeRefused) as exc:
        return BoardReading(error=str(exc))
    return BoardReading(mixed=True, placements=types.MappingProxyType(
        {names.vendor_type_id(number): placed for number, placed in found.items()}))


def read_boards(host, snapshot, served):
    """``{board address: BoardReading}`` of the vendor-VFIO boards ``served``
    (``{gpu address: (type id, ...)}``, see
    :func:`vgpu_driver.inventory.configured_types`) gives several types."""
    readings = {}
    for gpu in snapshot.gpus:
        type_ids = served.get(gpu.address, ())
        if len(type_ids) > 1 and gpu.parents:
            readings[gpu.address] = read_board(host, gpu, type_ids)
    return types.MappingProxyType(readings)
