"""The host's own steps of a reconciler pass, in order, and the rules each
acts under.

Apart from :mod:`vgpu_driver.host_reconciler`, which owns the one worker,
its reasons and how a pass runs: this module only says *what* a pass does,
never when or on which thread.  Each pass reads the journal again and each
step acts under its rules: claims no domain uses are released only past
their grace and when the compute driver's *keeper* does not keep them (an
operation under way); a vGPU is created only for a claim unchanged since it
was read, on its own parent or one no other claim points at, and removed
again if its claim went while it was written; a claim is dropped only if
unchanged since it was judged stale; removals are state
(:mod:`vgpu_driver.removals`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

from oslo_log import log as logging

from vgpu_driver import takeover
from vgpu_driver import unused_claims

if TYPE_CHECKING:
    from vgpu_driver.host_reconciler import HostReconciler
    from vgpu_driver.restore import Outcome

LOG = logging.getLogger(__name__)

# A step of a pass: ``step(reasons)``; the restore step returns its outcomes.
Step = Callable[[tuple[str, ...]], Any]

# How long a pass waits for the removals it starts (the rest stays in flight).
_REMOVAL_WAIT = 1.0


def host_steps(worker: HostReconciler, start_up: bool) -> list[tuple[str, Step]]:
    """The host's own ``(name, step)`` of a pass of ``worker``, in order;
    ``start_up``: whether it is the start-up pass."""
    steps: list[tuple[str, Step]] = [
        ("host", lambda _: read_host(worker)),
        ("removals", lambda _: finish_removals(worker)),
        ("stale claims", lambda _: clean_claims(worker, start_up)),
        ("unused claims", lambda _: release_unused(worker, start_up)),
    ]
    if start_up:
        steps.append(("takeover", lambda _: takeover.adopt(worker.manager)))
    steps += [
        ("restore", lambda _: restore(worker, start_up)),
        ("stale types", lambda _: stale_types(worker)),
    ]
    return steps


def read_host(worker: HostReconciler) -> None:
    """One read of the host for the whole pass (creations and removals
    change no structure the later steps need)."""
    worker.manager.use_snapshot(
        worker.discovery.snapshot() if worker.discovery else worker.manager.snapshot(refresh=True)
    )


def finish_removals(worker: HostReconciler) -> None:
    worker.rules.finish_releases(wait=_REMOVAL_WAIT)


def clean_claims(worker: HostReconciler, start_up: bool) -> None:
    # An attached claim without a domain is stale only at start-up: a
    # resize or a hard reboot undefines the domain for a while.  Not
    # even then while an operation is under way on its instance (one
    # the service was killed in, which the compute resumes), or when
    # the guest keeps its vGPUs without a domain.
    worker.rules.clean_stale_claims(
        grace=worker.conf.vgpu.claim_grace,
        attached_too=start_up,
        migration_timeout=worker.conf.vgpu.migration_claim_timeout,
        busy=worker.keeper,
    )


def release_unused(worker: HostReconciler, start_up: bool) -> None:
    # Later, claims no domain uses go after their own grace, unless the
    # compute driver keeps them (:mod:`vgpu_driver.unused_claims`).
    if not start_up:
        unused_claims.release(
            worker.manager, worker.keeper, worker.conf.vgpu.unused_claim_grace, worker.clock()
        )


def restore(worker: HostReconciler, start_up: bool) -> tuple[Outcome, ...]:
    # At start-up nothing is being allocated yet: every claim is the
    # host's to restore; later, claims not yet attached are their
    # allocation's (nova's thread creates them).
    outcomes = worker.rules.restore(refresh=False, attached_only=not start_up)
    now = worker.clock()
    waiting = {o.mdev_uuid for o in outcomes if o.result == "waiting"}
    worker.waiting = {v: worker.waiting.get(v, now) for v in waiting}
    for vgpu, since in worker.waiting.items():
        if now - since >= worker.conf.vgpu.restore_wait and vgpu not in worker.reported_late:
            worker.reported_late.add(vgpu)
            LOG.error(
                "vGPU %s is still not back %.0fs after it was found missing "
                "([vgpu] restore_wait): its parent has not appeared; it is "
                "retried at each pass",
                vgpu,
                now - since,
            )
    worker.reported_late &= set(worker.waiting)
    return tuple(outcomes)


def stale_types(worker: HostReconciler) -> None:
    worker.rules.reclaim_stale_types(referenced=worker.rules.in_use())
