"""What ``config check`` finds: mistakes a valid nova.conf can still hold.

Option syntax is checked by :mod:`vgpu_driver.conf.mdev_types`; here the
configuration is read against itself and against the host: groups that
configure nothing, types or addresses the host does not have, nothing
enabled, vendor-VFIO boards whose room NVML cannot tell, and a metrics file node_exporter
would never read.  Each problem names the option and value, and suggests
the near miss when there is one.  What concerns boards serving several
types is :mod:`vgpu_driver.config_check_boards`'s.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from collections.abc import Mapping
from typing import TYPE_CHECKING

from vgpu_driver import config_check_boards as boards_mod
from vgpu_driver import exception
from vgpu_driver import host_snapshot
from vgpu_driver import inventory
from vgpu_driver import metrics_textfile
from vgpu_driver.conf import devices
from vgpu_driver.conf import fleet

if TYPE_CHECKING:
    from oslo_config import cfg

    from vgpu_driver.conf.mdev_settings import MdevConfig
    from vgpu_driver.conf.mdev_settings import TypeConfig
    from vgpu_driver.framebuffer import BoardReading
    from vgpu_driver.host_snapshot import HostSnapshot
    from vgpu_driver.host_snapshot import PhysicalGPU
    from vgpu_driver.inventory.vf_room import BoardRoom
    from vgpu_driver.sysfs.host_reads import PciFunction

Problems = list[exception.ConfigProblem]


def _near_miss(value: str, candidates: Iterable[str], cutoff: float = 0.6) -> str:
    close = difflib.get_close_matches(value, sorted(set(candidates)), n=1, cutoff=cutoff)
    return f"; did you mean {close[0]!r}?" if close else ""


def _offered(
    snapshot: HostSnapshot, boards: Mapping[str, BoardReading] | None = None
) -> dict[str, str | None]:
    """``{type id: name}`` of the types the host offers: listed by a parent,
    in use (a full vendor-VFIO board lists nothing), or placeable on a board
    in mixed-size mode (``boards``: :func:`vgpu_driver.inventory.read_boards`)."""
    offered = {t.type_id: t.name for g in snapshot.gpus for p in g.parents for t in p.types}
    for gpu in snapshot.gpus:
        for type_id in gpu.vgpu_types_in_use():
            offered.setdefault(type_id, None)
        for type_id in _placeable(gpu, boards):
            offered.setdefault(type_id, None)
    return offered


def _placeable(gpu: PhysicalGPU, boards: Mapping[str, BoardReading] | None) -> set[str]:
    """The types NVML places on ``gpu`` in mixed-size mode, or takes on a
    type pool, whether or not any VF lists them now."""
    reading = (boards or {}).get(gpu.address)
    if reading is None or reading.error:
        return set()
    if not reading.mixed:
        return set(reading.maxima)
    return {type_id for type_id, found in reading.placements.items() if found.supported}


def stray_groups(conf: cfg.ConfigOpts, config: MdevConfig, snapshot: HostSnapshot) -> Problems:
    """``[mdev_*]`` groups of no enabled type: their options do nothing."""
    wanted = {devices.group_name(t) for t in config.enabled}
    offered = {devices.group_name(t) for t in _offered(snapshot)}
    problems = []
    for section in conf.list_all_sections():
        if not section.startswith("mdev_") or section in wanted:
            continue
        hint = (
            f"; enable {section[len('mdev_') :]} in [devices] enabled_mdev_types or "
            "remove the group"
            if section in offered
            else _near_miss(section, wanted)
        )
        problems.append(
            exception.ConfigProblem(
                "group",
                f"[{section}]",
                "configures no enabled type (it is not in [devices] "
                f"enabled_mdev_types), so its options are ignored{hint}",
            )
        )
    return problems


def nothing_enabled(config: MdevConfig, snapshot: HostSnapshot) -> Problems:
    if config.enabled:
        return []
    offered = ", ".join(sorted(_offered(snapshot))) or "none"
    return [
        exception.ConfigProblem(
            "[devices] enabled_mdev_types",
            "",
            "no type is enabled, so no GPU gets a provider "
            f"(types offered on this host: {offered})",
        )
    ]


def _model_absent(type_config: TypeConfig | None, snapshot: HostSnapshot) -> bool:
    """A type chosen by GPU model serves a fleet: a host without that model is
    expected, not a mistake."""
    present = {fleet.gpu_device_id(g) for g in snapshot.gpus}
    return (
        type_config is not None
        and bool(type_config.device_ids)
        and present.isdisjoint(type_config.device_ids)
    )


def _pending_types(config: MdevConfig, snapshot: HostSnapshot) -> set[str]:
    """Types served by a GPU whose VFs are not there yet: they are offered once
    its VFs are (reported once, by :func:`vfs_pending`)."""
    resolved = config.for_host(snapshot)
    return {
        type_id
        for gpu, _device_id, types, _how in fleet.gpu_map(resolved, snapshot)
        if (found := snapshot.gpu(gpu)) is not None and found.mode == host_snapshot.MODE_VFS_PENDING
        for type_id in types
    }


def absent_types(
    config: MdevConfig, snapshot: HostSnapshot, boards: Mapping[str, BoardReading] | None = None
) -> Problems:
    offered = _offered(snapshot, boards)
    pending = _pending_types(config, snapshot)
    return [
        exception.ConfigProblem(
            "[devices] enabled_mdev_types",
            type_id,
            f"no device on this host offers this type{_near_miss(type_id, offered)}",
        )
        for type_id in config.enabled
        if type_id not in offered
        and type_id not in pending
        and not _model_absent(config.type_config(type_id), snapshot)
    ]


def _serving_option(type_id: str, device_id: str | None, how: str) -> tuple[str, str | None]:
    """The option and value that gave a GPU its type, for the problem line."""
    group = devices.group_name(type_id)
    if how.startswith("device_addresses"):
        return f"[{group}] device_addresses", None
    if how.startswith("device_ids"):
        return f"[{group}] device_ids", device_id
    return "[devices] enabled_mdev_types", type_id


def vfs_pending(config: MdevConfig, snapshot: HostSnapshot) -> Problems:
    """Configured SR-IOV GPUs whose VFs are not there: they get no provider."""
    problems = []
    for address, device_id, types, how in fleet.gpu_map(config.for_host(snapshot), snapshot):
        gpu = snapshot.gpu(address)
        if not types or gpu is None or gpu.mode != host_snapshot.MODE_VFS_PENDING:
            continue
        option, value = _serving_option(types[-1], device_id, how)
        listed = sorted(
            {
                a
                for c in config.types
                if c.type_id in types
                for a in c.device_addresses
                if a in gpu.addresses
            }
        )
        vfs = [a for a in listed if a != address]
        board = f"; {', '.join(vfs)} will be VF(s) of it" if vfs else ""
        problems.append(
            exception.ConfigProblem(
                option,
                value or ", ".join(listed) or address,
                f"GPU {address} gets no provider: {inventory.vfs_pending_reason(gpu)}{board}",
            )
        )
    return problems


def _device_there(function: PciFunction | None) -> str:
    """What the PCI device at an address no parent has is, when there is one."""
    if function is None:
        return ""
    return (
        f" (the device there is bound to {function.driver or 'no driver'} and offers no "
        "vGPU; 'vgpu-manage host check' says why)"
    )


def absent_addresses(
    config: MdevConfig,
    snapshot: HostSnapshot,
    functions: Mapping[str, PciFunction | None] | None = None,
    boards: Mapping[str, BoardReading] | None = None,
) -> Problems:
    """Configured addresses no parent has, or whose device does not serve
    the type; ``functions``: the PCI device at each such address
    (``{address: PciFunction or None}``), to say which driver holds it;
    ``boards`` as for :func:`_offered`."""
    functions = functions or {}
    problems = []
    for type_config in config.types:
        option = f"[{devices.group_name(type_config.type_id)}] device_addresses"
        addresses = [a for g in snapshot.gpus for a in g.addresses]
        for address in type_config.device_addresses:
            gpu = snapshot.gpu(address)
            if gpu is None:
                problems.append(
                    exception.ConfigProblem(
                        option,
                        address,
                        "no mdev-capable device at this address on this host"
                        f"{_device_there(functions.get(address))}"
                        f"{_near_miss(address, addresses, cutoff=0.9)}",
                    )
                )
            elif gpu.mode == host_snapshot.MODE_VFS_PENDING:
                continue  # reported by vfs_pending()
            elif (
                not gpu.offers(type_config.type_id)
                and type_config.type_id not in gpu.vgpu_types_in_use()
                and type_config.type_id not in _placeable(gpu, boards)
            ):
                offered = sorted({t.type_id for p in gpu.parents for t in p.types})
                problems.append(
                    exception.ConfigProblem(
                        option,
                        address,
                        f"does not offer {type_config.type_id} "
                        f"(offers: {', '.join(offered) or 'nothing'})",
                        "warning",
                    )
                )
    return problems


def unmeasured_vendor_vfio(rooms: Mapping[str, BoardRoom] | None) -> Problems:
    """Vendor-VFIO boards serving one type whose maximum NVML cannot tell
    (``rooms``: :func:`vgpu_driver.inventory.read_rooms`): each VF lists the
    type while one more fits, so the inventory offers one at a time
    (:mod:`vgpu_driver.inventory.vf_room`) and a flavor of several vGPUs
    finds no room."""
    return [
        exception.ConfigProblem(
            "device_addresses",
            address,
            f"NVML cannot say how many vGPUs this board holds "
            f"({room.error}): its inventory offers one more at a time, so flavors of several "
            "vGPUs find no room",
            "warning",
        )
        for address, room in sorted((rooms or {}).items())
        if room.error
    ]


def check(
    conf: cfg.ConfigOpts,
    config: MdevConfig,
    snapshot: HostSnapshot,
    boards: Mapping[str, BoardReading] | None = None,
    functions: Mapping[str, PciFunction | None] | None = None,
    schedulers: Mapping[str, str | None] | None = None,
    rooms: Mapping[str, BoardRoom] | None = None,
) -> Problems:
    """Every problem found, errors first in the order they are checked;
    ``boards``: what NVML says of the boards configured for mixed sizes
    (:func:`vgpu_driver.inventory.read_boards`); ``functions``: the PCI
    devices at the configured addresses
    (:func:`vgpu_driver.host_probe.configured_functions`); ``schedulers``:
    each board's vGPU scheduler (:func:`vgpu_driver.vgpu_scheduler.policy`);
    ``rooms``: what NVML says of the vendor-VFIO boards serving one type
    (:func:`vgpu_driver.inventory.read_rooms`)."""
    resolved = config.for_host(snapshot)
    return (
        nothing_enabled(config, snapshot)
        + stray_groups(conf, config, snapshot)
        + absent_types(config, snapshot, boards)
        + absent_addresses(config, snapshot, functions, boards)
        + boards_mod.types_on_one_board(resolved, snapshot)
        + boards_mod.boards_that_cannot_mix(config, snapshot)
        + vfs_pending(config, snapshot)
        + boards_mod.mixed_size_modes(config, boards, boards_mod.shared_boards(resolved, snapshot))
        + unmeasured_vendor_vfio(rooms)
        + boards_mod.fixed_share_on_mixed_boards(resolved, snapshot, schedulers)
        + boards_mod.types_that_cannot_coexist(resolved, snapshot, boards)
        + metrics_textfile.problems(conf.vgpu.metrics_textfile)
    )
