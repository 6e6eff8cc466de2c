"""Who uses which vGPU, kept current by events on a connection someone else owns.

A compute service already holds a libvirt connection and runs libvirt's
event loop (nova-compute does both).  This index rides on them: the owner
forwards each domain event as :meth:`DomainIndex.domain_changed`, which only
notes the domain's UUID.  It runs on the event loop's thread, so it makes no
libvirt call and takes no lock that could block that thread (or, under
eventlet, need the hub).  A lookup applies the noted changes first, reading
just those domains, so an allocation costs O(changed domains), not
O(domains).

A full re-read happens on first use, on a connection the owner did not
report through :meth:`connected` (its events may never come), without
events, and when the last full re-read is ``max_staleness`` seconds old:
libvirt sends no event when a shut-off guest's saved config gains or loses
a device.

A lookup that meets an error (but libvirt's "no such domain") raises and
publishes nothing: the changes it could not apply stay noted, a failed full
re-read is done again.  The caller fails rather than take a guest's vGPU for
free.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from vgpu_driver import domains
from vgpu_driver import guest

_NEVER: tuple[Any, float] = (None, float("-inf"))
# One domain's entry: who it is, and the vGPU ids it references.
Entry = tuple[domains.DomainRef, tuple[str, ...]]
# Both maps: ``({domain uuid: Entry}, {vgpu id: DomainRef})``.
Maps = tuple[dict[str, Entry], MappingProxyType[str, domains.DomainRef]]


def read_domain(dom: Any) -> Entry:
    """``(DomainRef, vgpu ids)`` of one domain: one XML read."""
    ref = domains.DomainRef(dom.UUIDString(), dom.name())
    return ref, tuple(guest.vgpu_ids(guest.parse(dom.XMLDesc(0))))


def index_users(by_domain: Mapping[str, Entry]) -> dict[str, domains.DomainRef]:
    """``{vgpu id: DomainRef}`` from ``{domain uuid: (DomainRef, vgpu ids)}``."""
    return {mdev: ref for ref, mdevs in by_domain.values() for mdev in mdevs}


class DomainIndex(domains.DomainReferences):
    """``{vgpu id: DomainRef}`` over every defined domain of a connection."""

    sees_pci_hostdevs = True

    def __init__(
        self, connection: Callable[[], Any], libvirt: Any, max_staleness: float = 60.0
    ) -> None:
        """``connection``: a callable returning the owner's current
        connection; ``libvirt``: the module it comes from (its errors)."""
        self._connection = connection
        self._libvirt = libvirt
        self.max_staleness = max_staleness
        #: Set by the owner once its event loop runs; events count only on
        #: the connection they were registered on (see :meth:`connected`).
        self.event_driven = False
        self._evented: Any = None
        self._changed: collections.deque[str] = collections.deque()
        self._lock = threading.Lock()
        #: ``({domain uuid: (DomainRef, vgpu ids)}, {vgpu id: DomainRef})``,
        #: replaced whole, never changed in place: a reader holding it sees
        #: one state of both maps.
        self._maps: Maps = ({}, MappingProxyType({}))
        #: The evented connection the last full read was made on (None if
        #: on another) and when it began: events patch only that listing.
        self._listed = _NEVER

    # -- fed by the owner's event loop ------------------------------------------------

    def domain_changed(self, domain_uuid: str) -> None:
        """A domain was defined, started, stopped, changed or undefined."""
        self._changed.append(domain_uuid)

    def connected(self, conn: Any) -> None:
        """The owner registered its domain callbacks on a new ``conn``: the
        old one's events are lost, so everything is read again."""
        self._evented = conn
        self._listed = _NEVER

    # -- lookups ------------------------------------------------------------------------

    def mdev_users(self) -> Mapping[str, domains.DomainRef]:
        return self._current()[1]

    def domain_mdevs(self, domain_uuid: str) -> tuple[str, ...]:
        """The vGPU ids one domain references, by the index."""
        entry = self._current()[0].get(domain_uuid)
        return entry[1] if entry else ()

    def domain_uuids(self) -> frozenset[str]:
        """The UUIDs of every defined domain, by the index."""
        return frozenset(self._current()[0])

    def domain_now(self, domain_uuid: str) -> tuple[str, ...]:
        """The vGPU ids one domain references as libvirt has it now: it is
        read again first (a caller that just defined or changed it need not
        wait for the event)."""
        self.domain_changed(domain_uuid)
        return self.domain_mdevs(domain_uuid)

    def refresh(self) -> None:
        """Read every domain again now (a full re-read, as at first use)."""
        with self._lock:
            evented, conn = self._evented, self._connection()
            self._refresh(conn, conn if conn is evented else None)

    def _current(self) -> Maps:
        """Both maps, brought up to date.  On any error nothing is published
        and no change is forgotten: the caller fails rather than act on a
        view missing a guest's vGPUs."""
        with self._lock:
            # Taken before the connection: should the owner reconnect from
            # here on, a listing made now is not taken for the new one's.
            evented = self._evented
            conn = self._connection()
            if self._must_reread(conn):
                self._refresh(conn, conn if conn is evented else None)
            elif self._changed:
                self._apply_changes(conn)
            return self._maps

    def _must_reread(self, conn: Any) -> bool:
        listed_on, started = self._listed
        return (
            not self.event_driven
            or conn is not self._evented
            or listed_on is not conn
            or time.monotonic() - started > self.max_staleness
        )

    def _refresh(self, conn: Any, evented: Any) -> None:
        """Read every domain; ``evented``: ``conn`` if its events are heard."""
        # Until this listing is published, the next lookup reads again.
        self._listed = _NEVER
        # Events noted from here on are applied on top of this listing.
        self._changed.clear()
        started = time.monotonic()
        by_domain: dict[str, Entry] = {}
        every = (
            self._libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE
            | self._libvirt.VIR_CONNECT_LIST_DOMAINS_INACTIVE
        )
        for dom in conn.listAllDomains(every):
            entry = self._read_listed(dom)
            if entry is not None:
                by_domain[entry[0].uuid] = entry
        self._maps = (by_domain, MappingProxyType(index_users(by_domain)))
        self._listed = (evented, started)

    def _apply_changes(self, conn: Any) -> None:
        """Re-read the changed domains into new maps; on an error, put their
        events back for the next lookup."""
        changed = self._take_changes()
        by_domain, users = dict(self._maps[0]), dict(self._maps[1])
        try:
            for uuid in changed:
                _replace(by_domain, users, uuid, self._read(conn, uuid))
        except BaseException:
            self._changed.extendleft(reversed(changed))
            raise
        self._maps = (by_domain, MappingProxyType(users))

    def _take_changes(self) -> list[str]:
        """The domains changed so far, each once, in the order first noted."""
        changed: dict[str, None] = {}
        while self._changed:
            changed[self._changed.popleft()] = None
        return list(changed)

    def _read(self, conn: Any, uuid: str) -> Entry | None:
        """The domain's entry, or None once it is no longer defined."""
        return self._unless_undefined(lambda: read_domain(conn.lookupByUUIDString(uuid)))

    def _read_listed(self, dom: Any) -> Entry | None:
        """A listed domain's entry, or None if undefined since the listing."""
        return self._unless_undefined(lambda: read_domain(dom))

    def _unless_undefined(self, read: Callable[[], Entry]) -> Entry | None:
        try:
            return read()
        except self._libvirt.libvirtError as exc:
            if exc.get_error_code() == self._libvirt.VIR_ERR_NO_DOMAIN:
                return None
            raise


def _replace(
    by_domain: dict[str, Entry], users: dict[str, domains.DomainRef], uuid: str, entry: Entry | None
) -> None:
    """Put one domain's new ``entry`` (None: undefined) in both maps."""
    old_ref, old_mdevs = by_domain.pop(uuid, (None, ()))
    for mdev in old_mdevs:
        if users.get(mdev) is old_ref:
            del users[mdev]
    if entry is not None:
        by_domain[uuid] = entry
        users.update(dict.fromkeys(entry[1], entry[0]))
