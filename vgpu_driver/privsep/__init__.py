"""The privileged side of vgpu-driver: one entry point per sysfs write.

nova-compute does not run as root; creating or removing an mdev or
choosing a vendor vGPU type are writes to root-owned sysfs files,
made by an oslo.privsep daemon holding only ``CAP_DAC_OVERRIDE``
(:data:`sysfs_writer`).  Switching a GPU's vGPU mode is an NVML call that
NVIDIA's driver allows only with ``CAP_SYS_ADMIN``: a second daemon
(:data:`gpu_admin`) holds that capability alone, for that one call, and
is started only when a mode is switched.  A daemon is sent names, never
paths; on its side (:mod:`.entrypoints`) it validates them, opens every
path by directory fd beneath a sysfs root of its own configuration
(:mod:`.beneath`) and writes only what that configuration enables
(:mod:`.policy`).  A ``vgpu-manage``
that runs as root runs the entry points in-process under its own
configuration; one that does not is refused every write
(:class:`~vgpu_driver.exception.WritesNeedRoot`), since a daemon it started
would read nova-compute's files, not the ones it was given.

This module is the caller's side.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING
from typing import Any

from oslo_privsep import daemon

from vgpu_driver import exception
from vgpu_driver.privsep import context
from vgpu_driver.privsep.entrypoints import create_mdev
from vgpu_driver.privsep.entrypoints import remove_mdev
from vgpu_driver.privsep.entrypoints import set_heterogeneous_mode
from vgpu_driver.privsep.entrypoints import set_vgpu_type

if TYPE_CHECKING:
    from collections.abc import Callable

    from oslo_config import cfg

__all__ = [
    "call",
    "create_mdev",
    "ensure_started",
    "gpu_admin",
    "refuse_writes",
    "remove_mdev",
    "run_in_process",
    "run_in_process_when_root",
    "set_heterogeneous_mode",
    "set_vgpu_type",
    "sysfs_writer",
    "use_daemon",
]

# oslo.privsep finds the contexts by these names in the daemons it starts
# ('--privsep_context vgpu_driver.privsep.sysfs_writer', '... .gpu_admin').
sysfs_writer = context.sysfs_writer
gpu_admin = context.gpu_admin

_ENTRY_POINTS: dict[str, Callable[..., Any]] = {
    "create_mdev": create_mdev,
    "remove_mdev": remove_mdev,
    "set_vgpu_type": set_vgpu_type,
    "set_heterogeneous_mode": set_heterogeneous_mode,
}
_CONTEXT_OF = {"set_heterogeneous_mode": gpu_admin}


def run_in_process_when_root(conf: cfg.ConfigOpts) -> None:
    """The CLI's choice: write in-process under ``conf`` when root, else refuse
    every write (a daemon would not read the files the CLI was given)."""
    if os.geteuid() == 0:
        run_in_process(conf)
    else:
        refuse_writes()


def run_in_process(conf: cfg.ConfigOpts) -> None:
    """Run the entry points here, ``conf`` fixing the root and the policy."""
    for each in context.CONTEXTS:
        each.set_client_mode(False)
    context.fix_configuration(conf)


def refuse_writes() -> None:
    """Every write is refused, typed, before anything is opened."""
    use_daemon()
    context.state["refuse_writes"] = os.geteuid()


def use_daemon() -> None:
    """Back to the default: every call goes to a privsep daemon."""
    for each in context.CONTEXTS:
        each.set_client_mode(True)
    context.fix_configuration(None)
    context.state.pop("refuse_writes", None)


def ensure_started(privileged: context.Context = sysfs_writer) -> None:
    """Start the daemon now, so that failing to start is not a device error."""
    if not privileged.client_mode or privileged.channel is not None:
        return
    try:
        privileged.start()
    except (OSError, daemon.FailedToDropPrivileges) as exc:
        raise exception.PrivilegedHelperUnavailable(reason=str(exc)) from exc


def call(entry_point: str, *args: object) -> Any:
    """Run one entry point by name, starting the daemon first."""
    if "refuse_writes" in context.state:
        raise exception.WritesNeedRoot(f"{entry_point}{args!r}", context.state["refuse_writes"])
    ensure_started(_CONTEXT_OF.get(entry_point, sysfs_writer))
    return _ENTRY_POINTS[entry_point](*args)
