"""What the privileged helper works under: its own root-owned file, and
from nova-compute's files only the options its write policy enforces.

``vgpu-manage install-units`` writes the helper's file
(:data:`HELPER_CONF`, root's, 0644) and the sudo rule gives it as the
helper's only ``--config-file``.  It names nova-compute's configuration
files and directories, and on test hosts only, the fake-host options::

    [nova]
    config_files = /etc/nova/nova.conf
    config_dirs =
    [vgpu]
    test_only_fake_sysfs_root = false
    test_only_fake_nvml_host =

The helper refuses its file when another user than root could change it or
a directory above it.  From nova-compute's files (:mod:`.conf_data`, as
data) it keeps ``[vgpu] sysfs_root``, ``[devices]`` and ``[mdev_<type>]``:
whoever can write them can choose among the writes the policy allows for
this host's GPUs, nothing more.  Whether a root that is not sysfs is
accepted comes from the helper's own file alone.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from oslo_config import cfg

from vgpu_driver import exception
from vgpu_driver import root_only
from vgpu_driver.conf import devices as devices_conf
from vgpu_driver.conf import vgpu as vgpu_conf
from vgpu_driver.privsep import conf_data

if TYPE_CHECKING:
    from collections.abc import Iterable

HELPER_CONF = "/etc/vgpu-driver/privsep.conf"

_OWN = {
    "nova": ("config_files", "config_dirs"),
    "vgpu": ("test_only_fake_sysfs_root", "test_only_fake_nvml_host"),
}


def _names(opts: Iterable[cfg.Opt]) -> set[str]:
    found: set[str] = set()
    for opt in opts:
        found.add(opt.name)
        found.update(d.name for d in opt.deprecated_opts if d.name)
    return found


_DEVICES_KEYS = _names(devices_conf.devices_opts)
_TYPE_KEYS = _names(devices_conf.mdev_type_opts("x"))


def nova_key(section: str, key: str) -> bool:
    """Whether the helper takes ``[section] key`` from nova's files."""
    if section == "vgpu":
        return key == "sysfs_root"
    if section == "devices":
        return key in _DEVICES_KEYS
    # [vgpu_<type>] is the old name of [mdev_<type>].
    return section.startswith(("mdev_", "vgpu_")) and key in _TYPE_KEYS


def _own(path: str) -> tuple[list[str], list[str], dict[str, str]]:
    changeable = root_only.problems(path)
    if changeable:
        raise exception.ConfigDataRefused(path=path, line=0, reason="; ".join(changeable))
    own = conf_data.read(path)
    for section, entries in own.items():
        for key in entries:
            if key not in _OWN.get(section, ()):
                raise exception.ConfigDataRefused(
                    path=path,
                    line=0,
                    reason=f"[{section}] {key} is not an option of the privileged helper",
                )
    nova = own.get("nova", {})
    files, dirs = (
        [p.strip() for p in nova.get(key, "").split(",") if p.strip()]
        for key in ("config_files", "config_dirs")
    )
    if not files:
        raise exception.ConfigDataRefused(
            path=path, line=0, reason="[nova] config_files names no file"
        )
    return files, dirs, own.get("vgpu", {})


def load(path: str) -> cfg.ConfigOpts:
    """A private ``ConfigOpts`` with our options, holding the values of the
    helper's file ``path`` and the policy's options of nova's files."""
    files, dirs, fake = _own(path)
    sections = conf_data.merged(conf_data.conf_files(files, dirs), nova_key)
    sections.setdefault("vgpu", {}).update(fake)
    conf = cfg.ConfigOpts()
    vgpu_conf.register_opts(conf)
    devices_conf.register_opts(conf)
    # oslo.config reads files by path: an anonymous file in memory, so that
    # nothing but the kept values reaches it and nothing is written.
    fd = os.memfd_create("vgpu-driver-privsep.conf", os.MFD_CLOEXEC)
    try:
        os.write(fd, conf_data.as_ini(sections).encode("utf-8"))
        conf(
            args=["--config-file", f"/proc/self/fd/{fd}"],
            project="vgpu-driver",
            default_config_files=[],
            default_config_dirs=[],
            use_env=False,
        )
    finally:
        os.close(fd)
    return conf
