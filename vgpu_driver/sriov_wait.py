"""The bounded wait until every VF of an SR-IOV GPU offers its mdev types.

Once NVIDIA's script has enabled the VFs the vendor driver registers them
as mdev parents (or gives them its vendor-VFIO files) a little later; a
GPU counts as ready only when all of them are there.  The wait polls the
host through a ``wake(seconds)`` callable (default: sleep), so a udev
monitor can end it as soon as a device appears instead; apart from enabling
(:mod:`vgpu_driver.sriov_apply`) because how long to wait and what wakes it
are a concern of their own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from collections.abc import Sequence
from typing import TYPE_CHECKING

from vgpu_driver import exception
from vgpu_driver.sriov_functions import STATE_ENABLED
from vgpu_driver.sriov_functions import PhysicalFunction
from vgpu_driver.sriov_functions import function
from vgpu_driver.sriov_functions import list_functions

if TYPE_CHECKING:
    from vgpu_driver.sysfs.base import SysfsReader
    from vgpu_driver.sysfs.changes import Polling
    from vgpu_driver.sysfs.udev import UdevMonitor

# ``wake(seconds)``: blocks at most that long; ``progress(text)``: told each step.
Wake = Callable[[float], object]
Progress = Callable[[str], object]

POLL_INTERVAL = 0.2
# With udev, a wait ends at the VFs' events; it still re-reads at least this
# often, for a vendor driver that registers its types without an event.
EVENT_RECHECK = 2.0


def waker(changes: UdevMonitor | Polling) -> Wake:
    """``wake(seconds)`` for :func:`vgpu_driver.sriov_apply.enable`: on a
    host udev tells about (:mod:`vgpu_driver.sysfs.udev`), woken by the next
    pci or mdev event; elsewhere a short sleep.  Make it before the write,
    so the write's own events are not missed."""
    if not changes.running:
        return lambda seconds: time.sleep(min(POLL_INTERVAL, max(seconds, 0)))
    waiter = changes.waiter()
    return lambda seconds: waiter.wait(min(EVENT_RECHECK, max(seconds, 0)))


def wait_ready(
    host: SysfsReader,
    addresses: Sequence[str],
    timeout: float,
    wake: Wake | None = None,
    progress: Progress | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> list[PhysicalFunction]:
    """Poll until each GPU's VFs all offer mdev types; SriovNotReady if one
    is still not ready after ``timeout`` seconds.  Returns the functions."""
    wake = wake or (lambda seconds: time.sleep(min(POLL_INTERVAL, seconds)))
    started = clock()
    waiting = list(dict.fromkeys(addresses))
    done: dict[str, PhysicalFunction] = {}
    while True:
        for pf in list_functions(host):
            if pf.address in waiting and pf.state == STATE_ENABLED:
                waiting.remove(pf.address)
                done[pf.address] = pf
                if progress:
                    progress(
                        f"{pf.address}: {pf.ready_vfs} VFs ready, offering "
                        f"{len(pf.mdev_types)} mdev type(s) "
                        f"({clock() - started:.1f}s)"
                    )
        remaining = timeout - (clock() - started)
        if not waiting:
            return [done[a] for a in addresses if a in done]
        if remaining <= 0:
            pf = function(host, waiting[0], "enable")
            raise exception.SriovNotReady(
                address=pf.address, waited=timeout, ready=pf.ready_vfs, numvfs=pf.numvfs
            )
        wake(remaining)
