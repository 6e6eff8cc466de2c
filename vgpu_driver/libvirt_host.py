"""libvirt's view: which domain (active or inactive) uses which vGPU.

A vGPU is an mdev (an mdev hostdev names its UUID) or, on NVIDIA's
vendor-specific VFIO framework, a VF (a PCI hostdev names its address); the
index holds both.  Every defined domain counts, running or not: a shut-off
guest still owns its vGPU.  :class:`LibvirtHost` keeps an index
``{vgpu id: DomainRef}`` that is built once and then kept current by
libvirt's domain events (each event re-reads the one domain it names), so
deciding whether a vGPU is free costs nothing however many domains the host
has.  Changes libvirt sends no event
for (a device added to a shut-off guest's saved config) are caught by a full
re-read at most ``max_staleness`` seconds old.  Without an event loop every
lookup re-reads the domains.
"""

import os
import re
import threading
import time
from types import MappingProxyType

from oslo_log import log as logging

from vgpu_driver import domains
from vgpu_driver import guest
from vgpu_driver.exception import LibvirtUnavailable

LOG = logging.getLogger(__name__)

_event_loop_lock = threading.Lock()
_event_loop_started = False


def _libvirt(uri):
    try:
        import libvirt
    except ImportError as exc:
        raise LibvirtUnavailable(uri=uri, reason="libvirt-python is not installed "
                                                 "(pip install vgpu-driver[libvirt])") from exc
    return libvirt


def start_event_loop(uri="libvirt"):
    """Run libvirt's default event loop in a daemon thread, once per process.

    nova-compute runs its own; tools and tests that want event-driven
    indexes call this first.
    """
    global _event_loop_started
    libvirt = _libvirt(uri)
    with _event_loop_lock:
        if _event_loop_started:
            return
        libvirt.virEventRegisterDefaultImpl()

        def run():
            while True:
                libvirt.virEventRunDefaultImpl()

        threading.Thread(target=run, name="libvirt-events", daemon=True).start()
        _event_loop_started = True


def version_tuple(number):
    """libvirt's packed version (major * 1e6 + minor * 1e3 + micro)."""
    return number // 1_000_000, number // 1_000 % 1_000, number % 1_000


def kernel_version(release=None):
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", release or os.uname().release)
    return tuple(int(x or 0) for x in match.groups()) if match else (0, 0, 0)


def read_domain(dom):
    """``(DomainRef, vgpu ids)`` of one domain: one XML read."""
    ref = domains.DomainRef(dom.UUIDString(), dom.name())
    return ref, tuple(guest.vgpu_ids(guest.parse(dom.XMLDesc(0))))


def index_users(by_domain):
    """``{vgpu id: DomainRef}`` from ``{domain uuid: (DomainRef, vgpu ids)}``."""
    return {mdev: ref for ref, mdevs in by_domain.values() for mdev in mdevs}


class LibvirtHost(domains.DomainReferences):
    """A libvirt connection and the mdev index over its domains."""

    sees_pci_hostdevs = True

    EVENTS = ("VIR_DOMAIN_EVENT_ID_LIFECYCLE", "VIR_DOMAIN_EVENT_ID_DEVICE_ADDED",
              "VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED")

    def __init__(self, uri, use_events=True, max_staleness=60.0):
        """``max_staleness``: seconds after which even an event-driven index
        is re-read in full.  libvirt sends no event when a shut-off guest's
        saved config gains or loses a device (``attach-device --config``), so
        events alone could leave such an mdev looking free forever."""
        self.uri = uri
        self.max_staleness = max_staleness
        self._refreshed_at = float("-inf")
        libvirt = self._libvirt = _libvirt(uri)
        # Errors are raised as exceptions; libvirt need not also print them.
        libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
        try:
            self.conn = libvirt.open(uri)
        except libvirt.libvirtError as exc:
            raise LibvirtUnavailable(uri=uri, reason=str(exc)) from exc
        self._lock = threading.Lock()
        self._by_domain = {}
        self._users = MappingProxyType({})
        self._callbacks = []
        self.event_driven = use_events and _event_loop_started and self._listen()
        if self.event_driven:
            # Events patch this first scan; without them every lookup scans
            # anyway, so a scan here would only read every domain twice.
            self.refresh()

    def _listen(self):
        """Subscribe before the first scan, so no change falls in between."""
        try:
            for name in self.EVENTS:
                self._callbacks.append(self.conn.domainEventRegisterAny(
                    None, getattr(self._libvirt, name), self._on_event, None))
        except self._libvirt.libvirtError as exc:
            LOG.warning("libvirt at %s sends no domain events (%s); mdev users are "
                        "read by a full scan each time", self.uri, exc)
            self.close()
            return False
        return True

    def close(self):
        """Stop hearing domain events (the connection stays, for scans)."""
        for callback in self._callbacks:
            try:
                self.conn.domainEventDeregisterAny(callback)
            except self._libvirt.libvirtError:
                pass
        self._callbacks = []

    def disconnect(self):
        """Close the connection: a process that reads once per request
        (``vgpu-manage metrics serve``) leaves no socket behind."""
        self.close()
        try:
            self.conn.close()
        except self._libvirt.libvirtError as exc:
            LOG.debug("Closing the connection to %s: %s", self.uri, exc)

    # -- the index ---------------------------------------------------------------------

    def refresh(self):
        """Rebuild the index from every defined domain (one XML read each).

        The scan holds the lock: an event that comes meanwhile waits and then
        applies on top, instead of being overwritten by an older listing.
        """
        with self._lock:
            by_domain = {}
            for dom in self.conn.listAllDomains(0):
                try:
                    by_domain[dom.UUIDString()] = read_domain(dom)
                except self._libvirt.libvirtError:
                    continue  # undefined while we listed
            self._by_domain = by_domain
            self._users = MappingProxyType(index_users(by_domain))
            self._refreshed_at = time.monotonic()


    def _on_event(self, _conn, dom, *_args):
        """One domain changed: read it again (or drop it if it is gone)."""
        try:
            gone = not dom.isPersistent() and not dom.isActive()
            entry = None if gone else read_domain(dom)
        except self._libvirt.libvirtError:
            entry = None  # undefined before we looked
        with self._lock:
            # _by_domain is only read under the lock or by single lookups, so it
            # changes in place; the mdev map readers iterate is replaced whole.
            users = self._users.copy()
            old_ref, old_mdevs = self._by_domain.pop(dom.UUIDString(), (None, ()))
            for mdev in old_mdevs:
                if users.get(mdev) is old_ref:
                    del users[mdev]
            if entry is not None:
                self._by_domain[dom.UUIDString()] = entry
                users.update(dict.fromkeys(entry[1], entry[0]))
            self._users = MappingProxyType(users)

    def mdev_users(self):
        if (not self.event_driven
                or time.monotonic() - self._refreshed_at > self.max_staleness):
            self.refresh()
        return self._users

    def domain_mdevs(self, domain_uuid):
        """The vGPU ids (mdev UUIDs, PCI hostdev addresses) one domain
        references (by the index)."""
        self.mdev_users()   # a scan-per-lookup index is read now
        entry = self._by_domain.get(domain_uuid)
        return entry[1] if entry else ()

    # -- versions ------------------------------------------------------------------------

    def versions(self):
        """``{"libvirt": (x, y, z), "qemu": ..., "kernel": ...}`` of this host."""
        try:
            hypervisor = version_tuple(self.conn.getVersion())
        except self._libvirt.libvirtError:
            hypervisor = (0, 0, 0)
        return {"libvirt": version_tuple(self.conn.getLibVersion()),
                "qemu": hypervisor, "kernel": kernel_version()}
