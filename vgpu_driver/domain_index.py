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
events, and
when the last one is ``max_staleness`` seconds old: libvirt sends no event
when a shut-off guest's saved config gains or loses a device.
"""

import collections
import threading
import time
from types import MappingProxyType

from vgpu_driver import domains
from vgpu_driver import libvirt_host


class DomainIndex(domains.DomainReferences):
    """``{vgpu id: DomainRef}`` over every defined domain of a connection."""

    sees_pci_hostdevs = True

    def __init__(self, connection, libvirt, max_staleness=60.0):
        """``connection``: a callable returning the owner's current
        connection; ``libvirt``: the module it comes from (its errors)."""
        self._connection = connection
        self._libvirt = libvirt
        self.max_staleness = max_staleness
        #: Set by the owner once its event loop runs; events count only on
        #: the connection they were registered on (see :meth:`connected`).
        self.event_driven = False
        self._evented = None
        self._changed = collections.deque()
        self._lock = threading.Lock()
        self._by_domain = {}
        self._users = MappingProxyType({})
        self._refreshed_at = float("-inf")

    # -- fed by the owner's event loop ------------------------------------------------

    def domain_changed(self, domain_uuid):
        """A domain was defined, started, stopped, changed or undefined."""
        self._changed.append(domain_uuid)

    def connected(self, conn):
        """The owner registered its domain callbacks on a new ``conn``: the
        old one's events are lost, so everything is read again."""
        self._evented = conn
        self._refreshed_at = float("-inf")

    # -- lookups ------------------------------------------------------------------------

    def mdev_users(self):
        with self._lock:
            conn = self._connection()
            if (not self.event_driven or conn is not self._evented
                    or time.monotonic() - self._refreshed_at > self.max_staleness):
                self._refresh(conn)
            elif self._changed:
                self._apply_changes(conn)
            return self._users

    def domain_mdevs(self, domain_uuid):
        """The vGPU ids one domain references, by the index."""
        entry = self.mdev_users() and self._by_domain.get(domain_uuid)
        return entry[1] if entry else ()

    def _refresh(self, conn):
        # Events noted from here on are applied on top of this listing.
        self._changed.clear()
        started = time.monotonic()
        by_domain = {}
        every = (self._libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE
                 | self._libvirt.VIR_CONNECT_LIST_DOMAINS_INACTIVE)
        for dom in conn.listAllDomains(every):
            try:
                by_domain[dom.UUIDString()] = libvirt_host.read_domain(dom)
            except self._libvirt.libvirtError:
                continue  # undefined while we listed
        self._by_domain = by_domain
        self._users = MappingProxyType(libvirt_host.index_users(by_domain))
        self._refreshed_at = started

    def _apply_changes(self, conn):
        users = dict(self._users)
        while self._changed:
            uuid = self._changed.popleft()
            entry = self._read(conn, uuid)
            old_ref, old_mdevs = self._by_domain.pop(uuid, (None, ()))
            for mdev in old_mdevs:
                if users.get(mdev) is old_ref:
                    del users[mdev]
            if entry is not None:
                self._by_domain[uuid] = entry
                users.update(dict.fromkeys(entry[1], entry[0]))
        self._users = MappingProxyType(users)

    def _read(self, conn, uuid):
        """The domain's entry, or None once it is no longer defined."""
        try:
            return libvirt_host.read_domain(conn.lookupByUUIDString(uuid))
        except self._libvirt.libvirtError as exc:
            if exc.get_error_code() == self._libvirt.VIR_ERR_NO_DOMAIN:
                return None
            raise
