"""A host's vGPUs, claims and host reconciler as Prometheus metrics.

Operators graph and alert in Prometheus; ``status`` has the facts, but only
as a screen.  A :class:`HostCollector` reads its sources once per scrape (a
:class:`Reading`, what ``status`` reads) and turns that one reading into
metric families, so two series of one scrape never disagree.  Names follow
Prometheus' rules: base units (seconds), ``_total`` only on counters,
``_info`` for the one info metric; ``doc/source/admin/metrics.rst`` lists
every series.
"""

import dataclasses
import os
import threading

import prometheus_client
from prometheus_client import core
from prometheus_client import registry as prometheus_registry

from vgpu_driver import __version__
from vgpu_driver import audit
from vgpu_driver import claims
from vgpu_driver import host_reconciler
from vgpu_driver import inventory
from vgpu_driver.conf import fleet

PREFIX = "vgpu"
GPU_LABELS = ("gpu", "provider", "type", "resource_class", "model")
SRIOV_STATES = ("enabled", "partial", "off")


@dataclasses.dataclass(frozen=True)
class Reading:
    """One scrape's sources, each read once.

    ``host`` is the :class:`~vgpu_driver.status.HostStatus` of the same
    reads; ``claims`` the journal's claims; ``vgpus`` the ids of the vGPUs
    that exist in sysfs; ``users`` the vGPU ids libvirt's domains use
    (None: libvirt could not say); ``reconciler`` what the host reconciler
    last wrote (None: it never ran here), ``audit`` what the last audit
    recorded (None: none ran here); ``grace`` and ``migration_timeout`` the
    bounds the reconciler drops claims after.
    """

    host: object
    claims: tuple
    vgpus: frozenset
    users: frozenset | None
    providers: dict             # gpu address -> GpuProvider of the computed tree
    models: dict                # gpu address -> "vendor:device"
    configured: dict            # gpu address -> the type nova.conf gives it, if any
    reconciler: dict | None
    audit: dict | None          # what the last ``vgpu-manage audit`` found
    types: tuple[str, ...]
    grace: float
    migration_timeout: float
    now: float


def build_reading(view, snapshot, config, tree, claim_list, users, reconciler, audit_record,
                  vgpu_conf, now):
    """The :class:`Reading` of sources already read: ``view`` is their
    :func:`vgpu_driver.status.of_host`, ``config`` the MdevConfig the
    ``tree`` was computed with, ``users`` ``{vgpu id: DomainRef}`` (None:
    libvirt could not say), ``vgpu_conf`` the ``[vgpu]`` options."""
    resolved = config.for_host(snapshot)
    return Reading(
        host=view, claims=tuple(claim_list),
        vgpus=frozenset(v.id for v in snapshot.vgpus),
        users=None if users is None else frozenset(users),
        providers={p.gpu: p for p in tree.providers},
        models={gpu.address: fleet.gpu_device_id(gpu) or "" for gpu in snapshot.gpus},
        configured={gpu.address: ",".join(inventory.configured_type(gpu, resolved)[0])
                    or None for gpu in snapshot.gpus},
        reconciler=reconciler, audit=audit_record,
        types=tuple(t.type_id for t in config.types),
        grace=vgpu_conf.claim_grace, migration_timeout=vgpu_conf.migration_claim_timeout,
        now=now)


def _name(*parts):
    return "_".join((PREFIX,) + parts)


def _gauge(name, doc, labels=()):
    return core.GaugeMetricFamily(_name(name), doc, labels=list(labels))


class HostCollector:
    """A prometheus_client collector: ``read()`` gives a :class:`Reading`,
    called once for each scrape.

    A reading that fails with one of ``expected`` errors (the host's sysfs
    gone, a journal that cannot be read) is handed to ``failed(exc)`` and
    the scrape holds only ``vgpu_scrape_success 0``: a series to alert on,
    where an exception would be an HTTP 500 with nothing in it.
    """

    def __init__(self, read, expected=(), failed=None):
        self._read = read
        self._expected = tuple(expected)
        self._failed = failed

    def describe(self):
        return []       # the families depend on the reading: no describe at register

    def collect(self):
        success = _gauge("scrape_success", "1 when this scrape read the host, 0 when it "
                         "could not (the exporter's log says why).")
        try:
            reading = self._read()
        except self._expected as exc:
            if self._failed is not None:
                self._failed(exc)
            success.add_metric([], 0)
            yield success
            return
        success.add_metric([], 1)
        yield success
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


def registry_of(read, expected=(), failed=None):
    """A prometheus_client registry holding one :class:`HostCollector`."""
    found = prometheus_registry.CollectorRegistry(auto_describe=False)
    found.register(HostCollector(read, expected, failed))
    return found


def write_textfile(path, registry):
    """``path`` replaced whole by ``registry``'s exposition (written beside
    it, then renamed), readable by all whatever the umask: node_exporter
    runs as its own user.  The temporary name does not end in ``.prom``,
    so the collector never reads it; OSError if it cannot be written.  The
    temporary file is new (``O_EXCL``, following no link): the directory
    may be another user's (node_exporter's)."""
    text = prometheus_client.generate_latest(registry)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            fd = os.open(tmp, flags, 0o644)
        except FileExistsError:     # left by a process killed with this pid, or put there
            os.unlink(tmp)
            fd = os.open(tmp, flags, 0o644)
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), 0o644)
            out.write(text)
        os.replace(tmp, path)
    except OSError:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def _gpu_labels(reading, gpu):
    provider = reading.providers.get(gpu.gpu)
    return [gpu.gpu, gpu.provider or "", gpu.type_id or reading.configured.get(gpu.gpu) or "",
            provider.resource_class if provider else "", reading.models.get(gpu.gpu, "")]


def _gpu_families(reading):
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


def _host_families(reading):
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


def _bound(reading, state):
    """Seconds after which the host reconciler drops an unused claim of
    ``state`` (None: never)."""
    if state == claims.ATTACHED:
        return None
    if state == claims.MIGRATING_IN:
        return reading.migration_timeout or None
    return reading.grace


def _claim_families(reading):
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


def _reconciler_families(reading):
    state = reading.reconciler
    running = host_reconciler.is_running(state)
    up = _gauge("reconciler_up", "1 while the process that runs the host reconciler "
                "(nova-compute) is alive.")
    up.add_metric([], 1 if running else 0)
    stuck = host_reconciler.removals_in_flight(state, reading.now)
    removals = _gauge("removals_stuck", "vGPU removals the kernel blocks (a guest's QEMU "
                      "still holds the device).")
    removals.add_metric([], len(stuck))
    oldest = _gauge("removals_stuck_oldest_seconds", "Seconds the oldest blocked removal "
                    "has waited (0 with none).")
    oldest.add_metric([], max(stuck.values(), default=0.0))
    families = [up, removals, oldest]
    if not running:
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


def _timed(record, name, what):
    """``<name>_timestamp_seconds`` and ``<name>_duration_seconds`` of a
    ``{"started_at", "duration"}`` record; none without one."""
    if not record:
        return []
    when = _gauge(f"{name}_timestamp_seconds", f"When {what} started (Unix time).")
    when.add_metric([], record["started_at"])
    took = _gauge(f"{name}_duration_seconds", f"How long {what} took.")
    took.add_metric([], record["duration"])
    return [when, took]


def _audit_families(reading):
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
