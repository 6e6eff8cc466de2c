"""A host's vGPUs, claims and host reconciler as Prometheus metrics.

Operators graph and alert in Prometheus; ``status`` has the facts, but only
as a screen.  A :class:`HostCollector` reads its sources once per scrape (a
:class:`Reading`, what ``status`` reads) and turns that one reading into
metric families (:mod:`vgpu_driver.metrics_series`), so two series of one
scrape never disagree.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

import prometheus_client
from prometheus_client import registry as prometheus_registry

from vgpu_driver import inventory
from vgpu_driver import metrics_series
from vgpu_driver.conf import fleet

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from vgpu_driver.claims import Claim
    from vgpu_driver.conf.mdev_settings import MdevConfig
    from vgpu_driver.domains import DomainRef
    from vgpu_driver.host_snapshot import HostSnapshot
    from vgpu_driver.inventory import GpuProvider
    from vgpu_driver.inventory import ProviderTree
    from vgpu_driver.status import HostStatus


@dataclasses.dataclass(frozen=True)
class Reading:
    """One scrape's sources, each read once.

    ``host`` is the :class:`~vgpu_driver.status.HostStatus` of the same
    reads; ``claims`` the journal's claims; ``vgpus`` the ids of the vGPUs
    that exist in sysfs; ``users`` the vGPU ids libvirt's domains use
    (None: libvirt could not say), ``guests`` their ``{vgpu id: DomainRef}``;
    ``vgpu_gpus`` ``{vgpu id: (gpu address, type id)}`` of the vGPUs in sysfs;
    ``configured`` ``{gpu address: (type id, ...)}`` nova.conf gives;
    ``reconciler`` what the host reconciler last wrote (None: it never ran
    here), ``audit`` what the last audit recorded (None: none ran here);
    ``grace`` and ``migration_timeout`` the bounds the reconciler drops
    claims after.
    """

    host: HostStatus
    claims: tuple[Claim, ...]
    vgpus: frozenset[str]
    users: frozenset[str] | None
    guests: dict[str, DomainRef] | None
    vgpu_gpus: dict[str, tuple[str, str]]  # vgpu id -> (gpu address, type id)
    providers: dict[str, GpuProvider]  # gpu address -> GpuProvider of the computed tree
    models: dict[str, str]  # gpu address -> "vendor:device"
    configured: dict[str, tuple[str, ...]]  # gpu address -> the types nova.conf gives it
    reconciler: dict[str, Any] | None
    audit: dict[str, Any] | None  # what the last ``vgpu-manage audit`` found
    types: tuple[str, ...]
    grace: float
    migration_timeout: float
    now: float
    # How long reading the sources took, when the reader timed it (else the
    # scrape's own time is the duration).
    read_seconds: float | None = None


def build_reading(
    view: HostStatus,
    snapshot: HostSnapshot,
    config: MdevConfig,
    tree: ProviderTree,
    claim_list: Iterable[Claim],
    users: Mapping[str, DomainRef] | None,
    reconciler: dict[str, Any] | None,
    audit_record: dict[str, Any] | None,
    vgpu_conf: Any,
    now: float,
) -> Reading:
    """The :class:`Reading` of sources already read: ``view`` is their
    :func:`vgpu_driver.status_assembly.of_host`, ``config`` the MdevConfig the
    ``tree`` was computed with, ``users`` ``{vgpu id: DomainRef}`` (None:
    libvirt could not say), ``vgpu_conf`` the ``[vgpu]`` options."""
    vgpu_gpus = {}
    for vgpu in snapshot.vgpus:
        gpu = snapshot.gpu_of_parent(vgpu.parent)
        if gpu is not None:
            vgpu_gpus[vgpu.id] = (gpu.address, vgpu.type_id)
    return Reading(
        host=view,
        claims=tuple(claim_list),
        vgpus=frozenset(v.id for v in snapshot.vgpus),
        users=None if users is None else frozenset(users),
        guests=None if users is None else dict(users),
        vgpu_gpus=vgpu_gpus,
        providers={p.gpu: p for p in tree.providers},
        models={gpu.address: fleet.gpu_device_id(gpu) or "" for gpu in snapshot.gpus},
        configured=inventory.configured_types(snapshot, config),
        reconciler=reconciler,
        audit=audit_record,
        types=tuple(t.type_id for t in config.types),
        grace=vgpu_conf.claim_grace,
        migration_timeout=vgpu_conf.migration_claim_timeout,
        now=now,
    )


class HostCollector:
    """A prometheus_client collector: ``read()`` gives a :class:`Reading`,
    called once for each scrape.

    With ``failed`` (a server answering scrapes), a reading that fails,
    with one of ``expected`` errors (the host's sysfs gone, a journal that
    cannot be read) or any other, is handed to ``failed(exc, expected)``
    and the scrape holds ``vgpu_scrape_success 0`` and how long it took: a
    series to alert on, where an exception would be an HTTP 500 with
    nothing in it.  Without ``failed`` the error goes to the caller.
    """

    def __init__(
        self,
        read: Callable[[], Reading],
        expected: Iterable[type[BaseException]] = (),
        failed: Callable[[BaseException, bool], object] | None = None,
    ) -> None:
        self._read = read
        self._expected = tuple(expected)
        self._failed = failed

    def describe(self) -> list[Metric]:
        return []  # the families depend on the reading: no describe at register

    def collect(self) -> Iterator[Metric]:
        started = time.monotonic()
        try:
            reading = self._read()
        except Exception as exc:
            if self._failed is None:
                raise
            self._failed(exc, isinstance(exc, self._expected))
            yield metrics_series.scrape_success(0)
            yield metrics_series.scrape_duration(time.monotonic() - started)
            return
        yield metrics_series.scrape_success(1)
        took = reading.read_seconds
        yield metrics_series.scrape_duration(time.monotonic() - started if took is None else took)
        yield from metrics_series.families(reading)


def registry_of(
    read: Callable[[], Reading],
    expected: Iterable[type[BaseException]] = (),
    failed: Callable[[BaseException, bool], object] | None = None,
) -> prometheus_registry.CollectorRegistry:
    """A prometheus_client registry holding one :class:`HostCollector`."""
    found = prometheus_registry.CollectorRegistry(auto_describe=False)
    found.register(HostCollector(read, expected, failed))
    return found


def write_textfile(path: str, registry: prometheus_registry.CollectorRegistry) -> None:
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
        except FileExistsError:  # left by a process killed with this pid, or put there
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
