"""The series a :class:`~vgpu_driver.metrics.Reading` becomes, with their help.

Names follow Prometheus' rules: base units (seconds), ``_total`` only on
counters, ``_info`` for the one info metric; ``doc/source/admin/metrics.rst``
lists every series.  Each function turns one part of the reading into its
families: the GPUs, the host, the claims, the host reconciler, the last audit.
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
from vgpu_driver import inventory
from vgpu_driver import reconciler_state

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from vgpu_driver.metrics import Reading
    from vgpu_driver.status import GpuStatus

PREFIX = "vgpu"
GPU_LABELS = ("gpu", "provider", "type", "resource_class", "model")
SRIOV_STATES = ("enabled", "partial", "off")


def _name(*parts: str) -> str:
    return "_".join((PREFIX,) + parts)


def _gauge(name: str, doc: str, labels: Iterable[str] = ()) -> core.GaugeMetricFamily:
    return core.GaugeMetricFamily(_name(name), doc, labels=list(labels))


def scrape_success(value: float) -> core.GaugeMetricFamily:
    """``vgpu_scrape_success``: 1 when the scrape read the host, else 0."""
    success = _gauge("scrape_success", "1 when this scrape read the host, 0 when it "
                     "could not (the exporter's log says why).")
    success.add_metric([], value)
    return success


def families(reading: Reading) -> Iterator[Metric]:
    """Every family of one reading, the driver's info last."""
    yield from _gpu_families(reading)
    yield from _host_families(reading)
    yield from _claim_families(reading)
    yield from _reconciler_families(reading)
    yield from _audit_families(reading)
    info = core.InfoMetricFamily(_name("driver"), "The driver's version and what "
                                 "this host's configuration enables.",
                                 labels=["nodename"])
    info.add_metric([reading.host.nodename], {
        "version": __version__, "types": ",".join(reading.types)})
    yield info


def _gpu_labels(reading: Reading, gpu: GpuStatus) -> list[str]:
    provider = reading.providers.get(gpu.gpu)
    return [gpu.gpu, gpu.provider or "", gpu.type_id or reading.configured.get(gpu.gpu) or "",
            provider.resource_class if provider else "", reading.models.get(gpu.gpu, "")]


def _gpu_families(reading: Reading) -> tuple[core.GaugeMetricFamily, ...]:
    capacity = _gauge("gpu_vgpus_capacity", "vGPUs the GPU's resource provider offers "
                      "(its Placement total; 0 on a GPU with no provider).", GPU_LABELS)
    used = _gauge("gpu_vgpus_used", "vGPUs of the GPU that guests or claims hold.", GPU_LABELS)
    reserved = _gauge("gpu_vgpus_reserved", "vGPUs of the GPU's provider that Placement "
                      "may not hand out (see vgpu-manage status for why).", GPU_LABELS)
    reserved_for = _gauge("gpu_vgpus_reserved_by_reason", "The GPU's reserved vGPUs by "
                          "what they are held back for: " + ", ".join(inventory.RESERVED_FOR)
                          + " (see the operator's guide).", GPU_LABELS + ("reason",))
    served = _gauge("gpu_served", "1 when the GPU has a resource provider, 0 when the "
                    "configuration or its state leaves it out (type: the one nova.conf "
                    "gives it, if any).", GPU_LABELS)
    guests = _gauge("gpu_guests", "Guests (libvirt domains) holding vGPUs of the GPU; "
                    "absent when libvirt could not be asked.", GPU_LABELS)
    vfs = _gauge("gpu_sriov_vfs", "An SR-IOV board's enabled virtual functions.", GPU_LABELS)
    vfs_max = _gauge("gpu_sriov_vfs_max", "The virtual functions an SR-IOV board can "
                     "enable.", GPU_LABELS)
    for gpu in reading.host.gpus:
        labels = _gpu_labels(reading, gpu)
        capacity.add_metric(labels, gpu.total)
        used.add_metric(labels, gpu.used)
        reserved.add_metric(labels, gpu.reserved)
        provider = reading.providers.get(gpu.gpu)
        if provider is not None:
            held = dict(provider.reserved_for)
            for kind in inventory.RESERVED_FOR:
                reserved_for.add_metric(labels + [kind], held.get(kind, 0))
        served.add_metric(labels, 1 if gpu.provider else 0)
        if gpu.guests is not None:
            guests.add_metric(labels, len({g.instance for g in gpu.guests}))
        if gpu.sriov is not None:
            vfs.add_metric(labels, gpu.sriov.numvfs)
            vfs_max.add_metric(labels, gpu.sriov.totalvfs)
    return capacity, used, reserved, reserved_for, served, guests, vfs, vfs_max


def _host_families(reading: Reading) -> list[core.GaugeMetricFamily]:
    boards = _gauge("sriov_boards", "SR-IOV boards by the state of their virtual "
                    "functions.", ["state"])
    states = [g.sriov.state for g in reading.host.gpus if g.sriov is not None]
    for state in SRIOV_STATES:
        boards.add_metric([state], states.count(state))
    known = _gauge("guests_known", "1 when libvirt answered, so guests, used vGPUs and "
                   "orphans are known; 0 when they count claims only.")
    known.add_metric([], 1 if reading.users is not None else 0)
    families = [boards, known]
    if reading.users is not None:
        referenced = {c.mdev_uuid for c in reading.claims} | reading.users
        orphans = _gauge("orphan_vgpus", "vGPUs in sysfs that no claim and no libvirt "
                         "domain references (the host reconciler removes those of "
                         "served GPUs).")
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


def _claim_families(reading: Reading) -> tuple[core.GaugeMetricFamily, ...]:
    count = _gauge("claims", "The journal's claims by state.", ["state"])
    oldest = _gauge("claims_oldest_age_seconds", "Seconds since the oldest claim of the "
                    "state last changed (0 with none).", ["state"])
    past = _gauge("claims_past_grace", "Claims not attached that are older than the bound "
                  "the host reconciler drops them after (claim_grace, or "
                  "migration_claim_timeout for migrating_in).", ["state"])
    for state in claims.STATES:
        mine = [c for c in reading.claims if c.state == state]
        ages = [max(reading.now - c.updated_at, 0.0) for c in mine]
        bound = _bound(reading, state)
        count.add_metric([state], len(mine))
        oldest.add_metric([state], max(ages, default=0.0))
        if state != claims.ATTACHED:
            past.add_metric([state], sum(1 for a in ages if bound is not None and a > bound))
    return count, oldest, past


def _reconciler_families(reading: Reading) -> list[Metric]:
    state = reading.reconciler
    running = reconciler_state.is_running(state)
    up = _gauge("reconciler_up", "1 while the process that runs the host reconciler "
                "(nova-compute) is alive.")
    up.add_metric([], 1 if running else 0)
    stuck = reconciler_state.removals_in_flight(state, reading.now)
    removals = _gauge("removals_stuck", "vGPU removals the kernel blocks (a guest's QEMU "
                      "still holds the device).")
    removals.add_metric([], len(stuck))
    oldest = _gauge("removals_stuck_oldest_seconds", "Seconds the oldest blocked removal "
                    "has waited (0 with none).")
    oldest.add_metric([], max(stuck.values(), default=0.0))
    families: list[Metric] = [up, removals, oldest]
    if not running or state is None:
        return families
    passes = core.CounterMetricFamily(_name("reconciler_passes"), "Passes the host "
                                      "reconciler ran since its service started.")
    passes.add_metric([], state.get("passes", 0))
    errors = core.CounterMetricFamily(_name("reconciler_errors"), "Steps that failed in "
                                      "the host reconciler's passes since its service "
                                      "started.")
    errors.add_metric([], state.get("errors", 0))
    queue = _gauge("reconciler_queue_length", "Reasons waiting for the next pass.")
    queue.add_metric([], len(state.get("queued", [])))
    waiting = _gauge("reconciler_vgpus_waiting_for_parent", "vGPUs to re-create once "
                     "their parent (an SR-IOV VF) comes.")
    waiting.add_metric([], len(state.get("waiting_for_parent", {})))
    families += [passes, errors, queue, waiting]
    families += _timed(state.get("last_pass"), "reconciler_last_pass",
                       "the host reconciler's last pass")
    families += _timed(state.get("last_update"), "inventory_update",
                       "nova-compute's last periodic inventory update (its reconciler "
                       "pass included)")
    error = state.get("last_error")
    if error:
        at = _gauge("reconciler_last_error_timestamp_seconds", "When a step last failed "
                    "(Unix time).", ["step"])
        at.add_metric([error["step"]], error["at"])
        families.append(at)
    return families


def _timed(record: Mapping[str, Any] | None, name: str, what: str,
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
    drift = _gauge("placement_drift", "Differences between the host and Placement the "
                   "last vgpu-manage audit found, by kind (see the operator's guide).",
                   ["kind"])
    for kind in audit.KINDS:
        drift.add_metric([kind], record.get("drift", {}).get(kind, 0))
    when = _gauge("audit_last_run_timestamp_seconds", "When the last vgpu-manage audit ran "
                  "(Unix time).")
    when.add_metric([], record["at"])
    return [drift, when]
