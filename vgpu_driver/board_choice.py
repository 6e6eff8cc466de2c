"""Which board a vGPU request should take: the one it fragments least.

Placement answers a request with every board that can hold it, in no
useful order, and nova's scheduler claims its host's first candidate.  On
mixed-size boards the choice matters: a 4 GB vGPU put in the empty half of
a 48 GB L40S leaves no room for a 24 GB one, where the half of another
board already broken would have taken it at no loss.

The rule, from what Placement holds of each board (its classes' capacity
and use, nothing the host alone knows):

1. **Keep large rooms whole**: the board with the fewest free vGPUs of the
   largest size it offers comes first (a broken half before an empty one).
2. **Then the tightest board**: the least free framebuffer *useful to the
   sizes asked*, each size's free vGPUs times its MiB, weighted by the
   share of that size among the vGPUs in use on the boards compared (the
   demand seen, plus one of each so that an unused size still counts).
3. Ties keep Placement's order.

Equal-size boards (one class, VGPU or a custom one) reduce to their free
vGPUs: the fullest first, so empty boards stay empty for whatever comes.

``benchmarks/bench_mixed_size.py`` serves seeded traces of 4 to 24 GB
requests on 8 L40S boards through a real Placement with this choice
(``--choose fit``) and with first fit by address; ``benchmarks/README.rst``
has the numbers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any
from typing import TypeVar

from vgpu_driver import framebuffer
from vgpu_driver import size_classes

K = TypeVar("K", bound=Hashable)

# Classes that are a board's vGPUs but carry no size: equal-size boards.
_EQUAL_SIZE_CLASSES = ("VGPU",)


def is_vgpu_class(resource_class: str) -> bool:
    """Whether ``resource_class`` counts a board's vGPUs (or their MiB)."""
    return (
        resource_class in _EQUAL_SIZE_CLASSES
        or resource_class == framebuffer.RESOURCE_CLASS
        or size_classes.is_size_class(resource_class)
        or resource_class.startswith("CUSTOM_")
    )


@dataclasses.dataclass(frozen=True)
class BoardCounts:
    """What Placement says of one board: ``{class: units}`` still free
    (capacity less use) and in use, for the classes that count vGPUs."""

    free: Mapping[str, int]
    used: Mapping[str, int]

    @property
    def sizes(self) -> dict[int, int]:
        """``{MiB: free vGPUs}`` of the size classes (mixed-size boards)."""
        return {
            size_classes.mib_of(rc): count
            for rc, count in self.free.items()
            if size_classes.is_size_class(rc)
        }

    def used_sizes(self) -> dict[int, int]:
        return {
            size_classes.mib_of(rc): count
            for rc, count in self.used.items()
            if size_classes.is_size_class(rc)
        }


def counts_of(
    inventories: Mapping[str, Mapping[str, Any]], usages: Mapping[str, int]
) -> BoardCounts:
    """A board's :class:`BoardCounts` from Placement's inventories
    (``{class: {total, reserved, allocation_ratio, ...}}``) and usages."""
    free, used = {}, {}
    for rc, record in inventories.items():
        if rc == framebuffer.RESOURCE_CLASS or not is_vgpu_class(rc):
            continue
        capacity = int(
            (record["total"] - record.get("reserved", 0)) * record.get("allocation_ratio", 1)
        )
        used[rc] = int(usages.get(rc, 0))
        free[rc] = max(capacity - used[rc], 0)
    return BoardCounts(free=free, used=used)


def counts_of_summary(summary: Mapping[str, Any]) -> BoardCounts:
    """A board's :class:`BoardCounts` from an allocation-candidates provider
    summary (``{"resources": {class: {"capacity", "used"}}}``)."""
    free, used = {}, {}
    for rc, record in summary.get("resources", {}).items():
        if rc == framebuffer.RESOURCE_CLASS or not is_vgpu_class(rc):
            continue
        used[rc] = int(record["used"])
        free[rc] = max(int(record["capacity"]) - used[rc], 0)
    return BoardCounts(free=free, used=used)


def demand(boards: Iterable[BoardCounts]) -> dict[int, float]:
    """``{MiB: share}`` of each size among the vGPUs in use on ``boards``,
    counting one more of every size offered (so none weighs nothing)."""
    seen: dict[int, int] = {}
    for board in boards:
        for size in board.sizes:
            seen.setdefault(size, 1)
        for size, count in board.used_sizes().items():
            seen[size] = seen.get(size, 1) + count
    total = sum(seen.values())
    return {size: count / total for size, count in seen.items()} if total else {}


def rank(board: BoardCounts, shares: Mapping[int, float]) -> tuple[float, float]:
    """The sort key of a board (lower first): its free vGPUs of its largest
    size, then its free MiB useful to the sizes asked, weighted by
    ``shares``.  A board with no size class: its free vGPUs, twice."""
    sizes = board.sizes
    if not sizes:
        free = float(sum(board.free.values()))
        return free, free
    largest = max(size for size in sizes)
    useful = sum(shares.get(size, 0.0) * size * count for size, count in sizes.items())
    return float(sizes[largest]), useful


def order(counts: Mapping[K, BoardCounts], boards: Sequence[K]) -> list[K]:
    """``boards`` (keys of ``counts``), best first; ties keep their order."""
    shares = demand(counts.values())
    return sorted(boards, key=lambda board: rank(counts[board], shares))
