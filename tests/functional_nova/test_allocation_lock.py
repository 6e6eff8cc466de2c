"""nova-compute's allocation path never scans libvirt's domains while it
holds the claims journal's write lock, and its index follows nova's events.

nova's own ``Host`` (its connection, its event loop) on libvirt's
``test:///default`` driver feeds the index exactly as
:class:`vgpu_driver.nova.LibvirtVGPUDriver` wires it; the allocation runs
through the core driver that class calls.  Every libvirt call made on
nova's connection is counted, split by whether the journal's
``BEGIN IMMEDIATE`` ... ``COMMIT`` was open at the time.
"""

import textwrap
import time
import uuid

import fixtures
import libvirt
from nova import utils as nova_utils
from nova.virt.libvirt import host as nova_host
from oslo_config import cfg

try:
    from nova import thread_pool_factory  # nova 34: every executor in one factory
except ImportError:
    thread_pool_factory = None

from tests.functional_nova import deadline
from vgpu_driver import conf as vgpu_conf
from vgpu_driver import driver as core
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles
from vgpu_driver.nova import events

T4A = "0000:18:00.0"
DOMAINS = 40


class CountingConnection:
    """nova's libvirt connection, counting the calls that read domains."""

    READS = ("listAllDomains", "XMLDesc", "lookupByUUIDString")

    def __init__(self, conn, in_lock):
        self._conn, self._in_lock = conn, in_lock
        self.calls = []

    def __getattr__(self, name):
        attr = getattr(self._conn, name)
        if name not in ("listAllDomains", "lookupByUUIDString"):
            return attr

        def counted(*args):
            self.calls.append((name, self._in_lock()))
            result = attr(*args)
            if name == "listAllDomains":
                return [CountingDomain(d, self) for d in result]
            return CountingDomain(result, self)

        return counted


class CountingDomain:
    def __init__(self, dom, counter):
        self._dom, self._counter = dom, counter

    def __getattr__(self, name):
        attr = getattr(self._dom, name)
        if name != "XMLDesc":
            return attr

        def counted(*args):
            self._counter.calls.append((name, self._counter._in_lock()))
            return attr(*args)

        return counted


class _StopConnEvents(BaseException):
    """Ends nova's connection-event loop, which has no stop of its own: its
    worker would otherwise keep the interpreter from exiting."""


def _stop_conn_events(host):
    def stop():
        raise _StopConnEvents()

    host._conn_event_handler_queue.put(stop)


def _forget_executors():
    if thread_pool_factory is not None:
        executors = list(thread_pool_factory.FACTORY._all_executors.values())
        thread_pool_factory.FACTORY._all_executors.clear()
    else:
        # nova 33 keeps the Host's executor in a global of nova.utils; nova 31
        # has none (it spawns green threads).
        executors = [e for e in [getattr(nova_utils, "DEFAULT_EXECUTOR", None)] if e]
        if executors:
            nova_utils.DEFAULT_EXECUTOR = None
    for executor in executors:
        executor.shutdown(wait=False)


def domain_xml(name, dom_uuid, mdev):
    return (
        f"<domain type='test'><name>{name}</name><uuid>{dom_uuid}</uuid>"
        "<memory>1024</memory><os><type>hvm</type></os><devices>"
        "<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source>"
        f"<address uuid='{mdev}'/></source></hostdev></devices></domain>"
    )


class TestAllocationLock(deadline.TestCase):
    def setUp(self):
        super().setUp()
        state = self.useFixture(fixtures.TempDir()).path
        self.kernel = fakekernel.FakeKernel.build(f"{state}/sys", profiles.load("t4x8"))
        with open(f"{state}/nova.conf", "w") as f:
            f.write(
                textwrap.dedent(f"""
                [devices]
                enabled_mdev_types = nvidia-222
                [vgpu]
                state_dir = {state}/state
                sysfs_root = {state}/sys
                """)
            )
        conf = cfg.ConfigOpts()
        vgpu_conf.register_opts(conf)
        conf([], project="nova", default_config_files=[f"{state}/nova.conf"])
        self.host = nova_host.Host("test:///default")
        self.in_lock = False
        connect = self.host._connect
        self.host._connect = lambda *args: CountingConnection(connect(*args), lambda: self.in_lock)
        self.index = events.domain_index_of(self.host)
        self.host.initialize()  # nova's event loop, as in init_host
        # nova's other tests expect no executor registered: the Host's
        # connection-event loop is ended, then its executors let go.
        self.addCleanup(_forget_executors)
        self.addCleanup(_stop_conn_events, self.host)
        self.index.event_driven = True  # as LibvirtVGPUDriver.init_host says
        self.conn = self.host.get_connection()
        self.defined = []
        self.addCleanup(self._undefine)
        self.vgpu = core.VGPUDriver(conf, self.index, host=self.kernel)
        db = self.vgpu.journal._db()
        db.set_trace_callback(self._statement)
        self.addCleanup(db.set_trace_callback, None)

    def _statement(self, sql):
        if sql.startswith("BEGIN IMMEDIATE"):
            self.in_lock = True
        elif sql.startswith(("COMMIT", "ROLLBACK")):
            self.in_lock = False

    def _undefine(self):
        for dom_uuid in self.defined:
            try:
                self.conn._conn.lookupByUUIDString(dom_uuid).undefine()
            except libvirt.libvirtError:
                pass

    def define(self, mdev):
        dom_uuid = str(uuid.uuid4())
        self.conn._conn.defineXML(domain_xml(f"guest-{dom_uuid[:8]}", dom_uuid, mdev))
        self.defined.append(dom_uuid)
        return dom_uuid

    def wait_for(self, mdev):
        deadline = time.monotonic() + 10
        while mdev not in self.index.mdev_users():
            self.assertLess(time.monotonic(), deadline, "no libvirt event in time")
            time.sleep(0.01)

    def test_no_domain_read_inside_the_write_lock_and_events_keep_up(self):
        existing = [str(uuid.uuid4()) for _ in range(DOMAINS)]
        for mdev in existing:
            self.define(mdev)
        # Their events heard before counting: on a busy machine one still
        # queued would read its domain's XML among the counted calls.
        for mdev in existing:
            self.wait_for(mdev)
        tree = self.vgpu.provider_tree("cn1")
        providers = {"rp": tree.by_gpu(T4A)}
        allocations = {"rp": {"resources": {tree.by_gpu(T4A).resource_class: 1}}}
        self.conn.calls.clear()

        for instance in range(3):
            (mdev,) = self.vgpu.allocate(f"guest-{instance}", allocations, providers)
            self.define(mdev)
            self.wait_for(mdev)
            self.vgpu.instance_defined(f"guest-{instance}")

        self.assertEqual([], [name for name, locked in self.conn.calls if locked])
        # nova's events kept the index current: no listing, one XML per new guest.
        names = [name for name, _ in self.conn.calls]
        self.assertNotIn("listAllDomains", names)
        self.assertEqual(3, names.count("XMLDesc"))
        used = {m for m, ref in self.index.mdev_users().items() if ref.uuid in self.defined}
        self.assertEqual(DOMAINS + 3, len(used))
        self.assertEqual(3, len({c.mdev_uuid for c in self.vgpu.journal.claims()}))

    def test_an_undefined_guest_frees_its_vgpu_by_event(self):
        mdev = str(uuid.uuid4())
        dom_uuid = self.define(mdev)
        self.wait_for(mdev)
        self.conn._conn.lookupByUUIDString(dom_uuid).undefine()
        deadline = time.monotonic() + 10
        while mdev in self.index.mdev_users():
            self.assertLess(time.monotonic(), deadline, "no libvirt event in time")
            time.sleep(0.01)
