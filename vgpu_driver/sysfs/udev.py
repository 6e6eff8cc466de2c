"""Which GPUs changed, told by udev rather than found by re-reading sysfs.

A :class:`UdevMonitor` listens to udev's broadcasts for the ``pci`` and
``mdev`` subsystems (VFs appearing when the vendor enables SR-IOV, GPUs
bound or unbound, mdevs created or removed by anyone) and keeps, for each
event, the mdev parent it touches and, when sysfs still says, the physical
GPU that parent belongs to.  Two kinds of reader use it:

* the periodic refresh takes :meth:`UdevMonitor.take_changes` and re-reads
  only those GPUs (:mod:`vgpu_driver.discovery_cache`);
* whoever waits for devices to appear (the restore after a reboot, the
  SR-IOV enablement) takes a :meth:`UdevMonitor.waiter` and blocks on its
  ``wait(timeout)``, woken by the first event instead of sleeping.

Where udev cannot be used (no pyudev, no netlink socket, no udev daemon in
this namespace, a sysfs root that is not the kernel's), :func:`start`
returns a :class:`~vgpu_driver.sysfs.changes.Polling` stand-in whose
changes always say "read everything" and whose waiters just sleep: every
caller keeps working, only slower, and the reason is logged once.
"""

from __future__ import annotations

import errno
import os
import select
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any
from typing import cast

from oslo_log import log as logging

from vgpu_driver import names
from vgpu_driver.sysfs import changes
from vgpu_driver.sysfs import linux
from vgpu_driver.sysfs import paths as sysfs_paths

if TYPE_CHECKING:
    from vgpu_driver.sysfs.base import SysfsReader

LOG = logging.getLogger(__name__)

SUBSYSTEMS = ("pci", "mdev")
# Where a running udev daemon keeps its control socket: without a daemon
# nobody broadcasts on udev's group (a container, a minimal chroot).
UDEV_CONTROL = "/run/udev/control"
MODES = ("auto", "udev", "off")
_READ_CHUNK = 256
_SETTLE_SECONDS = 0.5
_SETTLE_STEP = 0.01


class _Waiter:
    """``wait(timeout)``: True as soon as something changed since the last
    return (or since the waiter was made), False after ``timeout``."""

    def __init__(self, monitor: UdevMonitor) -> None:
        self._monitor = monitor
        self._seen = monitor.generation

    def wait(self, timeout: float) -> bool:
        self._seen, changed = self._monitor.wait_after(self._seen, timeout)
        return changed


def parse_event(
    root: str, subsystem: str, devpath: str, properties: Mapping[str, str]
) -> tuple[str, str | None] | None:
    """``(parent, gpu)`` an event touches; None for devices that are no
    mdev parent candidate (a PCI bridge is still a PCI device: kept).

    ``devpath`` is sysfs-relative (``/devices/pci0000:41/0000:41:00.4``);
    ``gpu`` is read from the device's ``physfn`` link under ``root`` while
    the device exists, else None (the caller knows removed VFs' GPUs).
    """
    parts = [p for p in devpath.split("/") if p]
    if not parts:
        return None
    if subsystem == "mdev":
        if len(parts) < 2 or not names.is_mdev_uuid(parts[-1]):
            return None
        parent_dir = os.path.join(root, *parts[:-1])
        return parts[-2], _gpu_of(parent_dir, parts[-2])
    if subsystem == "pci":
        address = properties.get("PCI_SLOT_NAME") or parts[-1]
        if not names.is_pci_address(address):
            return None
        return address, _gpu_of(os.path.join(root, *parts), address)
    return None


def _gpu_of(device_dir: str, name: str) -> str | None:
    """The physical function a PCI device belongs to: its ``physfn``, or
    itself; None when its directory is gone or it is not a PCI device."""
    try:
        target = os.readlink(os.path.join(device_dir, "physfn"))
    except OSError:
        if os.path.isdir(device_dir) and names.is_pci_address(name):
            return name
        return None
    return os.path.basename(target)


def _next_device(monitor: Any) -> Any:
    """The next queued event's device, or None when none is queued.

    pyudev's ``Monitor.poll`` builds a ``select.poll``, which eventlet's
    monkey-patching (nova-compute's, by default) removes from ``select``:
    ask ``select.select`` instead, which both have, then read one event
    from the socket, which libudev made non-blocking.
    """
    ready, _, _ = select.select([monitor], [], [], 0)
    if not ready:
        return None
    return monitor._receive_device()  # noqa: SLF001 - poll's read, without its poll


class UdevMonitor:
    """A pyudev netlink monitor read by a daemon thread."""

    running = True

    def __init__(self, root: str, monitor: Any) -> None:
        self.root = root
        self._monitor = monitor
        self._cond = threading.Condition()
        self._parents: set[str] = set()
        self._gpus: set[str] = set()
        self._lost = False
        # Held by the reader while it takes events out of the socket.
        self._busy = threading.Lock()
        self.generation = 0
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="vgpu-udev", daemon=True)

    @classmethod
    def open(cls, root: str, source: str = "udev") -> UdevMonitor:
        """Listen on ``source``'s netlink group; raises OSError/ImportError."""
        import pyudev

        context = pyudev.Context()
        monitor = pyudev.Monitor.from_netlink(context, source=source)
        for subsystem in SUBSYSTEMS:
            monitor.filter_by(subsystem)
        monitor.start()
        watching = cls(root, monitor)
        watching._thread.start()
        return watching

    # -- the reader thread ----------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                ready, _, _ = select.select([self._monitor, self._wake_r], [], [])
                if self._wake_r in ready:
                    return
                with self._busy:
                    self._drain()
        except Exception:  # noqa: BLE001 - a dead reader must not look alive
            LOG.exception("The udev monitor stopped; GPUs are read in full from now on")
        finally:
            with self._cond:
                self.running = False
                self._lost = True
                self.generation += 1
                self._cond.notify_all()

    def _drain(self) -> None:
        """Record every queued event; an overflow means some were lost."""
        for _ in range(_READ_CHUNK):
            try:
                device = _next_device(self._monitor)
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                LOG.warning("udev events were lost (socket overflow): full re-read")
                self._record(lost=True)
                continue
            if device is None:
                return
            touched = parse_event(
                self.root, device.subsystem or "", device.device_path, dict(device.properties)
            )
            LOG.debug("udev %s %s -> %s", device.action, device.device_path, touched)
            if touched is not None:
                self._record(*touched)

    def _record(
        self, parent: str | None = None, gpu: str | None = None, lost: bool = False
    ) -> None:
        with self._cond:
            if parent:
                self._parents.add(parent)
            if gpu:
                self._gpus.add(gpu)
            self._lost |= lost
            self.generation += 1
            self._cond.notify_all()

    # -- readers ------------------------------------------------------------------

    def _settle(self, limit: float = _SETTLE_SECONDS) -> None:
        """Let the reader record what the socket already holds: a change our
        own write caused is queued by the time the write returned."""
        deadline = time.monotonic() + limit
        while self.running and time.monotonic() < deadline:
            with self._busy:
                ready, _, _ = select.select([self._monitor], [], [], 0)
            if not ready:
                return
            time.sleep(_SETTLE_STEP)

    def take_changes(self) -> changes.Changes:
        """What changed since the last call (everything if events were lost)."""
        self._settle()
        with self._cond:
            if self._lost or not self.running:
                found = changes.EVERYTHING
            else:
                found = changes.Changes(
                    parents=frozenset(self._parents), gpus=frozenset(self._gpus)
                )
            self._parents, self._gpus = set(), set()
            self._lost = not self.running
            return found

    def wait_after(self, seen: int, timeout: float) -> tuple[int, bool]:
        """``(generation, changed)``: blocks until the generation passes
        ``seen`` or ``timeout`` seconds went by."""
        with self._cond:
            changed = self._cond.wait_for(lambda: self.generation != seen, max(timeout, 0))
            return self.generation, changed

    def waiter(self) -> _Waiter:
        return _Waiter(self)

    def stop(self) -> None:
        """End the reader thread and close its wake-up pipe, once.

        Two callers may stop it at once (a service's shutdown thread and its
        owner): only the first closes the pipe, so no number is
        ever closed twice (the second close would hit whatever file took the
        number since).  A reader that has not ended keeps its end open.  The
        lock is taken for good: stopping happens once."""
        if not self._stopping.acquire(blocking=False):
            return  # stopped, or being stopped, by someone else
        if self._thread.is_alive():
            os.write(self._wake_w, b"x")
            self._thread.join(5)
        os.close(self._wake_w)
        if self._thread.is_alive():
            LOG.warning("The udev reader did not end within 5 s; its pipe is left open")
            return
        os.close(self._wake_r)


def unusable_because(host: object, mode: str) -> str | None:
    """Why udev cannot tell about ``host`` in ``mode``; None when it can."""
    if mode == "off":
        return "[vgpu] hotplug_events is off"
    if not isinstance(host, linux.LinuxSysfs):
        return f"{host!r} reads no sysfs tree"
    if mode == "auto":
        if (
            type(host) is not linux.LinuxSysfs
            or os.path.realpath(host.paths.root) != sysfs_paths.DEFAULT_ROOT
        ):
            return f"sysfs root {host.paths.root} is not the kernel's"
        if not os.path.exists(UDEV_CONTROL):
            return f"no udev daemon here ({UDEV_CONTROL} is absent)"
    return None


_logged: set[str] = set()


def start(host: SysfsReader, mode: str = "auto") -> UdevMonitor | changes.Polling:
    """A running :class:`UdevMonitor` for ``host``, else :class:`Polling`.

    ``mode``: ``auto`` uses udev on the kernel's own sysfs with a udev
    daemon running; ``udev`` uses it for any root whose devices udev
    announces (a fake host that broadcasts as udev does); ``off`` polls.
    """
    reason = unusable_because(host, mode)
    if reason is None:
        try:
            # unusable_because lets only a LinuxSysfs through.
            return UdevMonitor.open(cast(linux.LinuxSysfs, host).paths.root)
        except ImportError:
            reason = "pyudev is not installed (the 'hotplug' extra)"
        except OSError as exc:
            reason = f"no udev netlink socket: {exc}"
    if reason not in _logged:
        _logged.add(reason)
        LOG.info("GPU changes are found by polling sysfs, not by udev: %s", reason)
    return changes.Polling(reason)
