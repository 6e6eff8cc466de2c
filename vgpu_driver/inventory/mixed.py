"""The provider of a board serving several vendor-VFIO types in mixed-size mode.

One inventory of framebuffer MiB (:mod:`vgpu_driver.framebuffer`) and one
per placement size (:mod:`vgpu_driver.size_classes`), from what NVML says
of the board's placements.
"""

from __future__ import annotations

import collections
from collections.abc import Collection
from collections.abc import Mapping
from typing import TYPE_CHECKING

from vgpu_driver import framebuffer
from vgpu_driver import size_classes
from vgpu_driver.inventory import providers

if TYPE_CHECKING:
    from vgpu_driver.framebuffer import BoardReading
    from vgpu_driver.framebuffer import FramebufferInventory
    from vgpu_driver.host_snapshot import HostSnapshot
    from vgpu_driver.host_snapshot import PhysicalGPU


def mixed_size_provider(
    snapshot: HostSnapshot,
    gpu: PhysicalGPU,
    types: tuple[str, ...],
    reading: BoardReading | None,
    nodename: str,
    in_use: Collection[str] | None = None,
    unallocated: int | Mapping[str, int] | None = None,
) -> tuple[providers.GpuProvider | None, str | None]:
    """``(GpuProvider, None)`` of a board serving several vendor-VFIO types
    in mixed-size mode, or ``(None, why it cannot)``.

    One inventory of framebuffer MiB (:mod:`vgpu_driver.framebuffer`):
    vGPUs that guests or claims hold count as used; a typed VF nobody holds
    keeps its slots from every other type, so they are reserved with what
    fragmentation leaves unusable; and one inventory per placement size
    (:mod:`vgpu_driver.size_classes`).  Claims Placement does not count
    (``unallocated``: ``{class: units}``, or MiB alone) are reserved too.
    """
    why_not = _why_not_mixed(gpu, types, reading)
    if why_not or reading is None:
        return None, why_not
    listed = ", ".join(types)
    configured = {t: reading.placements[t] for t in types}
    typed = {p.name: p.current_vgpu_type for p in gpu.parents if p.current_vgpu_type}
    board_slots = framebuffer.board_slots(configured)
    held_slots = sum(
        reading.placements[t].size for vf, t in typed.items() if in_use is None or vf in in_use
    )
    free_vfs = sum(
        1
        for p in gpu.parents
        if not p.current_vgpu_type and (in_use is None or p.name not in in_use)
    )
    fb = framebuffer.inventory(board_slots, configured, held_slots, free_vfs)
    if not isinstance(unallocated, Mapping):
        unallocated = {framebuffer.RESOURCE_CLASS: unallocated or 0}
    claims_mib = min(unallocated.get(framebuffer.RESOURCE_CLASS, 0), fb.capacity)
    held: collections.Counter[int] = collections.Counter(
        reading.placements[t].size for vf, t in typed.items() if in_use is None or vf in in_use
    )
    uncounted = {size: unallocated.get(size_classes.class_name(size), 0) for size in held}
    by_size = size_classes.inventories(configured, held, uncounted, free_vfs)
    room = fb.capacity - claims_mib - held_slots * framebuffer.SLOT_MIB
    reserved_for = providers.shared_board_reserved(fb.reserved, claims_mib)
    return providers.GpuProvider(
        name=providers.provider_name(nodename, gpu),
        parent_provider=nodename,
        gpu=gpu.address,
        type_id=",".join(types),
        type_name=None,
        resource_class=framebuffer.RESOURCE_CLASS,
        total=fb.total,
        reserved=fb.reserved + claims_mib,
        min_unit=fb.min_unit,
        max_unit=fb.max_unit,
        step_size=fb.step_size,
        traits=providers.shared_board_traits(snapshot, gpu, types),
        reason=_mixed_size_reason(listed, fb, room, size_classes.fitting(configured, free_vfs)),
        reserved_for=reserved_for,
        sizes=tuple((t, configured[t].size * framebuffer.SLOT_MIB) for t in types),
        size_inventories=tuple(sorted(by_size.items())),
    ), None


def _mixed_size_reason(
    listed: str, fb: FramebufferInventory, room: int, fitting: Mapping[int, int]
) -> str:
    """What a mixed-size board can still take, for the operator's views
    (``fitting``: ``{size: vGPUs of it that fit now}``)."""
    fragmented = f"; {fb.reserved} MiB fragmented" if fb.reserved else ""
    fits = ", ".join(
        f"{count} x {size * framebuffer.SLOT_MIB} MiB"
        for size, count in sorted(fitting.items())
        if count
    )
    if room <= 0 or not fits:
        return (
            f"none of {listed} fits now (the board is full, or its free framebuffer "
            f"is fragmented){fragmented}"
        )
    return f"mixed sizes: fit now {fits}{fragmented}"


def _why_not_mixed(
    gpu: PhysicalGPU, types: tuple[str, ...], reading: BoardReading | None
) -> str | None:
    """Why a board configured for ``types`` gets no framebuffer inventory
    from what NVML said (``reading``), or None."""
    listed = ", ".join(types)
    if reading is None or reading.error:
        why = reading.error if reading else "NVML was not asked"
        return f"configured for mixed sizes ({listed}), but NVML cannot say: {why}"
    if not reading.mixed:
        return (
            f"configured for mixed sizes ({listed}) but in equal-size mode: run "
            f"vgpu-manage sriov sizes {gpu.address} mixed"
        )
    unplaceable = [
        t for t in types if not reading.placements.get(t) or not reading.placements[t].supported
    ]
    if unplaceable:
        return (
            f"cannot place {', '.join(unplaceable)} in mixed-size mode: not a vGPU "
            "type of this board (see vgpu-manage types)"
        )
    unknown = sorted(
        {
            p.current_vgpu_type
            for p in gpu.parents
            if p.current_vgpu_type and p.current_vgpu_type not in reading.placements
        }
    )
    if unknown:
        return (
            f"its VFs hold {', '.join(unknown)}, whose size NVML was not asked; it "
            "gets a provider once they are gone"
        )
    return None
