"""Which GPU serves which type on this host, when types name GPU models.

One nova.conf can serve a whole fleet when ``[mdev_<type>]`` selects GPUs by
PCI ``vendor:device`` id (``device_ids``) and how many (``gpu_count``)
instead of by address.  Resolution is a pure function of the config and a
discovery snapshot, so every consumer (inventory, allocation, sync, the CLI)
sees the same map:

1. ``device_addresses`` are taken as written;
2. a GPU that already holds vGPUs of a type whose ``device_ids`` match it
   stays on that type, while the type's ``gpu_count`` allows;
3. the remaining matching GPUs, in PCI address order, go to the types with a
   ``gpu_count`` (in ``enabled_mdev_types`` order) until each has its count,
   then to the one type without a count;
4. what is left goes to the type with neither option, if there is one.

Two types without a ``gpu_count`` sharing an id would make the choice
arbitrary: that is a configuration error (see :func:`problems`), unless
both are NVIDIA types (``nvidia-<number>``): the GPUs then serve them all,
mixing sizes on one board (see :func:`shared_by_device_id`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from typing import TYPE_CHECKING

from vgpu_driver import exception
from vgpu_driver import names

if TYPE_CHECKING:
    from vgpu_driver.conf.mdev_settings import MdevConfig
    from vgpu_driver.conf.mdev_settings import TypeConfig
    from vgpu_driver.host_snapshot import HostSnapshot
    from vgpu_driver.host_snapshot import PhysicalGPU

_DEVICE_ID = re.compile(r"^(?:0x)?([0-9a-f]{4}):(?:0x)?([0-9a-f]{4})$")


@dataclasses.dataclass(frozen=True)
class Assignment:
    """The type a GPU serves (None: none), and how that was decided."""

    gpu: str
    device_id: str | None
    type_id: str | None
    how: str
    # Every type of a board NVIDIA types share (mixed sizes), ``type_id``
    # first of them; empty for a board of one type.
    shared: tuple[str, ...] = ()

    @property
    def types(self) -> tuple[str, ...]:
        return self.shared or ((self.type_id,) if self.type_id else ())


def parse_device_id(raw: object) -> str:
    """``vendor:device`` as ``10de:1eb8``; ValueError when it is not one."""
    match = _DEVICE_ID.match(str(raw).strip().lower())
    if not match:
        raise ValueError(raw)
    return f"{match.group(1)}:{match.group(2)}"


def gpu_device_id(gpu: PhysicalGPU) -> str | None:
    """The physical function's ``vendor:device`` (an SR-IOV board is one GPU)."""
    pci = gpu.pci
    if pci is None or not pci.vendor or not pci.device:
        return None
    try:
        return parse_device_id(f"{pci.vendor}:{pci.device}")
    except ValueError:
        return None


def problems(
    type_configs: Iterable[TypeConfig],
    option: Callable[[str, str], str],
) -> list[exception.ConfigProblem]:
    """Config errors no host can fix: ambiguous ids, counts without ids."""
    found: list[exception.ConfigProblem] = []
    uncounted: dict[str, str] = {}
    for type_config in type_configs:
        if type_config.gpu_count is not None and not type_config.device_ids:
            found.append(
                exception.ConfigProblem(
                    option(type_config.type_id, "gpu_count"),
                    type_config.gpu_count,
                    "needs device_ids (the GPU model it counts)",
                )
            )
        if type_config.gpu_count is not None:
            continue
        for device_id in type_config.device_ids:
            other = uncounted.setdefault(device_id, type_config.type_id)
            if other != type_config.type_id and not (
                names.is_vendor_type_id(other) and names.is_vendor_type_id(type_config.type_id)
            ):
                found.append(
                    exception.ConfigProblem(
                        option(type_config.type_id, "device_ids"),
                        device_id,
                        f"types {other} and {type_config.type_id} both take {device_id} "
                        f"GPUs and neither has a gpu_count to decide; give one of them "
                        f"a gpu_count",
                    )
                )
    return found


class _Counts:
    """GPUs given to each type so far, against its ``gpu_count``."""

    def __init__(self, config: MdevConfig, explicit: Mapping[str, str | None]) -> None:
        self._config = config
        self._taken = {
            t.type_id: sum(1 for v in explicit.values() if v == t.type_id) for t in config.types
        }

    def room(self, type_config: TypeConfig) -> bool:
        count = type_config.gpu_count
        return count is None or self._taken[type_config.type_id] < count

    def take(self, type_config: TypeConfig) -> str:
        self._taken[type_config.type_id] += 1
        count = type_config.gpu_count
        return f"device_ids {', '.join(type_config.device_ids)}" + (
            f", GPU {self._taken[type_config.type_id]} of gpu_count {count}"
            if count is not None
            else ""
        )


def shared_by_device_id(type_configs: Iterable[TypeConfig]) -> dict[str, tuple[str, ...]]:
    """``{device id: (type id, ...)}`` of the ids several NVIDIA types take
    without a ``gpu_count``: their GPUs serve them all (mixed sizes)."""
    takers: dict[str, list[str]] = {}
    for type_config in type_configs:
        if type_config.gpu_count is None and names.is_vendor_type_id(type_config.type_id):
            for device_id in type_config.device_ids:
                takers.setdefault(device_id, []).append(type_config.type_id)
    return {device_id: tuple(types) for device_id, types in takers.items() if len(types) > 1}


def _assignment(
    config: MdevConfig, gpu: PhysicalGPU, type_config: TypeConfig, how: str
) -> Assignment:
    """The Assignment of ``gpu`` to ``type_config``, with the types it
    shares the board with when its device id is shared."""
    device_id = gpu_device_id(gpu)
    # No device id (None) finds no board.
    shared: tuple[str, ...] = (
        shared_by_device_id(config.types).get(device_id, ())  # type: ignore[arg-type]
        if type_config.gpu_count is None
        else ()
    )
    if type_config.type_id not in shared:
        shared = ()
    return Assignment(
        gpu.address,
        device_id,
        type_config.type_id,
        how + (" (a mixed-size board)" if shared else ""),
        shared,
    )


def _explicit(config: MdevConfig, gpu: PhysicalGPU) -> str | None:
    found = config.explicit_types(gpu.addresses)
    return found[0] if len(found) == 1 else None


def _candidates(config: MdevConfig, device_id: str | None) -> list[TypeConfig]:
    """Types whose device_ids match: counted first, in enabled order."""
    matching = [t for t in config.types if device_id and device_id in t.device_ids]
    return sorted(matching, key=lambda t: t.gpu_count is None)


def resolve(config: MdevConfig, snapshot: HostSnapshot) -> dict[str, Assignment]:
    """``{gpu address: Assignment}`` for GPUs that matched some device_ids."""
    free = [g for g in snapshot.gpus if not config.explicit_types(g.addresses)]
    explicit = {g.address: _explicit(config, g) for g in snapshot.gpus if _explicit(config, g)}
    counts = _Counts(config, explicit)
    result: dict[str, Assignment] = {}
    for gpu in free:
        held = gpu.vgpu_types_in_use()
        for type_config in _candidates(config, gpu_device_id(gpu)):
            if held.get(type_config.type_id) and counts.room(type_config):
                how = counts.take(type_config)
                result[gpu.address] = _assignment(
                    config, gpu, type_config, f"{how}; keeps its existing vGPUs of this type"
                )
                break
    for gpu in free:
        device_id = gpu_device_id(gpu)
        candidates = _candidates(config, device_id)
        if gpu.address in result or not candidates:
            continue
        chosen = next((t for t in candidates if counts.room(t)), None)
        if chosen is None:
            full = ", ".join(f"{t.type_id} (gpu_count {t.gpu_count})" for t in candidates)
            result[gpu.address] = Assignment(
                gpu.address,
                device_id,
                None,
                f"matches device_ids of {full}, all of them taken by GPUs before it",
            )
            continue
        result[gpu.address] = _assignment(config, gpu, chosen, counts.take(chosen))
    return result


def gpu_map(
    config: MdevConfig,
    snapshot: HostSnapshot,
) -> list[tuple[str, str | None, tuple[str, ...], str]]:
    """``[(gpu, device_id, (type id, ...), how)]`` for every GPU of the host:
    no type, one, or the NVIDIA types of a mixed-size board.

    ``config`` is resolved for ``snapshot`` (``MdevConfig.for_host``).
    """
    rows: list[tuple[str, str | None, tuple[str, ...], str]] = []
    for gpu in snapshot.gpus:
        explicit = config.explicit_types(gpu.addresses)
        assignment = config.by_model.get(gpu.address)
        if len(explicit) == 1:
            types, how = tuple(explicit), "device_addresses"
        elif explicit and all(map(names.is_vendor_type_id, explicit)):
            types, how = tuple(explicit), "device_addresses (a mixed-size board)"
        elif explicit:
            types, how = (), f"listed under several types ({', '.join(explicit)})"
        elif assignment is not None:
            types, how = assignment.types, assignment.how
        elif config.default_type:
            types, how = (config.default_type,), "the type without device_addresses"
        else:
            types, how = (), "matched by no device_addresses nor device_ids"
        rows.append((gpu.address, gpu_device_id(gpu), types, how))
    return rows
