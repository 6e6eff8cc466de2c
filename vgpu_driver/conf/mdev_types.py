"""The validated view of ``[devices]`` and ``[mdev_<type>]``.

:func:`load` reads the options once, collects every problem with the option
and value that caused it, and returns an immutable :class:`MdevConfig`.
Errors make :func:`from_conf` raise (nova-compute must not start on them);
warnings are logged and shown by ``vgpu-manage config check``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from types import MappingProxyType
from typing import TYPE_CHECKING
from typing import Any

from oslo_config import cfg
from oslo_log import log as logging

from vgpu_driver import exception
from vgpu_driver import framebuffer
from vgpu_driver import names
from vgpu_driver.conf import devices
from vgpu_driver.conf import fleet

if TYPE_CHECKING:
    from vgpu_driver.discovery import HostSnapshot

LOG = logging.getLogger(__name__)


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


def _option(group: str, name: str) -> str:
    return f"[{group}] {name}"


def _read(
    conf: cfg.ConfigOpts, group: str, name: str, problems: list[exception.ConfigProblem]
) -> Any:
    """An option's value, or None with a problem when oslo.config rejects it."""
    try:
        return conf[group][name]
    except (cfg.ConfigFileValueError, ValueError) as exc:
        value = getattr(exc, "value", None)
        reason = str(exc).rsplit("is not valid: ", 1)[-1]
        problems.append(exception.ConfigProblem(_option(group, name), value, reason))
        return None


def _raw_value(conf: cfg.ConfigOpts, group: str, name: str) -> Any:
    """The text as written, for problem reports (oslo hides it on errors)."""
    try:
        # No namespace yet (no file parsed) fails as any other miss does.
        value, _loc = conf._namespace._get_file_value(  # type: ignore[union-attr]
            [(group, name)]
        )
        return value[-1] if isinstance(value, list) else value
    except Exception:  # noqa: BLE001 - best effort, reporting only
        return None


def _written(conf: cfg.ConfigOpts, group: str, name: str) -> bool:
    """Whether a configuration file sets ``[group] name`` itself."""
    try:
        conf._namespace._get_file_value([(group, name)])  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - not found is KeyError; best effort, reporting only
        return False
    return True


def _enabled_types(
    conf: cfg.ConfigOpts,
    problems: list[exception.ConfigProblem],
) -> list[str]:
    if _written(conf, "devices", "enabled_mdev_types") and _written(
        conf, "devices", "enabled_vgpu_types"
    ):
        problems.append(
            exception.ConfigProblem(
                _option("devices", "enabled_vgpu_types"),
                _raw_value(conf, "devices", "enabled_vgpu_types"),
                "ignored: enabled_mdev_types is set too and wins; remove the old name",
                "warning",
            )
        )
    enabled: list[str] = []
    for type_id in conf.devices.enabled_mdev_types:
        try:
            names.check_type_id(type_id)
        except exception.InvalidSysfsName:
            problems.append(
                exception.ConfigProblem(
                    _option("devices", "enabled_mdev_types"),
                    type_id,
                    "not an mdev type id (see 'vgpu-manage types')",
                )
            )
            continue
        if type_id in enabled:
            problems.append(
                exception.ConfigProblem(
                    _option("devices", "enabled_mdev_types"),
                    type_id,
                    "listed twice; the second entry is ignored",
                    "warning",
                )
            )
            continue
        enabled.append(type_id)
    return enabled


def _type_config(
    conf: cfg.ConfigOpts, type_id: str, problems: list[exception.ConfigProblem]
) -> TypeConfig:
    group = devices.group_name(type_id)
    addresses: list[str] = []
    for raw in _read(conf, group, "device_addresses", problems) or []:
        try:
            address = names.parse_device_address(raw)
        except exception.InvalidSysfsName:
            problems.append(
                exception.ConfigProblem(
                    _option(group, "device_addresses"),
                    raw,
                    "not a PCI address (dddd:bb:ss.f) nor a virtual device "
                    "(<class>_<device>, e.g. mtty_mtty)",
                )
            )
            continue
        if address in addresses:
            problems.append(
                exception.ConfigProblem(
                    _option(group, "device_addresses"), raw, "listed twice", "warning"
                )
            )
            continue
        addresses.append(address)
    device_ids = _device_ids(conf, group, problems)
    gpu_count = _read(conf, group, "gpu_count", problems)
    mdev_class = _read(conf, group, "mdev_class", problems)
    max_instances = _read(conf, group, "max_instances", problems)
    display = _read(conf, group, "display", problems)
    ramfb = _read(conf, group, "ramfb", problems)
    if ramfb and not display:
        problems.append(
            exception.ConfigProblem(
                _option(group, "ramfb"),
                True,
                "needs display = true (libvirt shows the boot "
                "framebuffer through the vGPU's display)",
            )
        )
    for problem in problems:
        if problem.value is None and problem.option.startswith(f"[{group}]"):
            problem.value = _raw_value(conf, group, problem.option.split("] ")[1])
    return TypeConfig(
        type_id,
        tuple(addresses),
        mdev_class or "VGPU",
        max_instances,
        display,
        ramfb,
        device_ids,
        gpu_count,
    )


def _device_ids(
    conf: cfg.ConfigOpts, group: str, problems: list[exception.ConfigProblem]
) -> tuple[str, ...]:
    found: list[str] = []
    for raw in _read(conf, group, "device_ids", problems) or []:
        try:
            device_id = fleet.parse_device_id(raw)
        except ValueError:
            problems.append(
                exception.ConfigProblem(
                    _option(group, "device_ids"),
                    raw,
                    "not a PCI vendor:device id (e.g. 10de:1eb8, see lspci -nn)",
                )
            )
            continue
        if device_id not in found:
            found.append(device_id)
    return tuple(found)


def load(conf: cfg.ConfigOpts) -> tuple[MdevConfig, list[exception.ConfigProblem]]:
    """Read the mdev options: returns ``(MdevConfig, [ConfigProblem])``."""
    problems: list[exception.ConfigProblem] = []
    enabled = _enabled_types(conf, problems)
    for type_id in enabled:
        group = devices.group_name(type_id)
        if group not in conf:
            conf.register_group(cfg.OptGroup(group))
        # nova may have registered the group with its own (fewer) options.
        for opt in devices.mdev_type_opts(type_id):
            if opt.dest not in conf[group]:
                conf.register_opt(opt, group=group)
    type_configs: list[TypeConfig] = []
    listing: dict[str, tuple[str, ...]] = {}
    default_type: str | None = None
    for type_id in enabled:
        type_config = _type_config(conf, type_id, problems)
        type_configs.append(type_config)
        # A type naming neither addresses nor models serves the rest.
        serves_the_rest = not type_config.device_addresses and not type_config.device_ids
        if serves_the_rest and default_type is None:
            default_type = type_id
        elif serves_the_rest:
            problems.append(
                exception.ConfigProblem(
                    _option(devices.group_name(type_id), "device_addresses"),
                    [],
                    f"empty, but type {default_type} already serves every unlisted "
                    f"device; {type_id} will not be used (set its device_addresses)",
                    "warning",
                )
            )
        for address in type_config.device_addresses:
            listed = listing.get(address, ())
            if listed and not all(map(names.is_vendor_type_id, (*listed, type_id))):
                problems.append(
                    exception.ConfigProblem(
                        _option(devices.group_name(type_id), "device_addresses"),
                        address,
                        f"{address} is also listed under type {listed[0]}; a device serves "
                        f"one type, unless every type listing it is an NVIDIA type "
                        f"(nvidia-<number>) of a board that mixes vGPU sizes: remove it "
                        f"from [mdev_{type_id}] or [mdev_{listed[0]}]",
                    )
                )
                continue
            listing[address] = (*listed, type_id)
    mixed = {a: types for a, types in listing.items() if len(types) > 1}
    problems += _mixed_size_problems(
        type_configs, [*mixed.values(), *fleet.shared_by_device_id(type_configs).values()]
    )
    problems += fleet.problems(
        type_configs, lambda type_id, name: _option(devices.group_name(type_id), name)
    )
    config = MdevConfig(
        tuple(type_configs),
        default_type,
        MappingProxyType({a: types[0] for a, types in listing.items() if len(types) == 1}),
        mixed_by_address=MappingProxyType(mixed),
    )
    return config, problems


def _mixed_size_problems(
    type_configs: Iterable[TypeConfig], sharing: Iterable[Iterable[str]]
) -> list[exception.ConfigProblem]:
    """Options a type sharing a mixed-size board (``sharing``: the tuples
    of types that share one) cannot honour: the board is one framebuffer
    inventory, neither a class of the type's own nor a count of its vGPUs."""
    shared = {t for types in sharing for t in types}
    problems: list[exception.ConfigProblem] = []
    for type_config in type_configs:
        if type_config.type_id not in shared:
            continue
        group = devices.group_name(type_config.type_id)
        if type_config.mdev_class != "VGPU":
            problems.append(
                exception.ConfigProblem(
                    _option(group, "mdev_class"),
                    type_config.mdev_class,
                    f"{type_config.type_id} shares a mixed-size board, whose vGPUs are "
                    f"allocated in {framebuffer.RESOURCE_CLASS}; remove mdev_class",
                )
            )
        if type_config.max_instances is not None:
            problems.append(
                exception.ConfigProblem(
                    _option(group, "max_instances"),
                    type_config.max_instances,
                    f"{type_config.type_id} shares a mixed-size board, whose framebuffer "
                    f"is the limit; remove max_instances",
                )
            )
    return problems


def from_conf(conf: cfg.ConfigOpts) -> MdevConfig:
    """The config, after logging warnings; raises InvalidConfiguration on errors."""
    config, problems = load(conf)
    errors = [p for p in problems if p.severity == "error"]
    for problem in problems:
        if problem.severity != "error":
            LOG.warning("%s", problem)
    if errors:
        raise exception.InvalidConfiguration(errors)
    return config
