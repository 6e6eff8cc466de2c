"""A domain index fed by libvirt's events, as nova-compute feeds it.

In nova-compute the feed is nova's (:mod:`vgpu_driver.nova.events`): nova's
``Host`` runs libvirt's event loop and forwards each domain event of its
connection to :meth:`DomainIndex.domain_changed`.  Tests and benchmarks
without nova do the same here: :func:`start_event_loop` runs libvirt's
default event loop, :class:`EventedIndex` opens a connection, registers
the domain events nova registers, and only notes the domain's UUID on each.
"""

import collections
import threading

import libvirt

from vgpu_driver import domain_index

EVENTS = ("VIR_DOMAIN_EVENT_ID_LIFECYCLE", "VIR_DOMAIN_EVENT_ID_DEVICE_REMOVED")

_lock = threading.Lock()
_started = False


def start_event_loop():
    """Run libvirt's default event loop in a daemon thread, once per
    process, before any connection that wants events is opened."""
    global _started
    with _lock:
        if _started:
            return
        libvirt.virEventRegisterDefaultImpl()

        def run():
            while True:
                libvirt.virEventRunDefaultImpl()

        threading.Thread(target=run, name="libvirt-events", daemon=True).start()
        _started = True


class EventedIndex(domain_index.DomainIndex):
    """A :class:`DomainIndex` over a connection of its own, fed by its events."""

    def __init__(self, uri, max_staleness=60.0):
        libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
        self.conn = libvirt.open(uri)
        super().__init__(lambda: self.conn, libvirt, max_staleness=max_staleness)
        #: ``{domain uuid: events heard}``: a test waits for an event to have
        #: come before it asserts what the index makes of it.
        self.heard = collections.Counter()
        self._callbacks = [
            self.conn.domainEventRegisterAny(None, getattr(libvirt, name), self._on_event, None)
            for name in EVENTS
        ]
        # As nova's driver does once its event loop runs on this connection.
        self.connected(self.conn)
        self.event_driven = True

    def _on_event(self, _conn, dom, *_args):
        self.domain_changed(dom.UUIDString())
        self.heard[dom.UUIDString()] += 1

    def close(self):
        """Stop hearing events and close the connection."""
        for callback in self._callbacks:
            self.conn.domainEventDeregisterAny(callback)
        self._callbacks = []
        self.conn.close()
