"""How many more vGPUs of its one type an SR-IOV board takes.

On an SR-IOV board each vGPU takes a VF, and each free VF lists the types
it could take now: under NVIDIA's vendor-specific VFIO in its
``nvidia/creatable_vgpu_types``, over mdev as ``available_instances`` of 0
or 1.  In equal-size mode every free VF lists every type of the board's
one framebuffer size while one more vGPU of that size fits ("the content
of the creatable_vgpu_types for all virtual functions on the physical GPU
is set to only the vGPU types with the same amount of frame buffer",
*Virtual GPU Software User Guide* 17.0, 2.10.8.2), and none once the board
holds its maximum.  So the VFs listing a type say that one more fits, not
how many: counted, an empty L40S offers sixteen 12 GB vGPUs where four
fit, and a flavor of two vGPUs passes Placement on a board that takes one.

How many fit is the type's equal-size maximum per board (the guide's
per-board tables, "Maximum vGPUs per GPU"; over mdev the type's
``max_instance``, under vendor VFIO NVML's ``nvmlVgpuTypeGetMaxInstances``,
which no sysfs file tells) less the vGPUs the board holds, all of one size
in that mode.  A board in mixed-size mode serving one type takes as many as
there are pairwise disjoint creatable placements of the type
(:func:`vgpu_driver.size_classes.disjoint`).  Where neither is known, only
the one more the VFs' lists promise is counted: never more than fits.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Collection
from collections.abc import Mapping
from typing import TYPE_CHECKING

from oslo_log import log as logging

from vgpu_driver import exception
from vgpu_driver import host_snapshot
from vgpu_driver import names
from vgpu_driver import size_classes

if TYPE_CHECKING:
    from vgpu_driver.host_snapshot import HostSnapshot
    from vgpu_driver.host_snapshot import PhysicalGPU
    from vgpu_driver.sysfs.base import SysfsReader

LOG = logging.getLogger(__name__)
# Boards whose room NVML could not tell, already logged (once per process).
_LOGGED: set[str] = set()


@dataclasses.dataclass(frozen=True)
class BoardRoom:
    """What NVML says of a vendor-VFIO board serving one type: its most
    vGPUs of the type in equal-size mode (``maximum``), or in mixed-size
    mode how many more fit now (``creatable``); ``error`` when it cannot
    say."""

    maximum: int | None = None
    creatable: int | None = None
    error: str | None = None


def read_board(host: SysfsReader, gpu: PhysicalGPU, type_id: str) -> BoardRoom:
    """The :class:`BoardRoom` of ``gpu`` for ``type_id``, in one pass (the
    mode first: a mixed-size board's maximum is not its equal-size one)."""
    number = names.vendor_type_number(type_id)
    try:
        if host.mixed_sizes(gpu.address):
            found = host.vgpu_placements(gpu.address, [number]).get(number)
            return BoardRoom(
                creatable=size_classes.disjoint(found.creatable, found.size) if found else 0
            )
        return BoardRoom(maximum=host.vgpu_max_instances(gpu.address, [number])[number])
    except (exception.NvmlUnavailable, exception.MixedSizeModeRefused, KeyError) as exc:
        if gpu.address not in _LOGGED:
            _LOGGED.add(gpu.address)
            LOG.warning(
                "NVML cannot say how many vGPUs of %s board %s holds (%s): its "
                "inventory offers one more at a time",
                type_id,
                gpu.address,
                exc,
            )
        return BoardRoom(error=str(exc) or type(exc).__name__)


def read_boards(
    host: SysfsReader, snapshot: HostSnapshot, served: Mapping[str, Collection[str]]
) -> types.MappingProxyType[str, BoardRoom]:
    """``{board address: BoardRoom}`` of the vendor-VFIO boards ``served``
    (``{gpu address: (type id, ...)}``, see
    :func:`vgpu_driver.inventory.configured_types`) gives one type."""
    rooms: dict[str, BoardRoom] = {}
    for gpu in snapshot.gpus:
        type_ids = tuple(served.get(gpu.address, ()))
        if (
            len(type_ids) == 1
            and gpu.mode == host_snapshot.MODE_VENDOR_VFIO
            and names.is_vendor_type_id(type_ids[0])
        ):
            rooms[gpu.address] = read_board(host, gpu, type_ids[0])
    return types.MappingProxyType(rooms)


def one_per_vf(gpu: PhysicalGPU) -> bool:
    """Whether each vGPU of ``gpu`` takes a VF of its own (SR-IOV)."""
    return gpu.sriov or gpu.mode == host_snapshot.MODE_VENDOR_VFIO


def maximum(gpu: PhysicalGPU, type_id: str, room: BoardRoom | None) -> int | None:
    """The most vGPUs of ``type_id`` the board holds in equal-size mode,
    when known: its type's ``max_instance`` (mdev), else NVML's."""
    info = gpu.type_info(type_id)
    if info is not None and info.max_instance:
        return info.max_instance
    return room.maximum if room is not None and not room.error else None


def room_for(gpu: PhysicalGPU, type_id: str, room: BoardRoom | None = None) -> int:
    """How many more vGPUs of ``type_id`` an SR-IOV board takes, before
    counting its free VFs: its maximum less the vGPUs present, or in
    mixed-size mode its disjoint creatable placements; 1 where neither is
    known (the VFs' lists promise one)."""
    if room is not None and room.creatable is not None:
        return room.creatable
    most = maximum(gpu, type_id, room)
    if most is None:
        return 1
    return max(most - sum(gpu.vgpu_types_in_use().values()), 0)
