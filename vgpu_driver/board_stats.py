"""What a host tells the scheduler of its boards, to choose among hosts.

The board filter (:mod:`vgpu_driver.nova.scheduler`) orders the boards of
one host from Placement; which host a request goes to is the weighers'.
Reading Placement for every host a request may go to would cost as much as
nova's own allocation-candidates request, so each host publishes instead,
with its resources (a compute-node stat, :data:`STAT`), each of its boards
with size classes as :class:`~vgpu_driver.board_choice.BoardCounts`: the
vGPUs of each size it can still take and those it holds.  The scheduler
reads them with the host's state, at no cost; they are as old as the host's
last periodic update (``[DEFAULT] update_resources_interval``), which is
good enough to prefer a host, never to grant.

:func:`host_weight` is the filter's rule across hosts: the host whose best
board for the request keeps the most large rooms whole, then the least free
room, weighs most.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from collections.abc import Mapping
from typing import TYPE_CHECKING

from vgpu_driver import board_choice
from vgpu_driver import size_classes

if TYPE_CHECKING:
    from vgpu_driver.inventory.providers import ProviderTree

# The compute-node stat the boards are published in.
STAT = "vgpu_boards"
# A flavor's vGPUs of one size: resources[<group>]:CUSTOM_VGPU_SIZE_<MiB>_MIB.
_SIZE_SPEC = re.compile(r"^resources[^:]*:(CUSTOM_VGPU_SIZE_\d+_MIB)$")
# How far the first key of a board's rank outweighs the second (MiB), and
# the weight of a rank of nothing free (no board ranks that high).
_FIRST = 1e9
_TOP = 1e12


def encode(tree: ProviderTree) -> str | None:
    """The stat of ``tree``'s boards with size classes (mixed-size boards
    and type pools): ``{provider name: {"free": {class: n}, "used": {class:
    n}}}``; None when it has none."""
    boards = {}
    for provider in tree.providers:
        if not provider.size_inventories:
            continue
        boards[provider.name] = {
            "free": {rc: found.available for rc, found in provider.size_inventories},
            "used": {
                rc: max(found.capacity - found.available, 0)
                for rc, found in provider.size_inventories
            },
        }
    return json.dumps(boards, sort_keys=True, separators=(",", ":")) if boards else None


def decode(text: str | None) -> dict[str, board_choice.BoardCounts]:
    """The boards of a stat, ``{}`` for none or for one that does not parse
    (a host of another version: the weigher then treats it as it treats a
    host with no such board)."""
    try:
        found = json.loads(text) if text else {}
        return {
            name: board_choice.BoardCounts(
                free={rc: int(n) for rc, n in counts["free"].items()},
                used={rc: int(n) for rc, n in counts["used"].items()},
            )
            for name, counts in found.items()
        }
    except (ValueError, TypeError, KeyError, AttributeError):
        return {}


def requested_sizes(extra_specs: Mapping[str, str]) -> dict[str, int]:
    """``{size class: vGPUs}`` a flavor's extra specs ask
    (:func:`vgpu_driver.size_classes.flavor_spec`)."""
    wanted: dict[str, int] = {}
    for key, value in extra_specs.items():
        match = _SIZE_SPEC.match(key)
        if match and str(value).isdigit():
            wanted[match[1]] = wanted.get(match[1], 0) + int(value)
    return wanted


def host_weight(
    boards: Iterable[board_choice.BoardCounts], wanted: Mapping[str, int]
) -> float | None:
    """How well a request (``wanted``, :func:`requested_sizes`) fits a host
    whose boards are ``boards``: higher is better (0 to 1e12), from the
    :func:`~vgpu_driver.board_choice.rank` of its best board that can take
    it (each size's share among the vGPUs the host holds); None when no
    board can."""
    boards = list(boards)
    fitting = [
        board
        for board in boards
        if all(
            size_classes.is_size_class(rc) and board.free.get(rc, 0) >= count
            for rc, count in wanted.items()
        )
    ]
    if not wanted or not fitting:
        return None
    shares = board_choice.demand(boards)
    first, second = min(board_choice.rank(board, shares) for board in fitting)
    return max(_TOP - (first * _FIRST + second), 0.0)
