"""Which NVIDIA types each GPU serves, from the configuration (no I/O).

A GPU serves the one type its address is listed under, the default type,
or several: a board of vendor-VFIO vGPUs in mixed-size mode, or an NVIDIA
GPU in a type pool.  Anything else gets no provider, and the reason says
what to fix.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from vgpu_driver import host_snapshot
from vgpu_driver import names

if TYPE_CHECKING:
    from vgpu_driver.conf.mdev_settings import MdevConfig
    from vgpu_driver.host_snapshot import HostSnapshot
    from vgpu_driver.host_snapshot import PhysicalGPU


def configured_types(snapshot: HostSnapshot, mdev_config: MdevConfig) -> dict[str, tuple[str, ...]]:
    """``{gpu address: (type id, ...)}`` of every GPU of ``snapshot`` a type
    is configured for (several on a mixed-size board), the fleet's
    configuration resolved once."""
    config = mdev_config.for_host(snapshot)
    served = {}
    for gpu in snapshot.gpus:
        types, _why = configured_type(gpu, config)
        if types:
            served[gpu.address] = types
    return served


def configured_type(gpu: PhysicalGPU, config: MdevConfig) -> tuple[tuple[str, ...], str | None]:
    """``((type_id, ...), None)`` or ``((), reason the GPU is not served)``:
    one type, or the vendor-VFIO types of a mixed-size board.

    ``config`` is resolved for the host (:meth:`MdevConfig.for_host`) when
    its types select GPUs by ``device_ids``.
    """
    assigned = config.types_for(gpu.addresses)
    if len(assigned) > 1 and not _can_mix(gpu, assigned, config.pools):
        return (), (
            f"its addresses are listed under several types ({', '.join(assigned)}); "
            "a GPU serves one type, unless it is a board serving vendor-VFIO "
            "vGPUs, which mixes sizes, or an NVIDIA GPU in a type pool "
            "([devices] shared_board_mode = pool): fix device_addresses"
        )
    if assigned:
        return tuple(assigned), None
    if config.default_type:
        return (config.default_type,), None
    if not config.types:
        return (), "no mdev type is enabled ([devices] enabled_mdev_types)"
    return (), (
        config.fleet_reason(gpu.address)
        or "not listed in any [mdev_<type>] device_addresses nor matched by device_ids"
    )


def _can_mix(gpu: PhysicalGPU, type_ids: Collection[str], pools: bool = False) -> bool:
    """Whether ``gpu`` may serve several types: NVIDIA's, on a board whose
    VFs serve vendor-VFIO vGPUs (or are not there yet to tell); in a type
    pool, on a GPU whose vGPUs are mdevs too."""
    modes = {host_snapshot.MODE_VENDOR_VFIO, host_snapshot.MODE_VFS_PENDING}
    if pools:
        modes.add(host_snapshot.MODE_MDEV)
    return all(map(names.is_vendor_type_id, type_ids)) and gpu.mode in modes


def vfs_pending_reason(gpu: PhysicalGPU) -> str:
    """Why a configured SR-IOV GPU has no provider yet, and the fix."""
    if gpu.vfs_off:
        return f"SR-IOV is off: run vgpu-manage sriov enable {gpu.address}"
    numvfs = gpu.pci.sriov_numvfs if gpu.pci is not None else 0
    return (
        f"its {numvfs} VFs offer no mdev type yet (the NVIDIA vGPU "
        f"manager has not registered them); see vgpu-manage sriov status"
    )
