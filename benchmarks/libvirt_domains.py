"""Guests with one mdev each in libvirt's test driver; index checks for both benchmarks.

Every connection a process opens to ``test:///default`` shares one driver
state, and each gets the events of what the others do.  (A file URI such as
``test:///path/node.xml`` does not: each ``libvirt.open`` of it loads its own
copy, so nothing defined on one connection is seen on another.)  So the
benchmark defines guests on its connection and the index
(:class:`~vgpu_driver.domain_index.DomainIndex`, fed by the events of a
connection of its own as nova-compute feeds it: ``tests/libvirt_events.py``)
reads through its own.  The shared
state outlives the connections, so :func:`open_empty` clears it first.

The callers import libvirt first and exit with a hint when it is missing.
"""

import threading
import time
import uuid

import common
import libvirt

from vgpu_driver import guest
from vgpu_driver import libvirt_host

libvirt_events = common.load_test_helper("libvirt_events")

URI = "test:///default"
EVENT_TIMEOUT = 10.0


def domain_xml(index, dom_uuid, mdev_uuid, hypervisor="test"):
    """A guest as nova-compute defines it, with one mdev hostdev.

    The guest is a fixed template; its mdev is added by the package's own
    guest code, the one way vgpu-driver writes hostdevs.  ``hypervisor``
    ``kvm`` makes it a guest of libvirt's QEMU driver.
    """
    root = guest.parse(_guest_template(index, dom_uuid, hypervisor))
    return guest.to_string(guest.add_mdev(root, mdev_uuid))


def _guest_template(index, dom_uuid, hypervisor):
    emulator = "<emulator>/usr/bin/qemu-system-x86_64</emulator>" if hypervisor == "kvm" else ""
    return f"""<domain type='{hypervisor}'>
  <name>instance-{index:08x}</name>
  <uuid>{dom_uuid}</uuid>
  <metadata>
    <nova:instance xmlns:nova="http://openstack.org/xmlns/libvirt/nova/1.1">
      <nova:flavor name="g1.vgpu"><nova:memory>4096</nova:memory><nova:vcpus>4</nova:vcpus>
      </nova:flavor>
    </nova:instance>
  </metadata>
  <memory unit='KiB'>4194304</memory>
  <vcpu>4</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os>
  <devices>{emulator}
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2' cache='none'/>
      <source file='/var/lib/nova/instances/{dom_uuid}/disk'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <interface type='bridge'>
      <mac address='fa:16:3e:{index >> 16 & 255:02x}:{index >> 8 & 255:02x}:{index & 255:02x}'/>
      <source bridge='br-int'/>
      <model type='virtio'/>
    </interface>
  </devices>
</domain>"""


def libvirt_version():
    """The libvirt library's version as ``x.y.z``, for the report."""
    return ".".join(map(str, libvirt_host.version_tuple(libvirt.getVersion())))


def open_empty():
    """A connection to the shared test driver, with no domain left in it.

    Removes what an earlier size defined, and the driver's own ``test``
    domain (running, no mdev).  Nothing listens yet, so no index pays for it.
    """
    conn = libvirt.open(URI)
    for dom in conn.listAllDomains(0):
        persistent = dom.isPersistent()
        if dom.isActive():
            dom.destroy()
        if persistent:
            dom.undefine()
    return conn


def define(conn, guests):
    """Define ``(index, domain uuid, mdev uuid)`` guests; returns the ms it took."""
    start = time.perf_counter()
    for index, dom_uuid, mdev_uuid in guests:
        conn.defineXML(domain_xml(index, dom_uuid, mdev_uuid))
    define_ms = (time.perf_counter() - start) * 1000
    flush_events(conn)
    return define_ms


def flush_events(conn):
    """Wait until every event queued so far is dispatched (they come in order).

    So no event of the setup reaches an index built afterwards.
    """
    done = threading.Event()
    sentinel = str(uuid.uuid4())

    def on_event(_conn, dom, event, _detail, _opaque):
        if dom.UUIDString() == sentinel and event == libvirt.VIR_DOMAIN_EVENT_UNDEFINED:
            done.set()

    callback = conn.domainEventRegisterAny(
        None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE, on_event, None
    )
    try:
        conn.defineXML(domain_xml(0xFFFFFFF, sentinel, str(uuid.uuid4()))).undefine()
        if not done.wait(EVENT_TIMEOUT):
            raise RuntimeError(f"libvirt events not dispatched in {EVENT_TIMEOUT}s")
    finally:
        conn.domainEventDeregisterAny(callback)


def scan(conn):
    """``{mdev uuid: domain uuid}`` from every domain's XML: a full rescan."""
    found = {}
    for dom in conn.listAllDomains(0):
        for mdev_uuid in guest.mdev_uuids(guest.parse(dom.XMLDesc(0))):
            found[mdev_uuid] = dom.UUIDString()
    return found


def indexed(host):
    """What the index says, in :func:`scan`'s shape."""
    return {mdev_uuid: ref.uuid for mdev_uuid, ref in host.mdev_users().items()}


def index_problems(host, conn, expected):
    """What is wrong, if anything: the index must equal a full rescan, and
    libvirt must hold ``expected`` (``{mdev uuid: domain uuid}``)."""
    problems = []
    scanned = scan(conn)
    found = indexed(host)
    if found != scanned:
        problems.append(
            f"the index has {len(found)} mdevs, a full rescan finds "
            f"{len(scanned)} ({len(set(found) ^ set(scanned))} differ)"
        )
    if scanned != expected:
        problems.append(f"libvirt holds {len(scanned)} mdev references, not {len(expected)}")
    return problems


def wait_for(host, mdev_uuid, present, timeout=EVENT_TIMEOUT):
    """Until ``mdev_uuid in host.mdev_users()`` is ``present`` (events are async)."""
    deadline = time.monotonic() + timeout
    while (mdev_uuid in host.mdev_users()) != present:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no event for mdev {mdev_uuid} in {timeout}s")
        time.sleep(0.0002)


class TimedHost(libvirt_events.EventedIndex):
    """The event-fed index, also timing how it applies events, for the report.

    An event only notes its domain; the lookup after it reads that domain
    and publishes the new maps.  ``update_ms`` holds how long each such
    application took; ``applied`` maps a domain UUID to the
    :func:`time.perf_counter` at which the maps that reflect its last event
    were in place.
    """

    def __init__(self, uri=URI):
        self.update_ms = []
        self.applied = {}
        self._applying = []
        # No timed full re-read: every change here reaches the index by its event.
        super().__init__(uri, max_staleness=float("inf"))

    def _take_changes(self):
        self._applying = super()._take_changes()
        return self._applying

    def _apply_changes(self, conn):
        start = time.perf_counter()
        super()._apply_changes(conn)
        end = time.perf_counter()
        self.update_ms.append((end - start) * 1000)
        for dom_uuid in self._applying:
            self.applied[dom_uuid] = end
