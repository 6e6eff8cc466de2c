"""SR-IOV VF enablement of NVIDIA GPUs (A100 and later).

After a reboot such a GPU has no VF until NVIDIA's ``sriov-manage`` enables
them; until then it has no mdev parent, offers no type and gets no
provider.  This module lists those physical functions, enables their VFs
(``sriov_numvfs = sriov_totalvfs``) by running NVIDIA's script
(:mod:`vgpu_driver.sriov_manage`: the ``nvidia`` driver refuses a direct
write) and waits, bounded, until every VF offers its mdev types, or
disables them when nothing uses them.

Only NVIDIA display or 3D controllers are touched: any other address (a
network card with SR-IOV, nothing at all) is refused before any write.  The
wait polls the host through a ``wake(seconds)`` callable (default: sleep), so
a udev monitor can wake it as soon as a device appears instead.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import names

if TYPE_CHECKING:
    from vgpu_driver.claims import Claim
    from vgpu_driver.discovery import HostSnapshot
    from vgpu_driver.discovery import Parent
    from vgpu_driver.discovery import PhysicalGPU
    from vgpu_driver.inventory import ProviderTree
    from vgpu_driver.sriov_manage import SriovManage
    from vgpu_driver.sysfs.base import PciDeviceInfo
    from vgpu_driver.sysfs.base import SysfsReader
    from vgpu_driver.sysfs.changes import Polling
    from vgpu_driver.sysfs.udev import UdevMonitor

# ``wake(seconds)``: blocks at most that long; ``progress(text)``: told each step.
Wake = Callable[[float], object]
Progress = Callable[[str], object]

STATE_OFF = "off"
STATE_ENABLED = "enabled"
STATE_PARTIAL = "partial"
POLL_INTERVAL = 0.2
# With udev, a wait ends at the VFs' events; it still re-reads at least this
# often, for a vendor driver that registers its types without an event.
EVENT_RECHECK = 2.0


@dataclasses.dataclass(frozen=True)
class VirtualFunction:
    address: str
    # The mdev types it offers (vendor-VFIO: the types it can still take).
    mdev_types: tuple[str, ...]
    # Whether it is an mdev parent or has NVIDIA's vendor-VFIO files yet.
    ready: bool
    # mdev UUIDs on it, and the vendor-VFIO vGPU type set on it (if any).
    mdevs: tuple[str, ...] = ()
    vgpu_type: str | None = None

    @property
    def busy(self) -> bool:
        return bool(self.mdevs) or self.vgpu_type is not None


@dataclasses.dataclass(frozen=True)
class PhysicalFunction:
    """An NVIDIA GPU that can have VFs, and what its VFs offer now."""

    address: str
    vendor: str | None
    device: str | None
    pci_class: str | None
    totalvfs: int
    numvfs: int
    vfs: tuple[VirtualFunction, ...]

    @property
    def state(self) -> str:
        """``off`` (no VF), ``enabled`` (every VF ready), ``partial`` (VFs
        enabled, some not registered by the vendor driver yet)."""
        if not self.numvfs:
            return STATE_OFF
        ready = sum(1 for vf in self.vfs if vf.ready)
        return STATE_ENABLED if ready == self.numvfs else STATE_PARTIAL

    @property
    def mdev_types(self) -> tuple[str, ...]:
        return tuple(sorted({t for vf in self.vfs for t in vf.mdev_types}))

    @property
    def ready_vfs(self) -> int:
        return sum(1 for vf in self.vfs if vf.ready)


def _vf(address: object, parent: Parent | None) -> VirtualFunction:
    if parent is None:
        return VirtualFunction(str(address), (), False)
    return VirtualFunction(
        str(address),
        parent.type_ids,
        True,
        tuple(m.uuid for m in parent.mdevs),
        parent.current_vgpu_type,
    )


def _function(pci: PciDeviceInfo, gpu: PhysicalGPU | None) -> PhysicalFunction:
    parents = {p.name: p for p in gpu.parents} if gpu else {}
    return PhysicalFunction(
        address=str(pci.address),
        vendor=pci.vendor,
        device=pci.device,
        pci_class=pci.pci_class,
        totalvfs=pci.sriov_totalvfs or 0,
        numvfs=pci.sriov_numvfs or 0,
        vfs=tuple(_vf(vf, parents.get(str(vf))) for vf in pci.virtfns),
    )


def list_functions(host: SysfsReader) -> list[PhysicalFunction]:
    """Every NVIDIA SR-IOV GPU of the host, by address."""
    return functions_in(discovery.discover(host))


def functions_in(snapshot: HostSnapshot) -> list[PhysicalFunction]:
    """Every NVIDIA SR-IOV GPU of an already read snapshot, by address.

    Discovery keeps each such GPU (with its VFs off too) and its PCI facts,
    so a view that has a snapshot need not read sysfs again.
    """
    found = [_function(gpu.pci, gpu) for gpu in snapshot.gpus if discovery.is_sriov_gpu(gpu.pci)]
    return sorted(found, key=lambda f: f.address)


def function(host: SysfsReader, address: object, action: str) -> PhysicalFunction:
    """The GPU at ``address``, or SriovRefused naming why it is not one.

    ``address`` is typed by an operator: blanks around it are dropped here,
    the check itself refuses them."""
    try:
        address = str(names.parse_pci_address(str(address).strip()))
    except exception.InvalidSysfsName:
        raise exception.SriovRefused(
            action=action, address=address, reason="not a PCI address (dddd:bb:ss.f)"
        ) from None
    pci = host.pci_device(address)

    def refuse(why: str) -> exception.SriovRefused:
        return exception.SriovRefused(action=action, address=address, reason=why)

    if pci is None:
        raise refuse("no PCI device at this address on this host (see vgpu-manage sriov status)")
    if pci.vendor != discovery.NVIDIA_VENDOR:
        raise refuse(
            f"vendor {pci.vendor} is not NVIDIA ({discovery.NVIDIA_VENDOR}); only "
            "NVIDIA GPUs are managed"
        )
    if not discovery.is_sriov_gpu(pci):
        if not pci.sriov_totalvfs:
            raise refuse("it is not an SR-IOV physical function (no sriov_totalvfs)")
        raise refuse(f"PCI class {pci.pci_class} is not a display or 3D controller (0x03...)")
    snapshot = discovery.discover(host)
    return _function(pci, snapshot.gpu(address))


@dataclasses.dataclass(frozen=True)
class Step:
    """What enable or disable did (or would do) on one GPU."""

    address: str
    action: str  # "enable", "disable", "none"
    detail: str


def plan_enable(host: SysfsReader, addresses: Iterable[object]) -> list[Step]:
    """Check every address, then say what enabling would write; no write."""
    steps: dict[str, Step] = {}
    for address in addresses:
        pf = function(host, address, "enable")
        if pf.address in steps:
            continue
        if pf.numvfs:
            steps[pf.address] = Step(
                pf.address,
                "none",
                f"already enabled ({pf.numvfs} of {pf.totalvfs} VFs), left alone",
            )
        else:
            steps[pf.address] = Step(pf.address, "enable", f"sriov_numvfs 0 -> {pf.totalvfs}")
    return list(steps.values())


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


def waker(changes: UdevMonitor | Polling) -> Wake:
    """``wake(seconds)`` for :func:`enable`: on a host udev tells about
    (:mod:`vgpu_driver.sysfs.udev`), woken by the next pci or mdev event;
    elsewhere a short sleep.  Make it before the write, so the write's own
    events are not missed."""
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


def plan_disable(
    host: SysfsReader, address: object, claims: Callable[[], Iterable[Claim]] | None = None
) -> Step:
    """Check that nothing uses the GPU's VFs; the step, or SriovRefused.

    ``claims()`` gives the journal's claims; it is asked only once no VF
    holds a vGPU (a host without vGPUs may have no journal).
    """
    pf = function(host, address, "disable")
    if not pf.numvfs:
        return Step(pf.address, "none", "already off, left alone")
    busy = [vf for vf in pf.vfs if vf.busy]
    if busy:
        used = ", ".join(f"{vf.address} ({', '.join(vf.mdevs) or vf.vgpu_type})" for vf in busy[:3])
        raise exception.SriovRefused(
            action="disable",
            address=pf.address,
            reason=f"{len(busy)} VF(s) hold vGPUs: {used}; remove them first "
            "(vgpu-manage mdev list, orphans reclaim)",
        )
    vf_addresses = {vf.address for vf in pf.vfs}
    claimed = [
        c for c in (claims() if claims else ()) if c.gpu == pf.address or c.parent in vf_addresses
    ]
    if claimed:
        raise exception.SriovRefused(
            action="disable",
            address=pf.address,
            reason=f"the claims journal holds {len(claimed)} claim(s) on it (instance "
            f"{claimed[0].instance_uuid}); see vgpu-manage claims list",
        )
    return Step(pf.address, "disable", f"sriov_numvfs {pf.numvfs} -> 0")


def disable(host: SysfsReader, step: Step, script: SriovManage) -> None:
    """Run NVIDIA's script for a planned disable (``-d``)."""
    if step.action == "disable":
        printed = script.disable(step.address)
        _vf_count_is(host, script, "-d", step.address, printed, False)


class PendingNotices:
    """Logs each configured GPU whose VFs are not there once, not at every
    periodic inventory update; again only if it comes back after being
    served."""

    def __init__(self) -> None:
        self._told: set[str] = set()

    def report(self, tree: ProviderTree, log: Any) -> None:
        reasons = dict(tree.unserved)
        for address in sorted(tree.vfs_pending - self._told):
            log.warning(
                "GPU %s is configured but gets no provider: %s", address, reasons.get(address)
            )
        self._told = (self._told | tree.vfs_pending) & tree.vfs_pending
