"""Per-size classes of a mixed-size board: one inventory per placement size.

The framebuffer class (:data:`vgpu_driver.framebuffer.RESOURCE_CLASS`)
alone cannot say how many vGPUs of one size fit: a free region of slots 36
to 47 of a 48 GB board holds 12 GB of framebuffer but only two 4 GB
placements (IDs 36 and 44), and on an empty board whose largest size is
24 GB, 2 x 24 GB fits although no single vGPU is 48 GB.  So beside it, each
placement size ``s`` (in slots) the configured types have gets a class of
its own, :func:`class_name` (``CUSTOM_VGPU_SIZE_4096_MIB``), counted in
vGPUs, and a flavor asking ``N`` vGPUs of a type asks ``N * s * 1024`` MiB,
``N`` units of its size's class and the type's trait
(:func:`flavor_spec`).

What Placement may still grant in the class of ``s`` is
``min(K_s, free VFs)``, where ``K_s`` is the largest number of pairwise
disjoint placements among the creatable IDs NVML lists for ``s`` now
(:func:`disjoint`).

*Exactness, for a request of N vGPUs of one type of size s* (one at a
time, after the inventory follows the last change).  The board accepts it
iff N free VFs take the type one after another, each at the lowest
creatable ID (the vGPU manager picks the ID; the fake takes the lowest,
:mod:`vgpu_driver.fake.placements`).  Placements of one size are intervals
of equal length, so picking the lowest start first is interval scheduling
by earliest end, which is optimal: N creations succeed iff
``N <= K_s`` and ``N <= free VFs``.  Placement grants iff every class
fits: the size class grants iff ``N <= min(K_s, free VFs)``, the same
condition; the framebuffer class never refuses more (its free, unreserved
MiB are the slots some creatable placement covers, which hold the N
disjoint placements, and its ``max_unit`` is the board); the type trait
is on every provider serving the type.  So Placement grants iff the board
accepts, for every N, nesting or not: nothing here assumes one size's
placements contain another's.

*Requests mixing sizes* (two types in one flavor) are checked per class
only, each against the board as it is: Placement may grant what the board
then refuses (the claim fails, nova reschedules), never refuses what fits
in any single class.  The documentation asks flavors for one type.

*Lists that break an assumption* are served conservatively and said:
creatable IDs outside the supported list are dropped, and types of one
size whose lists differ count only the IDs they all list
(:func:`size_lists`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

from oslo_log import log as logging

from vgpu_driver.framebuffer import SLOT_MIB

if TYPE_CHECKING:
    from vgpu_driver.nvml import Placements

LOG = logging.getLogger(__name__)

PREFIX = "CUSTOM_VGPU_SIZE_"
# Disagreements already logged: every periodic update meets them again.
_TOLD: set[str] = set()


def class_name(size: int) -> str:
    """The class of vGPUs of ``size`` slots: ``CUSTOM_VGPU_SIZE_<MiB>_MIB``."""
    return f"{PREFIX}{size * SLOT_MIB}_MIB"


def is_size_class(resource_class: str) -> bool:
    return resource_class.startswith(PREFIX) and resource_class.endswith("_MIB")


def mib_of(resource_class: str) -> int:
    """The MiB a size class names (``CUSTOM_VGPU_SIZE_4096_MIB`` -> 4096)."""
    return int(resource_class[len(PREFIX) : -len("_MIB")])


def disjoint(starts: Iterable[int], size: int) -> int:
    """The largest number of pairwise disjoint placements of ``size`` slots
    at ``starts``: equal intervals, taken greedily by lowest start."""
    count, free_from = 0, None
    for start in sorted(set(starts)):
        if free_from is None or start >= free_from:
            count, free_from = count + 1, start + size
    return count


@dataclasses.dataclass(frozen=True)
class SizeList:
    """What one placement size's types say together: the supported IDs,
    the creatable ones, and what was wrong with the lists (empty if none)."""

    size: int
    supported: tuple[int, ...]
    creatable: tuple[int, ...]
    problems: tuple[str, ...] = ()


def size_lists(placements: Mapping[str, Placements]) -> dict[int, SizeList]:
    """``{size: SizeList}`` of ``placements`` (``{type: Placements}``)."""
    by_size: dict[int, list[tuple[str, Placements]]] = {}
    for type_id, placed in sorted(placements.items()):
        by_size.setdefault(placed.size, []).append((type_id, placed))
    lists = {}
    for size, found in sorted(by_size.items()):
        problems = []
        supported = set.intersection(*(set(f.supported) for _t, f in found))
        creatable = set.intersection(*(set(f.creatable) for _t, f in found))
        if (
            len({tuple(sorted(f.supported)) for _t, f in found}) > 1
            or len({tuple(sorted(f.creatable)) for _t, f in found}) > 1
        ):
            problems.append(
                f"types {', '.join(str(t) for t, _f in found)} of {size} slot(s) "
                "list different placements; only those all list count"
            )
        stray = sorted(set().union(*(f.creatable for _t, f in found)) - supported)
        if stray:
            problems.append(
                f"creatable IDs {stray} of {size} slot(s) are not supported ones; they do not count"
            )
        lists[size] = SizeList(
            size, tuple(sorted(supported)), tuple(sorted(creatable & supported)), tuple(problems)
        )
    return lists


@dataclasses.dataclass(frozen=True)
class SizeInventory:
    """One size class's inventory, in vGPUs; ``available``: what Placement
    may still grant of it (:func:`available`), for the operator's views
    (not part of the inventory, nor of equality)."""

    total: int
    reserved: int
    available: int = dataclasses.field(default=0, compare=False)

    def as_placement(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "reserved": self.reserved,
            "min_unit": 1,
            "max_unit": self.total,
            "step_size": 1,
            "allocation_ratio": 1.0,
        }

    @property
    def capacity(self) -> int:
        return self.total - self.reserved


def available(creatable: int, free_vfs: int) -> int:
    """How many vGPUs of a size may still be granted: one VF each."""
    return min(creatable, free_vfs)


def fitting(placements: Mapping[str, Placements], free_vfs: int) -> dict[int, int]:
    """``{size: vGPUs of it that may still be created}`` (:func:`available`)."""
    return {
        size: available(disjoint(listed.creatable, size), free_vfs)
        for size, listed in size_lists(placements).items()
    }


def inventories(
    placements: Mapping[str, Placements],
    held: Mapping[int, int],
    uncounted: Mapping[int, int],
    free_vfs: int,
) -> dict[str, SizeInventory]:
    """``{size class: SizeInventory}`` of a board.

    ``held``: ``{size: vGPUs of it guests or claims hold}``, which Placement
    counts in the class but for ``uncounted`` (``{size: held vGPUs no
    allocation counts in the class}``).  What Placement may grant is then
    exactly :func:`available`: ``total - reserved = counted + available``.
    ``total`` is, when it is that much, the most vGPUs of the size the
    board ever holds.
    """
    found = {}
    for size, listed in size_lists(placements).items():
        for problem in set(listed.problems) - _TOLD:
            _TOLD.add(problem)
            LOG.warning("A mixed-size board's placement lists disagree: %s", problem)
        counted = max(held.get(size, 0) - uncounted.get(size, 0), 0)
        grantable = available(disjoint(listed.creatable, size), free_vfs)
        capacity = counted + grantable
        total = max(disjoint(listed.supported, size), capacity, 1)
        found[class_name(size)] = SizeInventory(
            total=total, reserved=total - capacity, available=grantable
        )
    return found


# The request group a flavor's vGPU specs go in: a granular group is met by
# one provider, where an unnumbered one may take the MiB from one board and
# the size class from another.
GROUP = "_VGPU"


def flavor_spec(
    type_id_trait: str, size: int | None, units: int, count: int, resource_class: str
) -> dict[str, str]:
    """The extra specs of a flavor asking ``count`` vGPUs of one type, in
    one request group (:data:`GROUP`): ``units`` of ``resource_class``
    each (with ``size`` slots, a mixed-size board's: its MiB and its size
    class), and the type's trait."""
    specs = {f"resources{GROUP}:{resource_class}": str(units * count)}
    if size is not None:
        specs[f"resources{GROUP}:{class_name(size)}"] = str(count)
    specs[f"trait{GROUP}:{type_id_trait}"] = "required"
    return specs


def candidates_query(specs: Mapping[str, str]) -> dict[str, str]:
    """Placement's allocation-candidates parameters for :func:`flavor_spec`'s
    specs, as nova's scheduler asks them."""
    resources = ",".join(
        f"{key.split(':', 1)[1]}:{value}"
        for key, value in specs.items()
        if key.startswith(f"resources{GROUP}:")
    )
    required = ",".join(
        key.split(":", 1)[1]
        for key, value in specs.items()
        if key.startswith(f"trait{GROUP}:") and value == "required"
    )
    return {f"resources{GROUP}": resources, f"required{GROUP}": required}
