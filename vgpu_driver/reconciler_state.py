"""``reconciler.json``: what the host reconciler writes after every pass, and
what other processes read from it.

nova-compute's host reconciler writes it in the state directory;
``vgpu-manage status``, ``metrics`` and ``claims`` read it to show how
background work goes (passes, errors, removals the kernel blocks, vGPUs
waiting for their parent), and whether the process that wrote it still runs.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any
from typing import TypeGuard

from oslo_log import log as logging

from vgpu_driver import state_files

if TYPE_CHECKING:
    from vgpu_driver.host_reconciler import HostReconciler
    from vgpu_driver.restore import Outcome

LOG = logging.getLogger(__name__)

STATE_FILE = "reconciler.json"


@dataclasses.dataclass(frozen=True)
class PassReport:
    """One pass: why, when, how long, what the restore found, what failed."""

    reasons: tuple[str, ...]
    started_at: float
    duration: float
    restore: tuple[Outcome, ...] = ()  # of each missing vGPU
    errors: tuple[str, ...] = ()


def record(reconciler: HostReconciler, queued: Iterable[str]) -> dict[str, Any]:
    """What ``reconciler.json`` holds for ``reconciler`` (a
    :class:`~vgpu_driver.host_reconciler.HostReconciler`) with the reasons
    ``queued`` for its next pass: JSON-ready."""
    last = reconciler.last
    return {
        "pid": os.getpid(),
        "written_at": reconciler.clock(),
        "passes": reconciler.passes,
        "errors": reconciler.errors,
        "queued": queued,
        "last_pass": None
        if last is None
        else {
            "reasons": list(last.reasons),
            "started_at": last.started_at,
            "duration": last.duration,
            "errors": list(last.errors),
        },
        "last_error": None
        if reconciler.last_error is None
        else dict(zip(("at", "step", "message"), reconciler.last_error, strict=True)),
        "last_update": None
        if reconciler.last_update is None
        else dict(zip(("started_at", "duration"), reconciler.last_update, strict=True)),
        "removals_in_flight": reconciler.manager.removals.in_flight(),
        "waiting_for_parent": dict(reconciler.waiting),
    }


def save(path: str | None, state: Mapping[str, Any]) -> None:
    """``state`` (a :func:`record`) into ``path`` (None: nowhere); a file
    that cannot be written is logged, never raised: the pass is done."""
    if path is None:
        return
    try:
        state_files.write(path, state)
    except OSError as exc:
        LOG.warning("Could not write %s: %s", path, exc)


def read(state_dir: str) -> Any:
    """What the host reconciler last wrote (None if it never ran here)."""
    return state_files.read(os.path.join(state_dir, STATE_FILE))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: it exists
    return True


def is_running(state: Mapping[str, Any] | None) -> TypeGuard[Mapping[str, Any]]:
    """Whether the process that wrote ``state`` (:func:`read`) still runs."""
    return bool(state and "unreadable" not in state and _alive(int(state.get("pid", 0)) or -1))


def removals_in_flight(state: Mapping[str, Any] | None, now: float) -> dict[str, float]:
    """``{vgpu: seconds its removal has been blocked}`` from what the host
    reconciler wrote, if the process that wrote it still runs."""
    if not is_running(state):
        return {}
    return {
        vgpu: max(now - started, 0.0)
        for vgpu, started in state.get("removals_in_flight", {}).items()
    }


def describe(state: Mapping[str, Any] | None, now: float) -> str | None:
    """One line about the host reconciler, for ``status`` (None if it never
    ran on this host: nova-compute starts it)."""
    if state is None:
        return None
    if "unreadable" in state:
        return f"reconciler: state unreadable ({state['unreadable']})"
    if not is_running(state):
        return (
            f"reconciler: not running (its service, pid {state.get('pid')}, is gone; "
            f"last written {now - state.get('written_at', now):.0f}s ago)"
        )
    parts = [f"reconciler: {state.get('passes', 0)} pass(es)"]
    last = state.get("last_pass")
    if last:
        parts.append(
            f"last {now - last['started_at']:.0f}s ago for "
            f"{', '.join(last['reasons'])} in {last['duration'] * 1000:.0f} ms"
        )
    parts.append(f"queue {len(state.get('queued', []))}")
    stuck = removals_in_flight(state, now)
    if stuck:
        parts.append(f"{len(stuck)} stuck removal(s), oldest {max(stuck.values()):.0f}s")
    waiting = state.get("waiting_for_parent", {})
    if waiting:
        parts.append(f"{len(waiting)} vGPU(s) waiting for their parent")
    error = state.get("last_error")
    if error:
        parts.append(
            f"last error {now - error['at']:.0f}s ago in {error['step']}: {error['message']}"
        )
    return "; ".join(parts)
