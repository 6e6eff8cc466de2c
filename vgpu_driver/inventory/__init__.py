"""Host snapshot + mdev config -> the desired provider tree (no I/O).

One child provider per physical GPU, named ``<nodename>_pci_dddd_bb_ss_f``
after its physical function (:mod:`~vgpu_driver.inventory.providers`).  Its
capacity for the GPU's configured type is what exists plus what can still
be created, capped by the type's per-GPU maximum, by the room an SR-IOV
board has left and by the host-wide ``max_instances``
(:mod:`~vgpu_driver.inventory.capacity`, :mod:`~vgpu_driver.inventory.vf_room`);
a board serving several vendor-VFIO types in mixed-size mode counts its
framebuffer and its placement sizes instead
(:mod:`~vgpu_driver.inventory.mixed`), as does a type pool, a board in
equal-size mode that takes the size of its first vGPU
(:mod:`~vgpu_driver.inventory.pool`).  A GPU that cannot serve its type
right now keeps its provider with everything reserved, and says why.
Claimed vGPUs that no Placement allocation of their instance covers are
reserved (:mod:`~vgpu_driver.inventory.unallocated`), so Placement never
offers what the allocator would refuse.

This package is the door callers use: what they need of its modules is
named here.
"""

from __future__ import annotations

from collections.abc import Collection
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING
from typing import Any

from vgpu_driver import framebuffer
from vgpu_driver import host_snapshot
from vgpu_driver import names
from vgpu_driver.inventory import capacity
from vgpu_driver.inventory import mixed
from vgpu_driver.inventory import pool
from vgpu_driver.inventory import vf_room
from vgpu_driver.inventory.assignment import configured_type
from vgpu_driver.inventory.assignment import configured_types
from vgpu_driver.inventory.assignment import vfs_pending_reason
from vgpu_driver.inventory.capacity import per_gpu_limit
from vgpu_driver.inventory.mixed import mixed_size_provider
from vgpu_driver.inventory.providers import BLOCKED
from vgpu_driver.inventory.providers import CLAIMS
from vgpu_driver.inventory.providers import DRAINING
from vgpu_driver.inventory.providers import FRAGMENTED
from vgpu_driver.inventory.providers import MAX_INSTANCES
from vgpu_driver.inventory.providers import NO_CAPACITY
from vgpu_driver.inventory.providers import RESERVED_FOR
from vgpu_driver.inventory.providers import TRAIT_MAX_LENGTH
from vgpu_driver.inventory.providers import TYPE_ID_TRAIT_PREFIX
from vgpu_driver.inventory.providers import UNREADABLE
from vgpu_driver.inventory.providers import GpuProvider
from vgpu_driver.inventory.providers import ProviderTree
from vgpu_driver.inventory.providers import gpu_manager_version
from vgpu_driver.inventory.providers import manager_trait
from vgpu_driver.inventory.providers import manager_version_of
from vgpu_driver.inventory.providers import provider_name
from vgpu_driver.inventory.providers import provider_name_for
from vgpu_driver.inventory.providers import provider_traits
from vgpu_driver.inventory.providers import type_traits
from vgpu_driver.inventory.unallocated import claim_units
from vgpu_driver.inventory.unallocated import claims_placement_lacks
from vgpu_driver.inventory.unallocated import unallocated_claims

if TYPE_CHECKING:
    from vgpu_driver.conf.mdev_settings import MdevConfig
    from vgpu_driver.framebuffer import BoardReading
    from vgpu_driver.host_snapshot import HostSnapshot
    from vgpu_driver.inventory.vf_room import BoardRoom
    from vgpu_driver.sysfs.base import SysfsHost
    from vgpu_driver.sysfs.base import SysfsReader

__all__ = [
    "BLOCKED",
    "CLAIMS",
    "DRAINING",
    "FRAGMENTED",
    "MAX_INSTANCES",
    "NO_CAPACITY",
    "RESERVED_FOR",
    "TRAIT_MAX_LENGTH",
    "TYPE_ID_TRAIT_PREFIX",
    "UNREADABLE",
    "GpuProvider",
    "ProviderTree",
    "check_nodename",
    "claim_units",
    "claims_placement_lacks",
    "compute",
    "configured_type",
    "configured_types",
    "manager_trait",
    "manager_version_of",
    "mixed_size_provider",
    "per_gpu_limit",
    "provider_name",
    "provider_name_for",
    "provider_traits",
    "read_boards",
    "read_rooms",
    "type_traits",
    "unallocated_claims",
    "vfs_pending_reason",
]


def read_boards(
    host: SysfsHost, snapshot: HostSnapshot, config: MdevConfig
) -> MappingProxyType[str, BoardReading]:
    """What NVML says of the host's boards ``config`` gives several types
    (:func:`vgpu_driver.framebuffer.read_boards`, or for type pools
    :func:`vgpu_driver.inventory.pool.read_board`), for :func:`compute`."""
    served = configured_types(snapshot, config)
    if not config.pools:
        return framebuffer.read_boards(host, snapshot, served)
    return MappingProxyType(
        {
            gpu.address: pool.read_board(host, gpu, served[gpu.address])
            for gpu in snapshot.gpus
            if len(served.get(gpu.address, ())) > 1 and gpu.parents
        }
    )


def read_rooms(
    host: SysfsReader, snapshot: HostSnapshot, config: MdevConfig
) -> MappingProxyType[str, BoardRoom]:
    """What NVML says of the host's vendor-VFIO boards ``config`` gives one
    type (:func:`vgpu_driver.inventory.vf_room.read_boards`), for :func:`compute`."""
    return vf_room.read_boards(host, snapshot, configured_types(snapshot, config))


def check_nodename(nodename: str, snapshot: HostSnapshot) -> None:
    """InvalidNodename unless every GPU's provider name built on
    ``nodename`` is one Placement takes."""
    names.check_nodename(nodename, [provider_name("", gpu) for gpu in snapshot.gpus])


def compute(
    snapshot: HostSnapshot,
    config: MdevConfig,
    nodename: str,
    in_use: Collection[str] | None = None,
    unallocated: Mapping[str, Any] | None = None,
    boards: Mapping[str, BoardReading] | None = None,
    rooms: Mapping[str, BoardRoom] | None = None,
) -> ProviderTree:
    """The desired :class:`ProviderTree` of a host.

    ``in_use`` (mdev UUIDs guests or claims reference), when known, tells a
    GPU draining for a type change from one blocked by unused mdevs;
    ``unallocated`` (:func:`unallocated_claims`), when known, is reserved;
    ``boards`` (:func:`vgpu_driver.framebuffer.read_boards`) is what NVML
    says of the mixed-size boards: without it they get no provider;
    ``rooms`` (:func:`read_rooms`) how many vGPUs the vendor-VFIO boards
    serving one type hold: without it they offer one more at a time.
    """
    check_nodename(nodename, snapshot)
    rows: list[capacity.Row] = []
    unserved: list[tuple[str, str]] = []
    pending: set[str] = set()
    config = config.for_host(snapshot)
    mixed_providers: list[GpuProvider] = []
    for gpu in snapshot.gpus:
        types, why_not = configured_type(gpu, config)
        if not types:
            unserved.append((gpu.address, why_not or ""))
            continue
        if gpu.mode == host_snapshot.MODE_VFS_PENDING:
            unserved.append((gpu.address, vfs_pending_reason(gpu)))
            pending.add(gpu.address)
            continue
        if len(types) > 1:
            provider, why_not = (pool.pool_provider if config.pools else mixed.mixed_size_provider)(
                snapshot,
                gpu,
                types,
                (boards or {}).get(gpu.address),
                nodename,
                in_use,
                (unallocated or {}).get(gpu.address),
            )
            if provider is None:
                unserved.append((gpu.address, why_not or ""))
            else:
                mixed_providers.append(provider)
            continue
        type_id = types[0]
        type_info = gpu.type_info(type_id)
        if (
            type_info is None
            and not gpu.vgpu_types_in_use().get(type_id)
            and not capacity.hidden_by_other_vgpus(gpu, type_id)
        ):
            offered = sorted({t for p in gpu.parents for t in p.type_ids})
            unserved.append(
                (
                    gpu.address,
                    f"does not offer {type_id} (offers: {', '.join(offered) or 'nothing'})",
                )
            )
            continue
        total, reserved_for, reason = capacity.gpu_capacity(
            gpu, type_id, in_use, (rooms or {}).get(gpu.address)
        )
        unreadable = sorted({u for _, info in gpu.offers(type_id) for u in info.unreadable})
        if unreadable:
            reserved_for, reason = (
                ((UNREADABLE, total),),
                (f"unreadable sysfs value {unreadable[0]}; check the vendor driver"),
            )
        rows.append(
            {
                "gpu": gpu,
                "type_id": type_id,
                "total": total,
                "reserved_for": reserved_for,
                "reason": reason,
                "type_name": type_info.name if type_info else None,
                "existing": gpu.vgpu_types_in_use().get(type_id, 0),
            }
        )
    for type_config in config.types:
        if type_config.max_instances is None:
            continue
        mine = [r for r in rows if r["type_id"] == type_config.type_id]
        capped = iter(capacity.apply_host_cap(mine, type_config.max_instances))
        rows = [next(capped) if r["type_id"] == type_config.type_id else r for r in rows]
    rows = capacity.reserve_unallocated(rows, unallocated or {})
    providers = []
    for row in rows:
        row_config = config.type_config(row["type_id"])
        providers.append(
            GpuProvider(
                name=provider_name(nodename, row["gpu"]),
                parent_provider=nodename,
                gpu=row["gpu"].address,
                type_id=row["type_id"],
                type_name=row["type_name"],
                resource_class=row_config.mdev_class if row_config else "VGPU",
                total=row["total"],
                reserved=capacity.units(row["reserved_for"]),
                max_unit=row["total"],
                traits=provider_traits(
                    row["type_id"], row["type_name"], gpu_manager_version(snapshot, row["gpu"])
                ),
                reason=row["reason"],
                reserved_for=row["reserved_for"],
            )
        )
    providers = sorted(providers + mixed_providers, key=lambda p: p.gpu)
    return ProviderTree(
        root_name=nodename,
        providers=tuple(providers),
        unserved=tuple(unserved),
        mdev_classes=config.mdev_classes
        | {"VGPU"}
        | {rc for p in mixed_providers for rc, _found in p.size_inventories},
        vfs_pending=frozenset(pending),
    )
