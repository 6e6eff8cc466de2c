"""Feed a :class:`~vgpu_driver.domain_index.DomainIndex` from nova's own
libvirt connection and event loop.

nova's ``Host`` registers its domain callbacks each time it connects, by
looking them up on itself; wrapping them on the one ``Host`` object nova's
driver (and its VIF driver, its volume drivers...) share means the index
hears every event nova hears, on nova's event thread, without a second
registration (some libvirt bindings keep one callback per event kind).
The wrappers only note the domain's UUID, as nova's own callbacks only
queue: no logging, no locks there.
"""

from nova.virt.libvirt import host as nova_host

from vgpu_driver import domain_index


def domain_index_of(host, max_staleness=60.0):
    """An index over ``host``'s connection that ``host``'s events keep current."""
    # Looked up at each call: whoever replaces the Host's get_connection
    # (nova's functional fixtures do) is followed.
    index = domain_index.DomainIndex(
        lambda: host.get_connection(), nova_host.libvirt, max_staleness=max_staleness
    )
    _note_domain_events(host, index, "_event_lifecycle_callback")
    _note_domain_events(host, index, "_event_device_removed_callback")
    _invalidate_on_reconnect(host, index)
    return index


def _note_domain_events(host, index, name):
    nova_callback = getattr(host, name)

    def callback(conn, dom, *args):
        index.domain_changed(dom.UUIDString())
        return nova_callback(conn, dom, *args)

    setattr(host, name, callback)


def _invalidate_on_reconnect(host, index):
    """nova registered its callbacks on this new connection: the index
    trusts events on it, and on no other one."""
    connect = host._get_new_connection

    def get_new_connection():
        conn = connect()
        index.connected(conn)
        return conn

    host._get_new_connection = get_new_connection
