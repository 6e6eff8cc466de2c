"""The capacity of a GPU serving one type: what exists plus what fits.

Its total is the vGPUs of the type that exist plus what can still be
created, capped by the type's per-GPU maximum, by the GPU's VFs on SR-IOV
boards (the room the board has left, :mod:`vgpu_driver.inventory.vf_room`)
and, host-wide, by the type's ``max_instances``.  A GPU that cannot serve
its type now keeps its potential, all reserved, and says why.
"""

from __future__ import annotations

from collections.abc import Collection
from collections.abc import Iterable
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

from vgpu_driver import host_snapshot
from vgpu_driver.inventory import providers
from vgpu_driver.inventory import vf_room

if TYPE_CHECKING:
    from vgpu_driver.host_snapshot import PhysicalGPU
    from vgpu_driver.inventory.vf_room import BoardRoom
    from vgpu_driver.sysfs.base import MdevTypeInfo

# One GPU's row while the tree is computed: its GPU, type, total,
# reserved_for, reason, type name and existing vGPUs of the type.
Row = dict[str, Any]
ReservedFor = tuple[tuple[str, int], ...]


def per_gpu_limit(
    gpu: PhysicalGPU, type_info: MdevTypeInfo | None, most: int | None = None
) -> int | None:
    """The most mdevs of a type the GPU can ever host, when it is known
    (``most``: the board's maximum NVML tells, :mod:`vgpu_driver.inventory.vf_room`)."""
    limits = []
    if type_info is not None and type_info.max_instance:
        limits.append(type_info.max_instance)
    if most:
        limits.append(most)
    if gpu.sriov:
        limits.append(len(gpu.parents))
    return min(limits) if limits else None


def blocked_reason(
    gpu: PhysicalGPU, type_id: str, in_use: Collection[str] | None
) -> tuple[str, str]:
    """``(kind, why)`` a GPU cannot serve its type now: mdevs of other types."""
    others: dict[str, list[str]] = {}
    for mdev in gpu.mdevs:
        if mdev.type_id != type_id:
            others.setdefault(mdev.type_id, []).append(mdev.uuid)
    for parent in gpu.parents:
        if parent.current_vgpu_type and parent.current_vgpu_type != type_id:
            others.setdefault(parent.current_vgpu_type, []).append(parent.name)
    if not others:
        return providers.NO_CAPACITY, f"no {type_id} can be created now"
    listed = ", ".join(f"{len(u)} of {t}" for t, u in sorted(others.items()))
    if in_use is None:
        return providers.BLOCKED, (
            f"blocked by existing mdevs ({listed}); remove the unused ones to serve {type_id}"
        )
    busy = sum(1 for uuids in others.values() for u in uuids if u in in_use)
    if busy:
        return providers.DRAINING, (
            f"draining: mdevs ({listed}) of which {busy} in use by "
            f"guests; serves {type_id} once they are gone"
        )
    return providers.BLOCKED, (
        f"blocked by unused mdevs ({listed}); they are reclaimed automatically"
    )


def hidden_by_other_vgpus(gpu: PhysicalGPU, type_id: str) -> bool:
    """True when the GPU's VFs may hide ``type_id`` for now.

    NVIDIA's vendor-specific VFIO lists only the types a VF can take now, so
    a GPU holding vGPUs of another size lists none of the served type's
    size: it is draining (or blocked), not a GPU that never offers the type.
    """
    return gpu.mode == host_snapshot.MODE_VENDOR_VFIO and any(
        p.current_vgpu_type and p.current_vgpu_type != type_id for p in gpu.parents
    )


def gpu_capacity(
    gpu: PhysicalGPU,
    type_id: str,
    in_use: Collection[str] | None = None,
    room: BoardRoom | None = None,
) -> tuple[int, ReservedFor, str | None]:
    """``(total, reserved_for, reason)`` for one GPU before host-wide caps.

    On an SR-IOV board the free VFs listing the type say that one more
    fits, not how many: what can still be created is capped by the room
    the board has left (:func:`vgpu_driver.inventory.vf_room.room_for`;
    ``room``: what NVML said of a vendor-VFIO board).
    """
    existing = gpu.vgpu_types_in_use().get(type_id, 0)
    creatable = sum(info.available_instances for _, info in gpu.offers(type_id))
    if vf_room.one_per_vf(gpu):
        creatable = min(creatable, vf_room.room_for(gpu, type_id, room))
    limit = per_gpu_limit(gpu, gpu.type_info(type_id), vf_room.maximum(gpu, type_id, room))
    capacity = existing + creatable
    if limit is not None:
        capacity = min(capacity, max(limit, existing))
    if capacity:
        return capacity, (), None
    potential = limit or 1
    kind, reason = blocked_reason(gpu, type_id, in_use)
    return potential, ((kind, potential),), reason


def apply_host_cap(rows: Iterable[Row], max_instances: int) -> list[Row]:
    """Cap a type's totals host-wide, filling GPUs in address order."""
    remaining = max_instances
    capped = []
    for row in rows:
        total, reserved_for, reason, existing = (
            row["total"],
            row["reserved_for"],
            row["reason"],
            row["existing"],
        )
        usable = total - units(reserved_for)
        allowed = max(existing, min(usable, remaining))
        remaining = max(remaining - allowed, 0)
        if usable and allowed == 0:
            reserved_for = ((providers.MAX_INSTANCES, total),)
            reason = f"max_instances={max_instances} for {row['type_id']} is used by other GPUs"
        elif usable:
            total = allowed
        capped.append({**row, "total": total, "reserved_for": reserved_for, "reason": reason})
    return capped


def reserve_unallocated(rows: Iterable[Row], unallocated: Mapping[str, Any]) -> list[Row]:
    """Add to each GPU's reserved units the claims Placement does not count."""
    reserved = []
    for row in rows:
        held = units(row["reserved_for"])
        extra = min(row["total"] - held, unallocated.get(row["gpu"].address, 0))
        reserved.append(
            {
                **row,
                "reserved_for": row["reserved_for"]
                + (((providers.CLAIMS, extra),) if extra > 0 else ()),
            }
        )
    return reserved


def units(reserved_for: ReservedFor) -> int:
    return sum(count for _kind, count in reserved_for)
