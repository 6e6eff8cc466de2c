"""The privsep contexts and the configuration their privileged side works under.

nova-compute starts each daemon as ``sudo <scripts>/vgpu-privsep-helper
--config-file /etc/vgpu-driver/privsep.conf --privsep_context <context>
--privsep_sock_path <socket>`` (:mod:`.helper`), unless ``helper_command``
says otherwise: an absolute path, whatever nova's root helper is, and a
root-owned file, never nova-compute's own files.  The configuration the
privileged side obeys is fixed by :func:`fix_configuration`: in the daemon,
what :mod:`.helper_conf` read; in-process (``vgpu-manage`` as root), the
CLI's own.  A privileged side without one (a daemon some other helper
started) writes nothing.
"""

from __future__ import annotations

import os
import sysconfig
from typing import Any

from oslo_config import cfg
from oslo_privsep import capabilities
from oslo_privsep import priv_context

from vgpu_driver import exception
from vgpu_driver.conf import devices as devices_conf
from vgpu_driver.conf import vgpu as vgpu_conf
from vgpu_driver.privsep import helper_conf

HELPER = "vgpu-privsep-helper"


class Context(priv_context.PrivContext):
    """A context whose default command runs our helper with its own file."""

    def helper_command(self, sockpath: str) -> list[str]:
        if self.conf.helper_command or self.pypath is None:
            return super().helper_command(sockpath)
        return [
            "sudo",
            os.path.join(sysconfig.get_path("scripts"), HELPER),
            "--config-file",
            helper_conf.HELPER_CONF,
            "--privsep_context",
            self.pypath,
            "--privsep_sock_path",
            sockpath,
        ]


sysfs_writer = Context(
    "vgpu_driver",
    cfg_section="vgpu_driver_sysfs_writer",
    pypath="vgpu_driver.privsep.sysfs_writer",
    capabilities=[capabilities.CAP_DAC_OVERRIDE],
)

# NVIDIA's kernel driver lets only a caller with CAP_SYS_ADMIN change a GPU's
# settings (its os_is_administrator() is capable(CAP_SYS_ADMIN)), and NVML's
# vGPU mode switch is one: a second daemon holds that capability, runs the
# one NVML entry point and writes no file.  It is started only on a host
# that switches a GPU's mode.
gpu_admin = Context(
    "vgpu_driver",
    cfg_section="vgpu_driver_gpu_admin",
    pypath="vgpu_driver.privsep.gpu_admin",
    capabilities=[capabilities.CAP_SYS_ADMIN],
)
CONTEXTS = (sysfs_writer, gpu_admin)

# What this process's privileged side has fixed: "conf", and the things read
# from it once ("policy"); "refuse_writes" on a caller that may not write.
state: dict[str, Any] = {}


def fix_configuration(conf: cfg.ConfigOpts | None) -> None:
    """``conf`` from now on (None: none, until fixed again)."""
    state.pop("policy", None)
    state.pop("root", None)
    if conf is None:
        state.pop("conf", None)
    else:
        state["conf"] = conf


def configuration() -> cfg.ConfigOpts:
    """The configuration the privileged side obeys, our options registered."""
    conf: cfg.ConfigOpts | None = state.get("conf")
    if conf is None:
        raise exception.PrivilegedWriteRefused(
            "sysfs",
            f"this privileged side has no configuration of its own (only {HELPER} "
            "or vgpu-manage run as root give it one)",
        )
    for group, option, module in (
        ("vgpu", "sysfs_root", vgpu_conf),
        ("devices", "enabled_mdev_types", devices_conf),
    ):
        try:
            conf[group][option]
        except (cfg.NoSuchOptError, cfg.NoSuchGroupError, KeyError):
            module.register_opts(conf)
    return conf
