"""Enabling and disabling planned SR-IOV VFs through NVIDIA's ``sriov-manage``.

The ``nvidia`` driver refuses a direct ``sriov_numvfs`` write, so each
planned :class:`~vgpu_driver.sriov_plan.Step` runs NVIDIA's script
(:mod:`vgpu_driver.sriov_manage`), once per GPU, and the VF count read
back tells whether it did anything (the script exits 0 where it skips a
GPU).  Enabling then waits for the VFs (:mod:`vgpu_driver.sriov_wait`).
Apart from planning because this is the only part that writes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from collections.abc import Sequence
from typing import TYPE_CHECKING

from vgpu_driver import exception
from vgpu_driver.sriov_functions import PhysicalFunction
from vgpu_driver.sriov_functions import function
from vgpu_driver.sriov_wait import Progress
from vgpu_driver.sriov_wait import Wake
from vgpu_driver.sriov_wait import wait_ready

if TYPE_CHECKING:
    from vgpu_driver.sriov_manage import SriovManage
    from vgpu_driver.sriov_plan import Step
    from vgpu_driver.sysfs.base import SysfsReader


def _vf_count_is(
    host: SysfsReader, script: SriovManage, flag: str, address: str, printed: str, wanted_on: bool
) -> PhysicalFunction:
    """NVIDIA's script exits 0 where it skips a GPU: the count read back
    tells; the PF as it is now."""
    pf = function(host, address, "enable" if wanted_on else "disable")
    if bool(pf.numvfs) != wanted_on:
        state = f"{pf.numvfs} VFs" if pf.numvfs else "no VF"
        raise exception.SriovManageFailed(
            command=script.command(flag, address),
            why=f"exited 0 but GPU {address} still has {state}; it printed: {printed}",
        )
    return pf


def enable(
    host: SysfsReader,
    steps: Sequence[Step],
    timeout: float,
    script: SriovManage,
    wake: Wake | None = None,
    progress: Progress | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[PhysicalFunction]:
    """Run NVIDIA's script (``script``, a :class:`~vgpu_driver.sriov_manage.SriovManage`)
    for each planned GPU, then wait until every VF offers its types.

    ``wake(seconds)`` blocks at most that long (a udev monitor may return
    as soon as a device changes); ``progress(text)`` is told each step.
    """
    say = progress or (lambda text: None)
    first = next((step.address for step in steps if step.action == "enable"), None)
    if first:
        script.check("-e", first)  # before the first GPU: a missing script changes nothing
    for step in steps:
        pf = function(host, step.address, "enable")
        if step.action == "enable" and not pf.numvfs:  # nobody enabled them meanwhile
            printed = script.enable(step.address)
            pf = _vf_count_is(host, script, "-e", step.address, printed, True)
            say(
                f"{step.address}: enabled {pf.numvfs} VFs ({script.command('-e', pf.address)}"
                "); waiting for their mdev types"
            )
        elif step.action == "enable":
            say(f"{step.address}: enabled meanwhile by someone else ({pf.numvfs} VFs), left alone")
        else:
            say(f"{step.address}: {step.detail}")
    return wait_ready(host, [s.address for s in steps], timeout, wake, progress, clock)


def disable(host: SysfsReader, step: Step, script: SriovManage) -> None:
    """Run NVIDIA's script for a planned disable (``-d``)."""
    if step.action == "disable":
        printed = script.disable(step.address)
        _vf_count_is(host, script, "-d", step.address, printed, False)
