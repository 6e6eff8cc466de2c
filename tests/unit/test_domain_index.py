"""The event-fed domain index, over libvirt's own test driver.

The index is fed as nova-compute feeds it: :meth:`DomainIndex.domain_changed`
with a domain's UUID after libvirt changed that domain.  Each test's host is
a private test-driver instance (a node file), so no two tests share domains.
"""

import collections
import uuid

import libvirt
import pytest

from tests import libvirt_domains
from vgpu_driver import domain_index


def new_id():
    return str(uuid.uuid4())


def internal_error():
    """A libvirt error that is not "no such domain", as a daemon may raise."""
    exc = libvirt.libvirtError("internal error: injected")
    exc.err = (
        libvirt.VIR_ERR_INTERNAL_ERROR,
        libvirt.VIR_FROM_DOMAIN,
        "internal error: injected",
        libvirt.VIR_ERR_ERROR,
        None,
        None,
        None,
        0,
        0,
    )
    return exc


class Connection:
    """A real libvirt connection that counts calls, fails reads of the
    domains in :attr:`failing`, and can run ``after_listing`` in between
    a listing and the reads that follow it."""

    def __init__(self, conn):
        self._conn = conn
        self.calls = collections.Counter()
        self.failing = set()
        self.after_listing = None

    def __getattr__(self, name):
        return getattr(self._conn, name)

    def listAllDomains(self, flags=0):
        self.calls["listAllDomains"] += 1
        listed = [Domain(dom, self) for dom in self._conn.listAllDomains(flags)]
        if self.after_listing:
            self.after_listing()
        return listed

    def lookupByUUIDString(self, domain_uuid):
        self.calls["lookupByUUIDString"] += 1
        return Domain(self._conn.lookupByUUIDString(domain_uuid), self)

    def fresh_calls(self):
        """The calls since the last time asked."""
        calls, self.calls = self.calls, collections.Counter()
        return calls


class Domain:
    """A real domain whose XML read fails while its connection says so."""

    def __init__(self, dom, conn):
        self._dom = dom
        self._conn = conn

    def __getattr__(self, name):
        return getattr(self._dom, name)

    def XMLDesc(self, flags=0):
        self._conn.calls["XMLDesc"] += 1
        if self._dom.UUIDString() in self._conn.failing:
            raise internal_error()
        return self._dom.XMLDesc(flags)


class Host:
    """A test-driver host, its connection(s) and an index over them."""

    def __init__(self, tmp_path, guests=()):
        libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
        self.uri = libvirt_domains.node_file(
            tmp_path / "node.xml",
            [libvirt_domains.domain_xml(name, mdevs) for name, mdevs in guests],
        )
        self.conn = self.reconnect()
        self.index = domain_index.DomainIndex(lambda: self.conn, libvirt)

    def reconnect(self):
        self.conn = Connection(libvirt.open(self.uri))
        return self.conn

    def evented(self):
        """As nova-compute does once its event loop runs on this connection."""
        self.index.connected(self.conn)
        self.index.event_driven = True
        return self

    def define(self, name, mdevs, domain_uuid=None, notify=True):
        dom = self.conn._conn.defineXML(
            libvirt_domains.domain_xml(name, mdevs, domain_uuid=domain_uuid)
        )
        if notify:
            self.index.domain_changed(dom.UUIDString())
        return dom.UUIDString()

    def undefine(self, domain_uuid, notify=True):
        self.conn._conn.lookupByUUIDString(domain_uuid).undefine()
        if notify:
            self.index.domain_changed(domain_uuid)

    def users(self):
        """``{vgpu id: domain name}`` by the index."""
        return {vgpu: ref.name for vgpu, ref in self.index.mdev_users().items()}


def assert_consistent(host, *domain_uuids):
    """Each domain's vGPUs by :meth:`domain_mdevs` are its ones in the
    listing of all users."""
    users = host.index.mdev_users()
    for domain_uuid in domain_uuids:
        listed = {vgpu for vgpu, ref in users.items() if ref.uuid == domain_uuid}
        assert set(host.index.domain_mdevs(domain_uuid)) == listed


@pytest.fixture
def mdevs():
    return [new_id() for _ in range(4)]


@pytest.fixture
def host(tmp_path, mdevs):
    """Two running guests with a vGPU each and one without, evented."""
    return Host(tmp_path, [("a", [mdevs[0]]), ("b", [mdevs[1]]), ("plain", [])]).evented()


# -- reads ---------------------------------------------------------------------------


def test_first_use_reads_every_domain(host, mdevs):
    assert host.users() == {mdevs[0]: "a", mdevs[1]: "b"}
    assert host.conn.fresh_calls() == {"listAllDomains": 1, "XMLDesc": 3}


def test_pci_hostdevs_are_indexed_by_address(tmp_path):
    host = Host(tmp_path).evented()
    dom = host.conn._conn.defineXML(libvirt_domains.domain_xml("vf-guest", vfs=["0000:41:00.4"]))
    assert host.users() == {"0000:41:00.4": "vf-guest"}
    assert host.index.domain_mdevs(dom.UUIDString()) == ("0000:41:00.4",)


def test_a_lookup_without_events_reads_nothing(host):
    host.users()
    host.conn.fresh_calls()
    host.users()
    assert host.conn.fresh_calls() == {}


def test_an_event_driven_lookup_reads_only_the_changed_domains(host, mdevs):
    host.users()
    host.conn.fresh_calls()
    host.define("c", [mdevs[2]])
    host.define("d", [mdevs[3]])
    assert host.users() == {mdevs[0]: "a", mdevs[1]: "b", mdevs[2]: "c", mdevs[3]: "d"}
    assert host.conn.fresh_calls() == {"lookupByUUIDString": 2, "XMLDesc": 2}


def test_many_events_for_one_domain_read_it_once(host, mdevs):
    host.users()
    host.conn.fresh_calls()
    dom = host.define("c", [mdevs[2]])
    host.index.domain_changed(dom)
    host.index.domain_changed(dom)
    assert host.users()[mdevs[2]] == "c"
    assert host.conn.fresh_calls() == {"lookupByUUIDString": 1, "XMLDesc": 1}


def test_define_device_change_and_undefine_are_followed(host, mdevs):
    host.users()
    dom = host.define("c", [mdevs[2]])
    assert host.users()[mdevs[2]] == "c"
    host.define("c", [mdevs[3]], domain_uuid=dom)
    users = host.users()
    assert users[mdevs[3]] == "c" and mdevs[2] not in users
    host.undefine(dom)
    assert host.users() == {mdevs[0]: "a", mdevs[1]: "b"}
    assert host.index.domain_mdevs(dom) == ()


def test_a_vgpu_moved_to_another_guest_stays_used(host, mdevs):
    host.users()
    c = host.define("c", [mdevs[2]])
    assert host.users()[mdevs[2]] == "c"
    # The new user's event is applied before the old user's.
    host.define("d", [mdevs[2]])
    host.define("c", [], domain_uuid=c)
    assert host.users()[mdevs[2]] == "d"


def test_a_listing_a_reader_holds_is_not_changed_by_later_lookups(host, mdevs):
    """What a lookup returned stays one state of the host while the reader
    holds it (the reconciler judges orphans on it, then acts): changes go
    into new maps, never into ones handed out, so no reader iterates a map
    that changes under it."""
    held = host.index.mdev_users()
    c = host.define("c", [mdevs[2]])
    assert host.users()[mdevs[2]] == "c"
    host.define("c", [mdevs[3]], domain_uuid=c)
    assert host.index.domain_mdevs(c) == (mdevs[3],)
    assert {vgpu: ref.name for vgpu, ref in held.items()} == {mdevs[0]: "a", mdevs[1]: "b"}


def test_a_domain_undefined_before_the_lookup_is_dropped(host, mdevs):
    host.users()
    dom = host.define("c", [mdevs[2]], notify=False)
    host.index.domain_changed(dom)
    host.undefine(dom)  # the lookup finds no such domain
    assert mdevs[2] not in host.users()
    # Defined and undefined between two lookups: never seen, nothing to drop.
    dom = host.define("e", [mdevs[3]])
    host.undefine(dom)
    assert host.users() == {mdevs[0]: "a", mdevs[1]: "b"}


def test_a_domain_undefined_while_listing_is_skipped(host, mdevs):
    gone = host.conn.lookupByName("b")
    gone.destroy()  # the node file's guests run; a shut-off one can go
    host.conn.after_listing = gone.undefine
    assert host.users() == {mdevs[0]: "a"}


def test_events_noted_during_a_full_read_are_applied_after_it(host, mdevs):
    late = []

    def define_late():
        late.append(host.define("late", [mdevs[2]]))

    host.conn.after_listing = define_late
    assert host.users() == {mdevs[0]: "a", mdevs[1]: "b"}
    host.conn.after_listing = None
    host.conn.fresh_calls()
    assert host.users()[mdevs[2]] == "late"
    assert host.conn.fresh_calls() == {"lookupByUUIDString": 1, "XMLDesc": 1}


# -- when everything is read again --------------------------------------------------


def test_a_connection_reported_as_connected_is_read_again_once(host, mdevs):
    host.users()
    host.reconnect()
    host.evented()
    assert host.users() == {mdevs[0]: "a", mdevs[1]: "b"}
    assert host.conn.fresh_calls() == {"listAllDomains": 1, "XMLDesc": 3}
    host.users()
    assert host.conn.fresh_calls() == {}


def test_events_on_an_unreported_connection_do_not_count(host, mdevs):
    host.users()
    host.reconnect()  # its events may never come
    host.define("c", [mdevs[2]])
    for _ in range(2):
        assert host.users()[mdevs[2]] == "c"
        assert host.conn.fresh_calls()["listAllDomains"] == 1


def test_a_reconnection_during_a_full_read_is_read_again(host, mdevs):
    """Events between the old connection's end and the new one's start are
    lost: a listing made while the owner reconnected cannot be trusted."""
    old = host.conn
    new = Connection(libvirt.open(host.uri))

    def reconnect():
        host.index.connected(new)

    old.after_listing = reconnect
    host.users()
    host.conn = new
    new._conn.defineXML(libvirt_domains.domain_xml("unheard", [mdevs[2]]))
    assert host.users()[mdevs[2]] == "unheard"
    assert new.fresh_calls()["listAllDomains"] == 1


class Clock:
    """The index's monotonic clock, moved by the test alone."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now


def test_a_stale_index_is_read_again(tmp_path, mdevs, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(domain_index, "time", clock)
    host = Host(tmp_path, [("a", [mdevs[0]])]).evented()
    host.index.max_staleness = 60
    host.users()
    guest = host.conn.lookupByName("a")
    guest.destroy()
    host.users()
    assert host.conn.fresh_calls()["listAllDomains"] == 1
    # No event says a shut-off guest's saved config gained a device: until
    # the listing is max_staleness old, the index does not know.
    host.define("a", [mdevs[0], mdevs[1]], domain_uuid=guest.UUIDString(), notify=False)
    clock.now += 60
    assert host.users() == {mdevs[0]: "a"}
    assert host.conn.fresh_calls() == {}
    clock.now += 0.001
    assert host.users() == {mdevs[0]: "a", mdevs[1]: "a"}
    assert host.conn.fresh_calls()["listAllDomains"] == 1


def test_without_events_every_lookup_reads_everything(tmp_path, mdevs):
    host = Host(tmp_path, [("a", [mdevs[0]])])
    host.index.connected(host.conn)
    for _ in range(2):
        assert host.users() == {mdevs[0]: "a"}
        assert host.conn.fresh_calls() == {"listAllDomains": 1, "XMLDesc": 1}


# -- faults ---------------------------------------------------------------------------


def test_a_failed_change_is_kept_and_nothing_half_applied(host, mdevs):
    host.users()
    first = host.define("c", [mdevs[2]])
    failing = host.define("d", [mdevs[3]])
    host.conn.failing.add(failing)
    with pytest.raises(libvirt.libvirtError):
        host.users()
    with pytest.raises(libvirt.libvirtError):
        host.users()
    host.conn.failing.clear()
    host.conn.fresh_calls()
    assert host.users() == {mdevs[0]: "a", mdevs[1]: "b", mdevs[2]: "c", mdevs[3]: "d"}
    assert host.conn.fresh_calls() == {"lookupByUUIDString": 2, "XMLDesc": 2}
    assert_consistent(host, first, failing)


def test_an_event_noted_during_a_failed_change_is_kept(host, mdevs):
    host.users()
    failing = host.define("c", [mdevs[2]])
    host.conn.failing.add(failing)
    lookup = host.conn.lookupByUUIDString

    def event_meanwhile(domain_uuid):
        host.conn.lookupByUUIDString = lookup
        host.define("d", [mdevs[3]])
        return lookup(domain_uuid)

    host.conn.lookupByUUIDString = event_meanwhile
    with pytest.raises(libvirt.libvirtError):
        host.users()
    host.conn.failing.clear()
    assert host.users() == {mdevs[0]: "a", mdevs[1]: "b", mdevs[2]: "c", mdevs[3]: "d"}


def test_an_undefine_before_a_failed_change_is_not_half_applied(host, mdevs):
    host.users()
    dom = host.define("c", [mdevs[2]])
    assert host.users()[mdevs[2]] == "c"
    host.undefine(dom)
    failing = host.conn.lookupByName("a").UUIDString()
    host.index.domain_changed(failing)
    host.conn.failing.add(failing)
    with pytest.raises(libvirt.libvirtError):
        host.users()
    host.conn.failing.clear()
    assert host.users() == {mdevs[0]: "a", mdevs[1]: "b"}
    assert_consistent(host, dom, failing)


def test_a_failed_full_read_raises_and_is_done_again(host, mdevs):
    host.conn.failing.add(host.conn.lookupByName("b").UUIDString())
    with pytest.raises(libvirt.libvirtError):
        host.users()
    with pytest.raises(libvirt.libvirtError):
        host.users()
    host.conn.failing.clear()
    host.conn.fresh_calls()
    assert host.users() == {mdevs[0]: "a", mdevs[1]: "b"}
    assert host.conn.fresh_calls()["listAllDomains"] == 1


def test_a_failed_full_read_after_a_good_one_is_done_again(host, mdevs):
    host.users()
    host.reconnect()
    host.evented()
    host.conn.failing.add(host.conn.lookupByName("b").UUIDString())
    with pytest.raises(libvirt.libvirtError):
        host.users()
    host.conn.failing.clear()
    host.conn.fresh_calls()
    assert host.users() == {mdevs[0]: "a", mdevs[1]: "b"}
    assert host.conn.fresh_calls()["listAllDomains"] == 1


# -- one domain -----------------------------------------------------------------------


def test_domain_mdevs_names_one_domains_vgpus(host, mdevs):
    dom = host.define("two", [mdevs[2], mdevs[3]])
    assert set(host.index.domain_mdevs(dom)) == {mdevs[2], mdevs[3]}
    assert host.index.domain_mdevs(host.conn.lookupByName("plain").UUIDString()) == ()
    assert host.index.domain_mdevs(new_id()) == ()


def test_domain_now_reads_a_domain_whose_event_has_not_come(tmp_path):
    """The nova adapter asks the index which vGPUs a domain it just defined
    uses: that domain is read again, event or not; ``domain_uuids`` names
    every defined domain, with vGPUs or without."""
    host = Host(tmp_path, [("plain", [])]).evented()
    assert len(host.index.domain_uuids()) == 1
    mdev = new_id()
    guest = host.define("g", [mdev], notify=False)
    assert host.index.domain_mdevs(guest) == ()  # no event yet: not seen
    assert host.index.domain_now(guest) == (mdev,)
    assert guest in host.index.domain_uuids()
    assert host.index.mdev_users()[mdev].uuid == guest
