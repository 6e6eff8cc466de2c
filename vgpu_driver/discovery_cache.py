"""Discovery that re-reads only the GPUs udev says changed.

The periodic inventory refresh used to read every type of every parent of
every GPU (four attributes per type), though between two refreshes usually
nothing, or one GPU, changed.  :class:`CachedDiscovery` keeps what it read
per parent and per GPU and, told by a :mod:`vgpu_driver.sysfs.udev` monitor
which parents and GPUs changed, reads only those again.  What it still
reads every time is cheap and catches what udev does not announce: the
names under ``class/mdev_bus`` (a parent registered or gone) and under
``bus/mdev/devices`` (the links of new mdevs, and of those on parents
events named, are read), and NVIDIA's vendor-VFIO VFs (a VF's vGPU type
changes without a uevent).

An event can come before the change it announces is whole: the kernel
sends an mdev's ``remove`` uevent from ``device_del``, and gives its
instance back to the type's ``available_instances`` only in the release
after the last reference is put (``mdev_device_release``,
``drivers/vfio/mdev/mdev_core.c``), with no event of its own.  A read in
between finds the mdev gone and its room not back.  So what an event named
is read at the snapshot that took the event and once more at the next one;
and when one of the driver's own removals returns (the room is back by
then), its GPU is read again at the next snapshot (:meth:`vgpu_removed`).

A full discovery is made instead whenever the monitor cannot vouch for its
changes (not running, events lost to an overflow) and at least every
``full_every`` seconds, so a missed event costs at most that long.  The
result is always what :func:`vgpu_driver.discovery.discover` would return.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from collections.abc import Container
from collections.abc import Iterable
from typing import TYPE_CHECKING

from oslo_log import log as logging

from vgpu_driver import discovery
from vgpu_driver import names
from vgpu_driver.sysfs import changes as changes_mod

if TYPE_CHECKING:
    from vgpu_driver.host_snapshot import HostSnapshot
    from vgpu_driver.sysfs.base import MdevInfo
    from vgpu_driver.sysfs.base import ParentInfo
    from vgpu_driver.sysfs.base import PciDeviceInfo
    from vgpu_driver.sysfs.base import VendorVfioInfo
    from vgpu_driver.sysfs.changes import Changes
    from vgpu_driver.sysfs.changes import Polling
    from vgpu_driver.sysfs.linux import LinuxSysfs
    from vgpu_driver.sysfs.udev import UdevMonitor

LOG = logging.getLogger(__name__)


class CachedDiscovery:
    def __init__(
        self,
        host: LinuxSysfs,
        monitor: UdevMonitor | Polling,
        full_every: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        wanted: Container[str] | None = None,
    ) -> None:
        """``monitor``: a :mod:`~vgpu_driver.sysfs.udev` monitor (or its
        polling stand-in, whose changes always say "everything");
        ``wanted``: the type ids whose attributes are read (all when None),
        as :func:`vgpu_driver.discovery.discover` takes them."""
        self.host = host
        self.wanted = wanted
        self.monitor = monitor
        self.full_every = full_every
        self.clock = clock
        self._snapshot: HostSnapshot | None = None
        self._full_at: float | None = None
        self._parents: dict[str, ParentInfo] = {}  # by parent name
        self._gpu_of: dict[str, str] = {}  # parent name -> GPU key
        self._pci: dict[str, PciDeviceInfo | None] = {}  # by GPU key
        self._vendor: dict[str, str] = {}  # vendor-VFIO VF address -> GPU key
        self._mdevs: dict[str, MdevInfo] = {}  # by uuid
        # PciDeviceInfo of each SR-IOV physical function.
        self._sriov_pfs: list[PciDeviceInfo] = []
        # The changes the last snapshot took, read again at the next one.
        self._taken: Changes = changes_mod.Changes()
        # What the driver's own removals changed since, for the next one.
        self._removed: Changes = changes_mod.Changes()
        # The parents of the mdevs gone since the last full read, by uuid.
        self._gone: dict[str, str] = {}
        #: How the last snapshot was made: "full" or "partial" (for logs, tests).
        self.last: str | None = None
        # The periodic update and the host reconciler both read through it.
        self._lock = threading.Lock()

    def _can_read_partially(self) -> bool:
        return all(
            hasattr(self.host, attr)
            for attr in ("parent_names", "read_parent", "mdev_uuids", "read_mdev")
        )

    def snapshot(self) -> HostSnapshot:
        """The host's snapshot, read in full or only where it changed."""
        with self._lock:
            return self._snapshot_now()

    def vgpu_removed(self, vgpu: str) -> None:
        """One of the driver's removals of ``vgpu`` returned: the next
        snapshot reads its GPU again, its room being back only now (a
        snapshot may have taken the removal's event before).  A vGPU this
        cache never saw makes that snapshot a full read."""
        with self._lock:
            if names.is_vf_vgpu_id(vgpu):
                parent: str | None = vgpu
            else:
                mdev = self._mdevs.get(vgpu)
                parent = mdev.parent if mdev is not None else self._gone.pop(vgpu, None)
            self._removed |= (
                changes_mod.Changes(parents=frozenset({parent}))
                if parent is not None
                else changes_mod.EVERYTHING
            )

    def _snapshot_now(self) -> HostSnapshot:
        taken = self.monitor.take_changes()
        changes = taken | self._taken | self._removed
        self._taken, self._removed = taken, changes_mod.Changes()
        now = self.clock()
        if (
            changes.everything
            or self._snapshot is None
            or not self._can_read_partially()
            or self._full_at is None
            or now - self._full_at >= self.full_every
        ):
            return self._read_all(now)
        return self._read_changed(changes)

    # -- full ---------------------------------------------------------------------------

    def _read_all(self, now: float) -> HostSnapshot:
        host = self.host
        mdevs = tuple(host.list_mdevs())
        infos = host.list_parents(self.wanted)
        vendor_vfs = host.list_vendor_vfio(discovery.parent_names(infos))
        self._gone = {}
        self._keep(mdevs)
        self._parents = {info.name: info for info in infos}
        self._gpu_of = {info.name: discovery.gpu_key(host, info) for info in infos}
        self._vendor = {str(vf.address): str(vf.physfn or vf.address) for vf in vendor_vfs}
        self._pci = {}
        self._sriov_pfs = host.list_sriov_pfs(discovery.known_vfs(infos, vendor_vfs))
        self._snapshot = discovery.assemble(
            host,
            mdevs,
            infos,
            vendor_vfs,
            self._pci_device,
            self._sriov_pfs,
            host.vgpu_manager_version(),
        )
        self._full_at = now
        self.last = "full"
        return self._snapshot

    def _pci_device(self, key: str) -> PciDeviceInfo | None:
        if key not in self._pci:
            self._pci[key] = self.host.pci_device(key)
        return self._pci[key]

    # -- partial ------------------------------------------------------------------------

    def _read_changed(self, changes: Changes) -> HostSnapshot:
        host = self.host
        known = set(self._parents) | set(self._vendor)
        mdevs = self._read_mdevs(changes)
        listed = host.parent_names()
        present = set(listed)
        dirty = set(changes.gpus)
        # Parents that came, went or were named by an event: their GPUs.
        for name in present.symmetric_difference(self._parents) | changes.parents:
            if name in self._vendor:
                dirty.add(self._vendor[name])
            if name in self._gpu_of:
                dirty.add(self._gpu_of[name])
            elif name in present:
                info = self._reread(name)
                if info is not None:
                    dirty.add(self._gpu_of[name])
        for name in list(self._parents):
            if name not in present or self._gpu_of.get(name) in dirty:
                self._forget(name)
        for name in listed:
            if name not in self._parents:
                self._reread(name)
        for key in dirty:
            self._pci.pop(key, None)
        vendor_vfs = self._vendor_vfs(changes)
        self._sriov_pfs = self._sriov_functions(known, present, changes)
        infos = [self._parents[name] for name in listed if name in self._parents]
        self._snapshot = discovery.assemble(
            host,
            mdevs,
            infos,
            vendor_vfs,
            self._pci_device,
            self._sriov_pfs,
            host.vgpu_manager_version(),
        )
        self.last = "partial"
        if dirty:
            LOG.debug("Re-read GPUs %s", ", ".join(sorted(dirty)))
        return self._snapshot

    def _sriov_functions(
        self, known: set[str], present: set[str], changes: Changes
    ) -> list[PciDeviceInfo]:
        """The SR-IOV physical functions, listed again only when VFs or GPUs
        came or went (their list, and their VF counts, can then differ):
        parents or vendor-VFIO VFs other than before, or an event on a device
        that was neither.  An mdev created or removed on a known parent
        changes none of them."""
        if present | set(self._vendor) != known or changes.parents - known:
            return self.host.list_sriov_pfs()
        return self._sriov_pfs

    def _read_mdevs(self, changes: Changes) -> tuple[MdevInfo, ...]:
        """Every mdev, its links read again only if new or on a parent an
        event named (an mdev's parent and type change only by a remove and
        a create, each announced)."""
        found: dict[str, MdevInfo] = {}
        for uuid in self.host.mdev_uuids():
            mdev = self._mdevs.get(uuid)
            if mdev is None or mdev.parent in changes.parents:
                mdev = self.host.read_mdev(uuid)
            if mdev is not None:
                found[uuid] = mdev
        self._keep(found.values())
        return tuple(found.values())

    def _keep(self, mdevs: Iterable[MdevInfo]) -> None:
        """``mdevs`` as the ones there are; the parents of those gone kept
        for :meth:`vgpu_removed`."""
        found = {mdev.uuid: mdev for mdev in mdevs}
        for uuid in self._mdevs.keys() - found.keys():
            self._gone[uuid] = self._mdevs[uuid].parent
        self._mdevs = found

    def _reread(self, name: str) -> ParentInfo | None:
        info = self.host.read_parent(name, self.wanted)
        if info is None:
            self._forget(name)
            return None
        self._parents[name] = info
        self._gpu_of[name] = discovery.gpu_key(self.host, info)
        return info

    def _forget(self, name: str) -> None:
        self._parents.pop(name, None)
        self._gpu_of.pop(name, None)

    def _vendor_vfs(self, changes: Changes) -> list[VendorVfioInfo]:
        """Every known vendor-VFIO VF read again, and any PCI device an event
        named that turns out to be one (a VF just enabled)."""
        found: list[VendorVfioInfo] = []
        candidates = set(self._vendor) | (changes.parents - set(self._parents))
        for address in sorted(candidates):
            vf = self.host.vendor_vf(address) if names.is_pci_address(address) else None
            if vf is not None:
                found.append(vf)
        self._vendor = {str(vf.address): str(vf.physfn or vf.address) for vf in found}
        return found
