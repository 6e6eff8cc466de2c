"""The providers a host's GPUs should have, from one read of the host.

nova-compute's inventory update, ``vgpu-manage`` (``inventory``,
``placement sync``, ``audit``) and the tests that judge them compute it one
way: what NVML says of the boards, the claims no Placement allocation
counts, then :func:`vgpu_driver.inventory.compute`.  Keeping that sequence
in one place keeps the operator's views equal to what nova-compute reports.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Collection
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

from vgpu_driver import inventory

if TYPE_CHECKING:
    from vgpu_driver.claims import Claim
    from vgpu_driver.conf.mdev_settings import MdevConfig
    from vgpu_driver.host_snapshot import HostSnapshot
    from vgpu_driver.sysfs.base import SysfsHost


def desired(
    host: SysfsHost,
    snapshot: HostSnapshot,
    config: MdevConfig,
    nodename: str,
    in_use: Collection[str] | None,
    claim_list: Sequence[Claim] = (),
    allocations_on: Callable[[str], Any] | None = None,
) -> inventory.ProviderTree:
    """The desired :class:`~vgpu_driver.inventory.ProviderTree` of ``host``
    as ``snapshot`` found it.

    ``in_use``: vGPU ids guests or claims reference (None: unknown).  With
    ``allocations_on(provider name)`` (``{consumer: {class: units}}``, None
    when Placement cannot say), the claims of ``claim_list`` no allocation
    covers are reserved, as nova-compute reserves them; without it, none is.
    """
    boards = inventory.read_boards(host, snapshot, config)
    unallocated = (
        inventory.claims_placement_lacks(
            claim_list, nodename, allocations_on, inventory.claim_units(boards)
        )
        if allocations_on is not None
        else None
    )
    return inventory.compute(
        snapshot,
        config,
        nodename,
        in_use,
        unallocated,
        boards,
        inventory.read_rooms(host, snapshot, config),
    )
