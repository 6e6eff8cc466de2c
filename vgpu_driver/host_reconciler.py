"""The host reconciler: the one worker that changes a host on its own.

Allocation is synchronous, on nova's thread, and never waits for it.
Everything else the host does without being asked (finishing removals the
kernel blocked, dropping claims nobody came for or whose migration never
ended, re-creating after a reboot what claims still reference, removing
unused mdevs of types their GPU no longer serves, and whatever the compute
driver adds, such as settling libvirt's mdev definitions) happens here, in
*passes*, one at a time:

* A pass is asked for with a *reason* (:meth:`HostReconciler.poke`):
  start-up, a periodic update, a tick, a udev event while vGPUs wait for
  their parents, a removal that returned, a release.  Reasons that arrive
  while a pass runs are coalesced into the next one.
* Each pass reads the journal again and each step acts under its rules
  (:mod:`vgpu_driver.reconciler_steps`: what a pass does, in order).
* A step's exception is logged with its context, recorded as the last
  error, and the pass goes on with the next step; the worker never dies.
* What it did is written after every pass to ``reconciler.json`` in the
  state directory, for ``vgpu-manage status`` (another process) to show
  (:mod:`vgpu_driver.reconciler_state`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from collections.abc import Collection
from collections.abc import Container
from collections.abc import Iterable
from typing import TYPE_CHECKING
from typing import Any

from oslo_log import log as logging

from vgpu_driver import reconciler_state
from vgpu_driver import reconciler_steps

if TYPE_CHECKING:
    from oslo_config import cfg

    from vgpu_driver.discovery_cache import CachedDiscovery
    from vgpu_driver.reconcile import Reconciler
    from vgpu_driver.restore import Outcome
    from vgpu_driver.sysfs.changes import Polling
    from vgpu_driver.sysfs.udev import UdevMonitor

LOG = logging.getLogger(__name__)

START_UP = "start-up"
PERIODIC = "periodic"
TICK = "tick"
UDEV = "udev"
REMOVAL_DONE = "removal-done"

# While vGPUs wait for parents and udev cannot say when they come, how
# often to look again (the vendor enables VFs seconds after boot).
_WAITING_POLL = 1.0


class HostReconciler:
    """One worker per host, fed by reasons, one pass at a time."""

    def __init__(
        self,
        rules: Reconciler,
        conf: cfg.ConfigOpts,
        changes: UdevMonitor | Polling | None = None,
        discovery: CachedDiscovery | None = None,
        state_dir: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``rules``: a :class:`vgpu_driver.reconcile.Reconciler`; ``conf``:
        the options (``[vgpu]``); ``changes``: udev's monitor (or polling);
        ``discovery``: the cached discovery each pass reads the host through
        (None: a full read); ``state_dir``: where ``reconciler.json`` goes
        (None: nowhere)."""
        self.rules = rules
        self.manager = rules.manager
        self.conf = conf
        self.changes = changes
        self.discovery = discovery
        self.clock = clock
        self.state_path = (
            os.path.join(state_dir, reconciler_state.STATE_FILE) if state_dir else None
        )
        self._extra_steps: list[tuple[str, reconciler_steps.Step]] = []
        #: ``keeper(instance uuids)`` -> those whose claims no pass drops
        #: though no domain uses them: an operation is under way on them,
        #: or they keep their vGPUs without a domain (set by the compute
        #: driver; without it, no unused claim is released).
        self.keeper: Callable[[set[str]], Container[str]] | None = None
        self._cond = threading.Condition()
        self._pass_lock = threading.Lock()
        self._reasons: set[str] = set()
        self._taken = 0  # passes that took their reasons
        self._done = 0  # passes finished
        self._stopping = False
        self._threads: list[threading.Thread] = []
        #: ``{vgpu: first seen missing}`` of vGPUs waiting for their parent.
        self.waiting: dict[str, float] = {}
        #: Of those, the vGPUs already logged as late (``[vgpu] restore_wait``).
        self.reported_late: set[str] = set()
        self.last: reconciler_state.PassReport | None = None
        self.last_error: tuple[float, str, str] | None = None  # (time, step, message)
        self.passes = 0
        self.errors = 0  # steps that failed, in all passes
        # (started at, seconds) of the last inventory update.
        self.last_update: tuple[float, float] | None = None

    # -- what a pass does -----------------------------------------------------------------

    def add_step(self, name: str, step: reconciler_steps.Step) -> None:
        """Run ``step(reasons)`` at the end of every pass (the compute
        driver's own background work)."""
        self._extra_steps.append((name, step))

    def _steps(self, reasons: Collection[str]) -> list[tuple[str, reconciler_steps.Step]]:
        """The steps of a pass for ``reasons``: the host's own, then the
        compute driver's."""
        return reconciler_steps.host_steps(self, START_UP in reasons) + self._extra_steps

    # -- one pass -------------------------------------------------------------------------

    def run_pass(self, reasons: Iterable[str]) -> reconciler_state.PassReport:
        """Run one pass now, in this thread; its :class:`PassReport`."""
        ordered = tuple(sorted(reasons))
        with self._pass_lock:
            started, began = self.clock(), time.monotonic()
            errors: list[str] = []
            restore: tuple[Outcome, ...] = ()
            for name, step in self._steps(ordered):
                try:
                    result = step(ordered)
                except Exception as exc:  # noqa: BLE001 - logged, the next step runs
                    LOG.exception(
                        "Host reconciler: the %s step failed in the pass for "
                        "%s; the next pass tries again",
                        name,
                        ", ".join(ordered),
                    )
                    errors.append(f"{name}: {exc}")
                    self.errors += 1
                    self.last_error = (self.clock(), name, str(exc))
                    continue
                if name == "restore":
                    restore = result
            self.passes += 1
            self.last = reconciler_state.PassReport(
                ordered, started, time.monotonic() - began, restore, tuple(errors)
            )
            self._save_state()
        return self.last

    def note_update(self, started_at: float, duration: float) -> None:
        """The compute driver's inventory update (its pass included) ended:
        shown by ``vgpu-manage metrics`` with the rest of the state."""
        self.last_update = (started_at, duration)
        self._save_state()

    # -- the worker -----------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def start_up(self) -> reconciler_state.PassReport:
        """The start-up pass, in the caller's thread (the service waits for
        it), then the worker; the start-up pass's report."""
        report = self.run_pass({START_UP})
        self.start()
        return report

    def start(self) -> None:
        if self.running:
            return
        self._stopping = False
        self._threads = [threading.Thread(target=self._work, name="vgpu-reconciler", daemon=True)]
        if self.changes is not None and getattr(self.changes, "running", False):
            self._threads.append(
                threading.Thread(target=self._feed_udev, name="vgpu-reconciler-udev", daemon=True)
            )
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout)

    def poke(self, reason: str) -> int:
        """Ask for a pass; returns the number of the pass that will serve it."""
        with self._cond:
            self._reasons.add(reason)
            self._cond.notify_all()
            return self._taken + 1

    def run_now(self, reason: str, timeout: float = 60.0) -> bool:
        """A pass for ``reason`` that starts after this call, waited for
        (at most ``timeout`` seconds once the worker runs); in this thread
        when no worker runs.  Whether it finished."""
        if not self.running:
            self.run_pass({reason})
            return True
        target = self.poke(reason)
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._done < target:
                left = deadline - time.monotonic()
                if left <= 0 or not self.running:
                    LOG.warning(
                        "The host reconciler's pass for %s did not finish within "
                        "%gs; going on without it",
                        reason,
                        timeout,
                    )
                    return False
                self._cond.wait(min(left, 1.0))
        return True

    def _next_reasons(self) -> set[str] | None:
        """Wait for reasons (a tick if none comes); None when stopping."""
        with self._cond:
            while not self._reasons and not self._stopping:
                interval = self.conf.vgpu.reconcile_interval
                if self.waiting:
                    interval = min(interval, _WAITING_POLL)
                if not self._cond.wait(interval):
                    self._reasons.add(TICK)
            if self._stopping:
                return None
            reasons, self._reasons = self._reasons, set()
            self._taken += 1
            return reasons

    def _work(self) -> None:
        while True:
            reasons = self._next_reasons()
            if reasons is None:
                return
            try:
                self.run_pass(reasons)
            except Exception:  # noqa: BLE001 - the worker outlives any pass
                LOG.exception("Host reconciler: a pass failed")
            finally:
                with self._cond:
                    self._done += 1
                    self._cond.notify_all()

    def _feed_udev(self) -> None:
        """While vGPUs wait for their parents, each udev event asks for a
        pass (the VFs the vendor enables after a boot)."""
        if self.changes is None:  # started only with changes to wait on
            return
        waiter = self.changes.waiter()
        while not self._stopping:
            if waiter.wait(1.0) and self.waiting:
                self.poke(UDEV)

    # -- what status shows ----------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """What ``reconciler.json`` holds: JSON-ready."""
        with self._cond:
            queued = sorted(self._reasons)
        return reconciler_state.record(self, queued)

    def _save_state(self) -> None:
        reconciler_state.save(self.state_path, self.state())
