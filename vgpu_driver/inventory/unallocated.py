"""Claimed vGPUs that no Placement allocation of their instance covers.

The allocator refuses every claimed vGPU to other instances, so the
inventory reserves the claims Placement does not count, and Placement
never offers what the allocator would refuse.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

from vgpu_driver import framebuffer
from vgpu_driver import size_classes
from vgpu_driver.inventory import providers

if TYPE_CHECKING:
    from vgpu_driver.claims import Claim
    from vgpu_driver.framebuffer import BoardReading

# What one claimed vGPU counts for: a number of the GPU's one class, or
# ``{class: units}`` on a mixed-size board.
Units = int | dict[str, int]
# ``{consumer: {resource class: units}}`` allocated on one GPU's provider.
Allocated = Mapping[str, Mapping[str, int]]


def unallocated_claims(
    claim_list: Iterable[Claim],
    allocated: Mapping[str, Allocated],
    units_of: Callable[[Claim], Units] | None = None,
) -> dict[str, Any]:
    """``{gpu address: claimed vGPUs that Placement does not count}``.

    Placement already counts the units an instance has allocated on a GPU's
    provider, so only an instance's claims beyond those units are added (a
    claim left by a failed migration, a consumer whose allocation is gone
    or on another GPU).  The allocator refuses every claimed vGPU to other
    instances, whatever the claim's state.  ``allocated`` maps a GPU
    address to ``{consumer: {resource class: units}}`` on its provider (a
    GPU provider has one class); a GPU it lacks has unknown allocations and
    all its claims count: one update reserving too much is better than
    Placement offering what the allocator refuses.  ``units_of(claim)`` is
    what one claimed vGPU counts for (default 1 of the GPU's one class):
    a number, or ``{class: units}`` (a mixed-size board's, :func:`claim_units`),
    whose GPU then gets ``{class: units}`` too, each class counted apart.
    """
    held: collections.defaultdict[tuple[str, str], collections.Counter[str | None]] = (
        collections.defaultdict(collections.Counter)
    )
    for claim in claim_list:
        units = units_of(claim) if units_of else 1
        held[claim.gpu, claim.instance_uuid].update(
            units if isinstance(units, dict) else {None: units}
        )
    extra: dict[str, Any] = {}
    for (gpu, instance), counts in held.items():
        mine = allocated.get(gpu, {}).get(instance, {})
        for rc, count in counts.items():
            # None: the GPU's one class, whatever it is named.
            units = sum(mine.values()) if rc is None else mine.get(rc, 0)
            missing = max(count - units, 0)
            if rc is None:
                extra[gpu] = extra.get(gpu, 0) + missing
            elif missing:
                extra.setdefault(gpu, collections.Counter())[rc] += missing
    return {gpu: count for gpu, count in extra.items() if count}


def claims_placement_lacks(
    claim_list: Sequence[Claim],
    nodename: str,
    allocations_on: Callable[[str], Allocated | None],
    units_of: Callable[[Claim], Units] | None = None,
) -> dict[str, Any]:
    """:func:`unallocated_claims`, asking ``allocations_on(provider name)``
    (None when Placement cannot say) only about GPUs that hold claims."""
    allocated = {}
    for gpu in sorted({c.gpu for c in claim_list}):
        found = allocations_on(providers.provider_name_for(nodename, gpu))
        if found is not None:
            allocated[gpu] = found
    return unallocated_claims(claim_list, allocated, units_of)


def claim_units(boards: Mapping[str, BoardReading]) -> Callable[[Claim], Units]:
    """``units_of`` for :func:`unallocated_claims`: a claim on a mixed-size
    board of ``boards`` (:func:`vgpu_driver.framebuffer.read_boards`)
    counts its type's framebuffer MiB and one vGPU of its size class
    (``{class: units}``), any other claim one vGPU."""

    def units_of(claim: Claim) -> Units:
        reading = boards.get(claim.gpu)
        found = reading.placements.get(claim.type_id) if reading else None
        if not found:
            return 1
        size: int = found.size
        return {
            framebuffer.RESOURCE_CLASS: size * framebuffer.SLOT_MIB,
            size_classes.class_name(size): 1,
        }

    return units_of
