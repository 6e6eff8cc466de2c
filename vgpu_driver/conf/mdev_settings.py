"""The validated mdev configuration: which type each device serves, and
each type's settings.

:class:`MdevConfig` and :class:`TypeConfig` are the immutable values every
consumer (inventory, the mdev manager, privsep's policy, the checks) reads.
They are apart from :mod:`vgpu_driver.conf.mdev_types`, which builds them
from the options, because most of their users, tests and benchmarks among
them, only hold or build a config and never read one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from types import MappingProxyType
from typing import TYPE_CHECKING

from vgpu_driver import framebuffer
from vgpu_driver.conf import fleet

if TYPE_CHECKING:
    from vgpu_driver.host_snapshot import HostSnapshot


@dataclasses.dataclass(frozen=True)
class TypeConfig:
    type_id: str
    device_addresses: tuple[str, ...] = ()
    mdev_class: str = "VGPU"
    max_instances: int | None = None
    display: bool | None = None
    ramfb: bool | None = None
    device_ids: tuple[str, ...] = ()
    gpu_count: int | None = None


@dataclasses.dataclass(frozen=True)
class MdevConfig:
    """Which type each device serves, and each type's settings."""

    types: tuple[TypeConfig, ...] = ()
    default_type: str | None = None
    by_address: MappingProxyType[str, str] = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )
    # {address: (type id, ...)}: the NVIDIA types sharing a mixed-size
    # board, in enabled_mdev_types order (by_address holds the rest).
    mixed_by_address: MappingProxyType[str, tuple[str, ...]] = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )
    # [devices] shared_board_mode is "pool": the boards of mixed_by_address
    # (and those NVIDIA types share by device id) stay in equal-size mode,
    # each taking the size of its first vGPU (vgpu_driver.inventory.pool).
    pools: bool = False
    # After for_host(): {GPU address: fleet.Assignment} of GPUs matched by
    # device_ids (type_id None: matched, but every matching type is full).
    by_model: MappingProxyType[str, fleet.Assignment] = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )

    def type_config(self, type_id: str) -> TypeConfig | None:
        for type_config in self.types:
            if type_config.type_id == type_id:
                return type_config
        return None

    def listed_types(self, address: str) -> tuple[str, ...]:
        """The types whose device_addresses list ``address``."""
        if address in self.by_address:
            return (self.by_address[address],)
        return self.mixed_by_address.get(address, ())

    def explicit_types(self, addresses: Iterable[str]) -> list[str]:
        """The distinct types whose device_addresses list any of ``addresses``."""
        return sorted({t for a in addresses for t in self.listed_types(a)})

    @property
    def mixed_types(self) -> frozenset[str]:
        """The types that share a board with another type (mixed-size
        boards), by address or by device id."""
        return frozenset(
            t
            for shared in (self.mixed_by_address, fleet.shared_by_device_id(self.types))
            for types in shared.values()
            for t in types
        )

    def types_for(self, addresses: Iterable[str]) -> list[str]:
        """The distinct types the config assigns to any of ``addresses``
        (through device_ids too, once resolved by :meth:`for_host`)."""
        found = set(self.explicit_types(addresses))
        found.update(t for a in addresses if a in self.by_model for t in self.by_model[a].types)
        return sorted(found)

    def fleet_reason(self, address: str) -> str | None:
        """Why a GPU matching device_ids serves none of their types, or None."""
        assignment = self.by_model.get(address)
        return assignment.how if assignment and assignment.type_id is None else None

    def for_host(self, snapshot: HostSnapshot) -> MdevConfig:
        """This config with device_ids resolved against one host's GPUs."""
        if not any(t.device_ids for t in self.types):
            return self
        return dataclasses.replace(self, by_model=MappingProxyType(fleet.resolve(self, snapshot)))

    @property
    def enabled(self) -> tuple[str, ...]:
        return tuple(t.type_id for t in self.types)

    @property
    def mdev_classes(self) -> frozenset[str]:
        """The resource classes the enabled types are allocated in: a
        mixed-size board's vGPUs are allocated in framebuffer MiB."""
        classes = {t.mdev_class for t in self.types if t.type_id not in self.mixed_types}
        if self.mixed_types:
            classes.add(framebuffer.RESOURCE_CLASS)
        return frozenset(classes)
