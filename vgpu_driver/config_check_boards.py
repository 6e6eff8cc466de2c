"""``config check``'s findings about boards that serve several types:
types sharing one board, boards that cannot mix sizes or are not in
mixed-size mode, NVIDIA's fixed-share scheduler on a mixed-size board, and
types whose placements can never coexist on any board they share.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from vgpu_driver import exception
from vgpu_driver import host_snapshot
from vgpu_driver import inventory
from vgpu_driver import vgpu_scheduler
from vgpu_driver.conf import devices

if TYPE_CHECKING:
    from vgpu_driver.conf.mdev_settings import MdevConfig
    from vgpu_driver.framebuffer import BoardReading
    from vgpu_driver.host_snapshot import HostSnapshot
    from vgpu_driver.nvml import Placements

Problems = list[exception.ConfigProblem]


def shared_boards(config: MdevConfig, snapshot: HostSnapshot) -> dict[str, tuple[str, ...]]:
    """``{GPU address: (type id, ...)}`` of the vendor-VFIO boards the
    inventory serves with several types, however the configuration names
    them (by the PF, by any of its VFs, or by model); a board whose VFs are
    not there yet cannot tell, and is left to the checks of one type."""
    return {
        gpu: types
        for gpu, types in inventory.configured_types(snapshot, config).items()
        if len(types) > 1
        and (found := snapshot.gpu(gpu)) is not None
        and found.mode == host_snapshot.MODE_VENDOR_VFIO
    }


def types_on_one_board(config: MdevConfig, snapshot: HostSnapshot) -> Problems:
    """A board whose PF and VFs (or VFs) are listed under different types,
    that cannot mix sizes: it serves one type, so it gets none."""
    problems = []
    shared = shared_boards(config, snapshot)
    for gpu in snapshot.gpus:
        if gpu.address in shared:
            continue  # a mixed-size board: its addresses name it, whichever
        listed = {a: config.listed_types(a) for a in gpu.addresses if config.listed_types(a)}
        if len(set(listed.values())) > 1:
            where = ", ".join(f"{a} under {' and '.join(t)}" for a, t in sorted(listed.items()))
            problems.append(
                exception.ConfigProblem(
                    "device_addresses",
                    ", ".join(sorted(listed)),
                    f"addresses of one board (GPU {gpu.address}) are listed under different "
                    f"types ({where}); a board serves one type, so it gets none: list it "
                    "under one type",
                )
            )
    return problems


def boards_that_cannot_mix(config: MdevConfig, snapshot: HostSnapshot) -> Problems:
    """A board listed under several types that is not one serving
    vendor-VFIO vGPUs: it serves one type, so it gets none."""
    problems = []
    resolved = config.for_host(snapshot)
    for gpu in snapshot.gpus:
        types = resolved.types_for(gpu.addresses)
        _served, why = inventory.configured_type(gpu, resolved)
        if len(types) < 2 or why is None:
            continue
        listed = sorted(a for a in gpu.addresses if config.listed_types(a))
        problems.append(
            exception.ConfigProblem(
                f"[{devices.group_name(types[-1])}] device_addresses",
                ", ".join(listed),
                f"GPU {gpu.address} gets no provider: {why}",
            )
        )
    return problems


def mixed_size_modes(
    config: MdevConfig,
    boards: Mapping[str, BoardReading] | None,
    shared: Mapping[str, tuple[str, ...]] | None = None,
) -> Problems:
    """Boards configured for several sizes whose mode NVML cannot read, or
    that are in equal-size mode (type pools: in mixed-size mode): they get
    no provider until switched;
    ``shared``: :func:`_shared_boards`, to name their types."""
    problems = []
    for address, reading in sorted((boards or {}).items()):
        types = (
            ", ".join((shared or {}).get(address) or config.mixed_by_address.get(address, ()))
            or address
        )
        if config.pools:
            problems += _pool_mode(address, types, reading)
        elif reading.error:
            problems.append(
                exception.ConfigProblem(
                    "device_addresses",
                    address,
                    f"configured for mixed sizes ({types}), but "
                    f"NVML cannot say whether the board mixes sizes: {reading.error}",
                )
            )
        elif not reading.mixed:
            problems.append(
                exception.ConfigProblem(
                    "device_addresses",
                    address,
                    f"configured for mixed sizes ({types}) but in "
                    f"equal-size mode, so it gets no provider: run vgpu-manage sriov sizes "
                    f"{address} mixed",
                )
            )
    return problems


def _pool_mode(address: str, types: str, reading: BoardReading) -> Problems:
    """A type pool whose sizes NVML cannot read, or that is in mixed-size
    mode: it gets no provider until switched back."""
    if reading.error:
        why = f"NVML cannot say its types' sizes: {reading.error}"
    elif reading.mixed:
        why = (
            "in mixed-size mode, so it gets no provider: run vgpu-manage sriov sizes "
            f"{address} equal"
        )
    else:
        return []
    return [
        exception.ConfigProblem(
            "device_addresses", address, f"configured as a type pool ({types}), but {why}"
        )
    ]


def fixed_share_on_mixed_boards(
    config: MdevConfig, snapshot: HostSnapshot, schedulers: Mapping[str, str | None] | None
) -> Problems:
    """A board configured for mixed sizes whose vGPU manager runs the
    fixed-share scheduler, which NVIDIA does not support in mixed-size mode
    (user guide, 2.11); ``schedulers``: ``{GPU address: policy}``
    (:func:`vgpu_driver.vgpu_scheduler.policy`)."""
    problems: Problems = []
    if config.pools:
        return problems  # equal-size mode takes every scheduler
    for address, types in sorted(shared_boards(config, snapshot).items()):
        if (schedulers or {}).get(address) == vgpu_scheduler.FIXED_SHARE:
            problems.append(
                exception.ConfigProblem(
                    "device_addresses",
                    address,
                    f"configured for mixed sizes ({', '.join(types)}) "
                    "but NVIDIA's vGPU manager runs the fixed-share scheduler on it "
                    f"({vgpu_scheduler.KEY}), which NVIDIA does not support in mixed-size mode: "
                    "use the equal-share or best-effort scheduler",
                    "warning",
                )
            )
    return problems


def _coexist(one: Placements, other: Placements) -> bool:
    """Whether some placement of ``one`` and some of ``other`` (NVML's
    Placements) take no slot in common."""
    return any(
        a + one.size <= b or b + other.size <= a for a in one.supported for b in other.supported
    )


def types_that_cannot_coexist(
    config: MdevConfig, snapshot: HostSnapshot, boards: Mapping[str, BoardReading] | None
) -> Problems:
    """Configured types no board can hold together: on every board
    configured for both, each placement of one overlaps each of the other,
    so a vGPU of one makes the board refuse the other."""
    pairs: dict[tuple[str, str], list[bool]] = {}
    for address, types in shared_boards(config, snapshot).items():
        reading = (boards or {}).get(address)
        if reading is None or reading.error or not reading.mixed:
            continue
        for i, one in enumerate(types):
            for other in types[i + 1 :]:
                first, second = reading.placements.get(one), reading.placements.get(other)
                if first and second and first.supported and second.supported:
                    pairs.setdefault((one, other), []).append(_coexist(first, second))
    return [
        exception.ConfigProblem(
            "[devices] enabled_mdev_types",
            f"{one}, {other}",
            f"{one} and {other} cannot share a board: on every board configured for both, each "
            f"placement of one overlaps each placement of the other, so a vGPU of either "
            "makes the board refuse the other",
            "warning",
        )
        for (one, other), fits in sorted(pairs.items())
        if not any(fits)
    ]
