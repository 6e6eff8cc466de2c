"""Removals in flight: at most one writer per vGPU, never a pile of them.

The kernel blocks a ``remove`` (or clearing a vendor-VFIO VF's type) for as
long as a guest's QEMU still holds the device, and nothing can interrupt
that write: the writing thread, and through the privileged daemon one of
its workers, stays blocked until QEMU lets go.  Issuing the removal again at
every pass would only add one more blocked writer each time.  So a removal
is *state*: its writer is started once, its start time kept; callers wait
for it at most ``wait`` seconds and otherwise learn it is still in flight;
a new writer for the same vGPU starts only after the previous one returned.

The daemon's workers are bounded the same way: at most ``limit`` removals
are written at once (``[vgpu] max_removals_in_flight``, kept below the
privileged daemon's thread pool), so however many removals the kernel
blocks, creations always find a free worker; the rest wait their turn as
``releasing`` claims, which is what they are.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

from oslo_log import log as logging

from vgpu_driver import exception

LOG = logging.getLogger(__name__)

DONE = "done"
IN_FLIGHT = "in-flight"
QUEUED = "queued"
FAILED = "failed"


@dataclasses.dataclass(frozen=True)
class Removal:
    """One vGPU's removal as it stands."""

    vgpu: str
    state: str  # in-flight | done | failed
    started_at: float  # time.time() when the writer started
    error: str | None = None


class _Writer:
    def __init__(
        self,
        vgpu: str,
        destroy: Callable[[str], object],
        started_at: float,
        on_done: Callable[[str], object],
    ) -> None:
        self.vgpu = vgpu
        self.started_at = started_at
        self.error: str | None = None
        self.finished = threading.Event()
        self._destroy = destroy
        self._on_done = on_done
        self.thread = threading.Thread(target=self._run, name=f"vgpu-remove-{vgpu}", daemon=True)

    def _run(self) -> None:
        try:
            self._destroy(self.vgpu)
        except exception.VgpuDriverError as exc:
            self.error = str(exc)
        except Exception as exc:  # noqa: BLE001 - a bug must not kill the record
            LOG.exception("Removing vGPU %s failed unexpectedly", self.vgpu)
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.finished.set()
            self._on_done(self.vgpu)


class Removals:
    """The removal writers of one process, one per vGPU at most."""

    def __init__(self, limit: int = 2, clock: Callable[[], float] = time.time) -> None:
        self.limit = max(int(limit), 1)
        self.clock = clock
        self._writers: dict[str, _Writer] = {}
        self._cond = threading.Condition()
        #: Called with the vGPU id whenever a writer returns (the reconciler
        #: is told, so a removal that outlived its caller is finished).
        self.on_done: Callable[[str], object] = lambda vgpu: None

    def remove(self, vgpu: str, destroy: Callable[[str], object], wait: float) -> Removal | None:
        """Remove ``vgpu`` with ``destroy(vgpu)``; its :class:`Removal`
        after waiting at most ``wait`` seconds, for a free writer and then
        for the write (None if no writer was free in time: ``limit``
        others are in flight).

        A writer already in flight for ``vgpu`` is waited for, not doubled;
        a finished one's outcome is handed out once, and the next call
        starts a new writer.
        """
        deadline = time.monotonic() + max(wait, 0)
        with self._cond:
            writer = self._writers.get(vgpu)
            while writer is None and self._running() >= self.limit:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
                writer = self._writers.get(vgpu)
            if writer is None:
                writer = _Writer(vgpu, destroy, self.clock(), self._finished)
                self._writers[vgpu] = writer
                writer.thread.start()
        writer.finished.wait(max(deadline - time.monotonic(), 0))
        return self._collect(writer)

    def _running(self) -> int:
        return sum(not w.finished.is_set() for w in self._writers.values())

    def _finished(self, vgpu: str) -> None:
        with self._cond:
            self._cond.notify_all()
        self.on_done(vgpu)

    def _collect(self, writer: _Writer) -> Removal:
        """The writer's outcome; a finished writer is forgotten once told."""
        with self._cond:
            if not writer.finished.is_set():
                return Removal(writer.vgpu, IN_FLIGHT, writer.started_at)
            if self._writers.get(writer.vgpu) is writer:
                del self._writers[writer.vgpu]
        state = DONE if writer.error is None else FAILED
        return Removal(writer.vgpu, state, writer.started_at, writer.error)

    def in_flight(self) -> dict[str, float]:
        """``{vgpu: started_at}`` of the writers still blocked."""
        with self._cond:
            return {v: w.started_at for v, w in self._writers.items() if not w.finished.is_set()}

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every writer (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        for writer in list(self._writers.values()):
            writer.finished.wait(max(deadline - time.monotonic(), 0))
        return not self.in_flight()
