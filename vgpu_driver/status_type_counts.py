"""Per-type counts of one GPU in ``vgpu-manage status``, in vGPUs.

A GPU's provider counts in vGPUs of one type or, on a mixed-size board, in
framebuffer MiB; operators read each type's capacity, use and reservation
in vGPUs whatever the unit.  How a mixed-size board's size classes become
those counts is its own rule, apart from putting the view together.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import TYPE_CHECKING

from vgpu_driver import size_classes
from vgpu_driver.framebuffer import SLOT_MIB
from vgpu_driver.status import TypeCount

if TYPE_CHECKING:
    from vgpu_driver.inventory import GpuProvider


def type_counts(
    provider: GpuProvider | None, configured: Iterable[str], held: Iterable[str]
) -> tuple[TypeCount, ...]:
    """The :class:`~vgpu_driver.status.TypeCount` of each type of one GPU.

    ``held`` is the type of each vGPU guests or claims hold on it.  A vGPU
    counts under its own type, so a GPU draining from one type to another counts the old type's
    vGPUs as used of the old type (which it no longer offers).  On a
    mixed-size board a type's counts are its size class's
    (:func:`_mixed_size_room`), the rest reserved.
    """
    counted = collections.Counter(held)
    if provider is None:
        offered = list(configured)
    elif provider.mixed:
        offered = [type_id for type_id, _mib in provider.sizes]
    else:
        offered = [provider.type_id]
    found: dict[str, TypeCount] = {}
    for type_id in offered:
        mine = counted.get(type_id, 0)
        if provider is None:
            capacity = reserved = 0
        elif provider.mixed:
            capacity, free = _mixed_size_room(provider, type_id)
            reserved = max(capacity - mine - free, 0)
        else:
            capacity, reserved = provider.total, provider.reserved
        found[type_id] = TypeCount(type_id, capacity, mine, reserved)
    for type_id, mine in sorted(counted.items()):
        if type_id not in found:
            found[type_id] = TypeCount(type_id, 0, mine, 0)
    return tuple(found.values())


def _mixed_size_room(provider: GpuProvider, type_id: str) -> tuple[int, int]:
    """``(capacity, free)`` of a type on a mixed-size board, from the
    inventory of its size class (:mod:`vgpu_driver.size_classes`): the most
    vGPUs of its size the board holds, and what Placement grants of them
    now (disjoint creatable placements, at most one per free VF), so that
    the views say what the scheduler does, not what the free MiB would
    hold if they did not fragment."""
    mib = provider.units_of(type_id)
    found = dict(provider.size_inventories).get(size_classes.class_name(mib // SLOT_MIB))
    if found is None:
        return provider.total // mib, 0
    return found.total, found.available
