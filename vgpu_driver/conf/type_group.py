"""One ``[mdev_<type>]`` group read into a :class:`TypeConfig`, and the
option reading every mdev check shares.

Each value is read on its own: a value oslo.config rejects, or one that is
not an address or a device id, becomes a ConfigProblem naming the option
and the text as written, and the rest of the group is still read.  Apart
from :mod:`vgpu_driver.conf.mdev_types`, which reads the enabled types and
checks them against each other.
"""

from __future__ import annotations

from typing import Any

from oslo_config import cfg

from vgpu_driver import exception
from vgpu_driver import names
from vgpu_driver.conf import devices
from vgpu_driver.conf import fleet
from vgpu_driver.conf.mdev_settings import TypeConfig


def option(group: str, name: str) -> str:
    """How a problem names an option."""
    return f"[{group}] {name}"


def read(
    conf: cfg.ConfigOpts, group: str, name: str, problems: list[exception.ConfigProblem]
) -> Any:
    """An option's value, or None with a problem when oslo.config rejects it."""
    try:
        return conf[group][name]
    except (cfg.ConfigFileValueError, ValueError) as exc:
        value = getattr(exc, "value", None)
        reason = str(exc).rsplit("is not valid: ", 1)[-1]
        problems.append(exception.ConfigProblem(option(group, name), value, reason))
        return None


def raw_value(conf: cfg.ConfigOpts, group: str, name: str) -> Any:
    """The text as written, for problem reports (oslo hides it on errors)."""
    try:
        # No namespace yet (no file parsed) fails as any other miss does.
        value, _loc = conf._namespace._get_file_value(  # type: ignore[union-attr]
            [(group, name)]
        )
        return value[-1] if isinstance(value, list) else value
    except Exception:  # noqa: BLE001 - best effort, reporting only
        return None


def written(conf: cfg.ConfigOpts, group: str, name: str) -> bool:
    """Whether a configuration file sets ``[group] name`` itself."""
    try:
        conf._namespace._get_file_value([(group, name)])  # type: ignore[union-attr]
    except Exception:  # noqa: BLE001 - not found is KeyError; best effort, reporting only
        return False
    return True


def type_config(
    conf: cfg.ConfigOpts, type_id: str, problems: list[exception.ConfigProblem]
) -> TypeConfig:
    """One type's group, its problems appended to ``problems``."""
    group = devices.group_name(type_id)
    addresses: list[str] = []
    for raw in read(conf, group, "device_addresses", problems) or []:
        try:
            address = names.parse_device_address(raw)
        except exception.InvalidSysfsName:
            problems.append(
                exception.ConfigProblem(
                    option(group, "device_addresses"),
                    raw,
                    "not a PCI address (dddd:bb:ss.f) nor a virtual device "
                    "(<class>_<device>, e.g. mtty_mtty)",
                )
            )
            continue
        if address in addresses:
            problems.append(
                exception.ConfigProblem(
                    option(group, "device_addresses"), raw, "listed twice", "warning"
                )
            )
            continue
        addresses.append(address)
    device_ids = _device_ids(conf, group, problems)
    gpu_count = read(conf, group, "gpu_count", problems)
    mdev_class = read(conf, group, "mdev_class", problems)
    max_instances = read(conf, group, "max_instances", problems)
    display = read(conf, group, "display", problems)
    ramfb = read(conf, group, "ramfb", problems)
    if ramfb and not display:
        problems.append(
            exception.ConfigProblem(
                option(group, "ramfb"),
                True,
                "needs display = true (libvirt shows the boot "
                "framebuffer through the vGPU's display)",
            )
        )
    for problem in problems:
        if problem.value is None and problem.option.startswith(f"[{group}]"):
            problem.value = raw_value(conf, group, problem.option.split("] ")[1])
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
    for raw in read(conf, group, "device_ids", problems) or []:
        try:
            device_id = fleet.parse_device_id(raw)
        except ValueError:
            problems.append(
                exception.ConfigProblem(
                    option(group, "device_ids"),
                    raw,
                    "not a PCI vendor:device id (e.g. 10de:1eb8, see lspci -nn)",
                )
            )
            continue
        if device_id not in found:
            found.append(device_id)
    return tuple(found)
