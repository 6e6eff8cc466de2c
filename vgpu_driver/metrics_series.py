"""The series a :class:`~vgpu_driver.metrics.Reading` becomes, with their help.

Names follow Prometheus' rules: base units (seconds, bytes, vGPUs), one
unit per name, ``_total`` only on counters, ``_info`` for what describes
rather than counts; ``doc/source/admin/metrics.rst`` lists every series.
What an alert measures the age of is a ``_timestamp_seconds`` (Unix time),
never an age: an age frozen in a file that stopped being rewritten would
stop growing, a timestamp goes on getting older.  Each function turns one
part of the reading into its families: the GPUs and vGPUs
(:mod:`vgpu_driver.metrics_gpus`), the host, the claims, the host
reconciler, the last audit.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

from prometheus_client import core

from vgpu_driver import __version__
from vgpu_driver import audit
from vgpu_driver import claims
from vgpu_driver import metrics_gpus
from vgpu_driver import reconciler_state

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from vgpu_driver.claims import Claim
    from vgpu_driver.metrics import Reading

PREFIX = "vgpu"
SRIOV_STATES = ("enabled", "partial", "off")


def _name(*parts: str) -> str:
    return "_".join((PREFIX,) + parts)


def _gauge(name: str, doc: str, labels: Iterable[str] = ()) -> core.GaugeMetricFamily:
    return core.GaugeMetricFamily(_name(name), doc, labels=list(labels))


def scrape_success(value: float) -> core.GaugeMetricFamily:
    """``vgpu_scrape_success``: 1 when the scrape read the host, else 0."""
    success = _gauge(
        "scrape_success",
        "1 when this scrape read the host, 0 when it could not (the exporter's log says why).",
    )
    success.add_metric([], value)
    return success


def scrape_duration(seconds: float) -> core.GaugeMetricFamily:
    """``vgpu_scrape_duration_seconds``: how long reading the host took."""
    took = _gauge("scrape_duration_seconds", "How long this scrape took to read the host.")
    took.add_metric([], seconds)
    return took


def families(reading: Reading) -> Iterator[Metric]:
    """Every family of one reading, the driver's info last."""
    yield from metrics_gpus.gpu_families(reading)
    yield from metrics_gpus.vgpu_families(reading)
    yield from _host_families(reading)
    yield from _claim_families(reading)
    yield from _reconciler_families(reading)
    yield from _audit_families(reading)
    info = core.InfoMetricFamily(
        _name("driver"),
        "The driver's version and what this host's configuration enables.",
        labels=["nodename"],
    )
    info.add_metric(
        [reading.host.nodename], {"version": __version__, "types": ",".join(reading.types)}
    )
    yield info


def _host_families(reading: Reading) -> list[core.GaugeMetricFamily]:
    boards = _gauge(
        "sriov_boards", "SR-IOV boards by the state of their virtual functions.", ["state"]
    )
    states = [g.sriov.state for g in reading.host.gpus if g.sriov is not None]
    for state in SRIOV_STATES:
        boards.add_metric([state], states.count(state))
    known = _gauge(
        "guests_known",
        "1 when libvirt answered, so guests, used vGPUs and "
        "orphans are known; 0 when they count claims only.",
    )
    known.add_metric([], 1 if reading.users is not None else 0)
    families = [boards, known]
    if reading.users is not None:
        referenced = {c.mdev_uuid for c in reading.claims} | reading.users
        orphans = _gauge(
            "orphan_vgpus",
            "vGPUs in sysfs that no claim and no libvirt "
            "domain references (the host reconciler removes those of "
            "served GPUs).",
        )
        orphans.add_metric([], sum(1 for v in reading.vgpus if v not in referenced))
        families.append(orphans)
    return families


def _bound(reading: Reading, state: str) -> float | None:
    """Seconds after which the host reconciler drops an unused claim of
    ``state`` (None: never)."""
    if state == claims.ATTACHED:
        return None
    if state == claims.MIGRATING_IN:
        return reading.migration_timeout or None
    return reading.grace


def _waiting(reading: Reading, claim: Claim, stuck: Mapping[str, float]) -> bool:
    """Whether ``claim`` waits on something the host reconciler should end:
    not attached, no guest using its vGPU (any, when libvirt could not say),
    and not a removal the kernel blocks (that has its own series)."""
    if claim.state == claims.ATTACHED or claim.mdev_uuid in stuck:
        return False
    return reading.users is None or claim.mdev_uuid not in reading.users


def _claim_families(reading: Reading) -> tuple[core.GaugeMetricFamily, ...]:
    count = _gauge("claims", "The journal's claims by state.", ["state"])
    oldest = _gauge(
        "claims_waiting_oldest_timestamp_seconds",
        "When the oldest claim of "
        "the state that no guest uses last changed (Unix time; absent with "
        "none): a migration's claim its guest has come for is not waiting.",
        ["state"],
    )
    past = _gauge(
        "claims_past_grace",
        "Claims not attached, that no guest uses, older "
        "than the bound the host reconciler drops them after (claim_grace, or "
        "migration_claim_timeout for migrating_in); a removal the kernel "
        "blocks is not counted (vgpu_removals_stuck is).",
        ["state"],
    )
    bound_of = _gauge(
        "claims_bound_seconds",
        "Seconds after which the host reconciler "
        "drops a claim of the state that no guest uses (absent: never).",
        ["state"],
    )
    stuck = reconciler_state.removals_in_flight(reading.reconciler, reading.now)
    for state in claims.STATES:
        mine = [c for c in reading.claims if c.state == state]
        waiting = [c for c in mine if _waiting(reading, c, stuck)]
        bound = _bound(reading, state)
        count.add_metric([state], len(mine))
        if waiting:
            oldest.add_metric([state], min(c.updated_at for c in waiting))
        if state != claims.ATTACHED:
            past.add_metric(
                [state],
                sum(1 for c in waiting if bound is not None and reading.now - c.updated_at > bound),
            )
        if bound is not None:
            bound_of.add_metric([state], bound)
    return count, oldest, past, bound_of


def _reconciler_families(reading: Reading) -> list[Metric]:
    state = reading.reconciler
    running = reconciler_state.is_running(state)
    up = _gauge(
        "reconciler_up",
        "1 while the process that runs the host reconciler (nova-compute) is alive.",
    )
    up.add_metric([], 1 if running else 0)
    stuck = reconciler_state.removals_in_flight(state, reading.now)
    removals = _gauge(
        "removals_stuck", "vGPU removals the kernel blocks (a guest's QEMU still holds the device)."
    )
    removals.add_metric([], len(stuck))
    families: list[Metric] = [up, removals]
    if stuck:
        oldest = _gauge(
            "removals_stuck_oldest_timestamp_seconds",
            "When the oldest blocked removal began (Unix time; absent with none).",
        )
        oldest.add_metric([], reading.now - max(stuck.values()))
        families.append(oldest)
    if not running or state is None:
        return families
    passes = core.CounterMetricFamily(
        _name("reconciler_passes"), "Passes the host reconciler ran since its service started."
    )
    passes.add_metric([], state.get("passes", 0))
    errors = core.CounterMetricFamily(
        _name("reconciler_errors"),
        "Steps that failed in the host reconciler's passes since its service started.",
    )
    errors.add_metric([], state.get("errors", 0))
    queue = _gauge("reconciler_queue_length", "Reasons waiting for the next pass.")
    queue.add_metric([], len(state.get("queued", [])))
    waiting = _gauge(
        "reconciler_vgpus_waiting_for_parent",
        "vGPUs to re-create once their parent (an SR-IOV VF) comes.",
    )
    waiting.add_metric([], len(state.get("waiting_for_parent", {})))
    families += [passes, errors, queue, waiting]
    families += _timed(
        state.get("last_pass"), "reconciler_last_pass", "the host reconciler's last pass"
    )
    families += _timed(
        state.get("last_update"),
        "inventory_update",
        "nova-compute's last periodic inventory update (its reconciler pass included)",
    )
    error = state.get("last_error")
    if error:
        at = _gauge(
            "reconciler_last_error_timestamp_seconds",
            "When a step last failed (Unix time).",
            ["step"],
        )
        at.add_metric([error["step"]], error["at"])
        families.append(at)
    return families


def _timed(
    record: Mapping[str, Any] | None,
    name: str,
    what: str,
) -> list[core.GaugeMetricFamily]:
    """``<name>_timestamp_seconds`` and ``<name>_duration_seconds`` of a
    ``{"started_at", "duration"}`` record; none without one."""
    if not record:
        return []
    when = _gauge(f"{name}_timestamp_seconds", f"When {what} started (Unix time).")
    when.add_metric([], record["started_at"])
    took = _gauge(f"{name}_duration_seconds", f"How long {what} took.")
    took.add_metric([], record["duration"])
    return [when, took]


def _audit_families(reading: Reading) -> list[core.GaugeMetricFamily]:
    """The last audit's drift, when one ran here and its record is readable."""
    record = reading.audit
    if not record or "unreadable" in record:
        return []
    drift = _gauge(
        "placement_drift",
        "Differences between the host and Placement the "
        "last vgpu-manage audit found, by kind (see the operator's guide).",
        ["kind"],
    )
    for kind in audit.KINDS:
        drift.add_metric([kind], record.get("drift", {}).get(kind, 0))
    when = _gauge(
        "audit_last_run_timestamp_seconds", "When the last vgpu-manage audit ran (Unix time)."
    )
    when.add_metric([], record["at"])
    return [drift, when]
