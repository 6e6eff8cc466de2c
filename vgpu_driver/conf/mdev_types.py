"""The validated view of ``[devices]`` and ``[mdev_<type>]``.

:func:`load` reads the options once, collects every problem with the option
and value that caused it, and returns an immutable :class:`MdevConfig`.
Errors make :func:`from_conf` raise (nova-compute must not start on them);
warnings are logged and shown by ``vgpu-manage config check``.  Here the
enabled types are read and checked against each other (a device served
twice, two types serving the rest, a mixed-size board's types);
:mod:`vgpu_driver.conf.type_group` reads each type's own group.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import MappingProxyType

from oslo_config import cfg
from oslo_log import log as logging

from vgpu_driver import exception
from vgpu_driver import framebuffer
from vgpu_driver import names
from vgpu_driver.conf import devices
from vgpu_driver.conf import fleet
from vgpu_driver.conf import type_group
from vgpu_driver.conf.mdev_settings import MdevConfig
from vgpu_driver.conf.mdev_settings import TypeConfig

LOG = logging.getLogger(__name__)


def _enabled_types(
    conf: cfg.ConfigOpts,
    problems: list[exception.ConfigProblem],
) -> list[str]:
    if type_group.written(conf, "devices", "enabled_mdev_types") and type_group.written(
        conf, "devices", "enabled_vgpu_types"
    ):
        problems.append(
            exception.ConfigProblem(
                type_group.option("devices", "enabled_vgpu_types"),
                type_group.raw_value(conf, "devices", "enabled_vgpu_types"),
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
                    type_group.option("devices", "enabled_mdev_types"),
                    type_id,
                    "not an mdev type id (see 'vgpu-manage types')",
                )
            )
            continue
        if type_id in enabled:
            problems.append(
                exception.ConfigProblem(
                    type_group.option("devices", "enabled_mdev_types"),
                    type_id,
                    "listed twice; the second entry is ignored",
                    "warning",
                )
            )
            continue
        enabled.append(type_id)
    return enabled


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
        type_config = type_group.type_config(conf, type_id, problems)
        type_configs.append(type_config)
        # A type naming neither addresses nor models serves the rest.
        serves_the_rest = not type_config.device_addresses and not type_config.device_ids
        if serves_the_rest and default_type is None:
            default_type = type_id
        elif serves_the_rest:
            problems.append(
                exception.ConfigProblem(
                    type_group.option(devices.group_name(type_id), "device_addresses"),
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
                        type_group.option(devices.group_name(type_id), "device_addresses"),
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
        type_configs,
        [*mixed.values(), *fleet.shared_by_device_id(type_configs).values()],
        "pool" if conf.devices.shared_board_mode == devices.SHARED_BOARD_POOL else "mixed-size",
    )
    problems += fleet.problems(
        type_configs, lambda type_id, name: type_group.option(devices.group_name(type_id), name)
    )
    config = MdevConfig(
        tuple(type_configs),
        default_type,
        MappingProxyType({a: types[0] for a, types in listing.items() if len(types) == 1}),
        mixed_by_address=MappingProxyType(mixed),
        pools=conf.devices.shared_board_mode == devices.SHARED_BOARD_POOL,
    )
    return config, problems


def _mixed_size_problems(
    type_configs: Iterable[TypeConfig], sharing: Iterable[Iterable[str]], kind: str
) -> list[exception.ConfigProblem]:
    """Options a type sharing a board (``sharing``: the tuples of types
    that share one; ``kind``: a mixed-size or a pool board) cannot honour:
    the board is one framebuffer inventory, neither a class of the type's
    own nor a count of its vGPUs."""
    shared = {t for types in sharing for t in types}
    problems: list[exception.ConfigProblem] = []
    for type_config in type_configs:
        if type_config.type_id not in shared:
            continue
        group = devices.group_name(type_config.type_id)
        if type_config.mdev_class != "VGPU":
            problems.append(
                exception.ConfigProblem(
                    type_group.option(group, "mdev_class"),
                    type_config.mdev_class,
                    f"{type_config.type_id} shares a {kind} board, whose vGPUs are "
                    f"allocated in {framebuffer.RESOURCE_CLASS}; remove mdev_class",
                )
            )
        if type_config.max_instances is not None:
            problems.append(
                exception.ConfigProblem(
                    type_group.option(group, "max_instances"),
                    type_config.max_instances,
                    f"{type_config.type_id} shares a {kind} board, whose framebuffer "
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
