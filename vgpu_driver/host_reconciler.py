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
* Each pass reads the journal again and each step acts under its rules:
  claims no domain uses are released only past their grace and when the
  compute driver's *keeper* does not keep them (an operation under way);
  a vGPU is created only for a claim unchanged since it was read, on its
  own parent or one no other claim points at, and removed again if its
  claim went while it was written; a claim is dropped only if unchanged
  since it was judged stale; removals are state (:mod:`vgpu_driver.removals`).
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
from vgpu_driver import takeover
from vgpu_driver import unused_claims

if TYPE_CHECKING:
    from oslo_config import cfg

    from vgpu_driver.discovery_cache import CachedDiscovery
    from vgpu_driver.reconcile import Reconciler
    from vgpu_driver.restore import Outcome
    from vgpu_driver.sysfs.changes import Polling
    from vgpu_driver.sysfs.udev import UdevMonitor

LOG = logging.getLogger(__name__)

# A step of a pass: ``step(reasons)``; the restore step returns its outcomes.
Step = Callable[[tuple[str, ...]], Any]

START_UP = "start-up"
PERIODIC = "periodic"
TICK = "tick"
UDEV = "udev"
REMOVAL_DONE = "removal-done"

# While vGPUs wait for parents and udev cannot say when they come, how
# often to look again (the vendor enables VFs seconds after boot).
_WAITING_POLL = 1.0
# How long a pass waits for the removals it starts (the rest stays in flight).
_REMOVAL_WAIT = 1.0


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
        self._extra_steps: list[tuple[str, Step]] = []
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
        self._reported_late: set[str] = set()
        self.last: reconciler_state.PassReport | None = None
        self.last_error: tuple[float, str, str] | None = None  # (time, step, message)
        self.passes = 0
        self.errors = 0  # steps that failed, in all passes
        # (started at, seconds) of the last inventory update.
        self.last_update: tuple[float, float] | None = None

    # -- what a pass does -----------------------------------------------------------------

    def add_step(self, name: str, step: Step) -> None:
        """Run ``step(reasons)`` at the end of every pass (the compute
        driver's own background work)."""
        self._extra_steps.append((name, step))

    def _steps(self, reasons: Collection[str]) -> list[tuple[str, Step]]:
        steps: list[tuple[str, Step]] = [
            ("host", self._read_host),
            ("removals", self._finish_removals),
            ("stale claims", self._clean_claims),
            ("unused claims", self._release_unused),
        ]
        if START_UP in reasons:
            steps.append(("takeover", lambda _: takeover.adopt(self.manager)))
        steps += [("restore", self._restore), ("stale types", self._stale_types)]
        return steps + self._extra_steps

    def _finish_removals(self, reasons: Collection[str]) -> None:
        self.rules.finish_releases(wait=_REMOVAL_WAIT)

    def _clean_claims(self, reasons: Collection[str]) -> None:
        # An attached claim without a domain is stale only at start-up: a
        # resize or a hard reboot undefines the domain for a while.  Not
        # even then while an operation is under way on its instance (one
        # the service was killed in, which the compute resumes), or when
        # the guest keeps its vGPUs without a domain.
        self.rules.clean_stale_claims(
            grace=self.conf.vgpu.claim_grace,
            attached_too=START_UP in reasons,
            migration_timeout=self.conf.vgpu.migration_claim_timeout,
            busy=self.keeper,
        )

    def _release_unused(self, reasons: Collection[str]) -> None:
        # Later, claims no domain uses go after their own grace, unless the
        # compute driver keeps them (:mod:`vgpu_driver.unused_claims`).
        if START_UP not in reasons:
            unused_claims.release(
                self.manager, self.keeper, self.conf.vgpu.unused_claim_grace, self.clock()
            )

    def _read_host(self, reasons: Collection[str]) -> None:
        """One read of the host for the whole pass (creations and removals
        change no structure the later steps need)."""
        self.manager.use_snapshot(
            self.discovery.snapshot() if self.discovery else self.manager.snapshot(refresh=True)
        )

    def _restore(self, reasons: Collection[str]) -> tuple[Outcome, ...]:
        # At start-up nothing is being allocated yet: every claim is the
        # host's to restore; later, claims not yet attached are their
        # allocation's (nova's thread creates them).
        outcomes = self.rules.restore(refresh=False, attached_only=START_UP not in reasons)
        now = self.clock()
        waiting = {o.mdev_uuid for o in outcomes if o.result == "waiting"}
        self.waiting = {v: self.waiting.get(v, now) for v in waiting}
        for vgpu, since in self.waiting.items():
            if now - since >= self.conf.vgpu.restore_wait and vgpu not in self._reported_late:
                self._reported_late.add(vgpu)
                LOG.error(
                    "vGPU %s is still not back %.0fs after it was found missing "
                    "([vgpu] restore_wait): its parent has not appeared; it is "
                    "retried at each pass",
                    vgpu,
                    now - since,
                )
        self._reported_late &= set(self.waiting)
        return tuple(outcomes)

    def _stale_types(self, reasons: Collection[str]) -> None:
        self.rules.reclaim_stale_types(referenced=self.rules.in_use())

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
