"""A real libvirtd accepts the domain XML our code writes, and our index follows it.

The unit tests check ``guest`` and the domain index against libvirt's in-process
test driver, which parses domain XML but does not apply the qemu driver's
rules.  Here a private ``libvirtd`` (see ``tests/libvirtd.py``: its own socket,
config and log, state directories bind-mounted in a private mount namespace
where allowed) is started once for the module, every domain is defined
through its qemu driver as KVM guests (plain ``qemu`` where the daemon offers
no KVM), read back, and the daemon is stopped by PID at the end.

No guest ever runs: there is no VFIO here, and the point is that libvirt
accepts the XML and refuses to start it only for want of the device.
"""

import os
import re
import subprocess
import time
import uuid

import libvirt
import pytest
from lxml import etree

from tests import libvirt_domains
from tests import libvirt_events
from tests import libvirt_schema
from tests import libvirtd as private_libvirtd
from vgpu_driver import guest
from vgpu_driver import libvirt_host

PREFIX = "vgpu-functest-"
INACTIVE = libvirt.VIR_DOMAIN_XML_INACTIVE
CONFIG = libvirt.VIR_DOMAIN_AFFECT_CONFIG
EVENT_WAIT = 5.0

# What nova writes for a small guest, trimmed.  The VNC server listens on a
# UNIX socket: ``display='on'`` needs a graphics device (libvirt refuses the
# definition otherwise), and nothing may ever listen on TCP here.
GUEST_XML = """\
<domain type='kvm'>
  <name>set-by-test</name>
  <uuid>00000000-0000-0000-0000-000000000000</uuid>
  <metadata>
    <nova:instance xmlns:nova="http://openstack.org/xmlns/libvirt/nova/1.1">
      <nova:name>vgpu-guest</nova:name>
      <nova:flavor name="vgpu.small">
        <nova:memory>256</nova:memory>
        <nova:vcpus>1</nova:vcpus>
      </nova:flavor>
    </nova:instance>
  </metadata>
  <memory unit='KiB'>262144</memory>
  <currentMemory unit='KiB'>262144</currentMemory>
  <vcpu placement='static'>1</vcpu>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <boot dev='hd'/>
  </os>
  <features>
    <acpi/>
    <apic/>
  </features>
  <clock offset='utc'/>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>restart</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2' cache='none'/>
      <source file='/var/lib/nova/instances/vgpu-guest/disk'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <interface type='user'>
      <model type='virtio'/>
    </interface>
    <console type='pty'/>
    <input type='tablet' bus='usb'/>
    <graphics type='vnc'>
      <listen type='socket'/>
    </graphics>
    <video>
      <model type='virtio'/>
    </video>
    <memballoon model='virtio'/>
  </devices>
</domain>
"""


def wait_until(predicate, what, timeout=EVENT_WAIT):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not seen within {timeout} s"
        time.sleep(0.01)


def new_uuid():
    return str(uuid.uuid4())


# -- the daemon and connections to it -------------------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    """One private libvirtd for the module, stopped by PID however the tests end."""
    if os.geteuid() != 0:
        pytest.skip("a qemu:///system libvirtd (and its QEMU user switch) needs root")
    if not os.access(private_libvirtd.LIBVIRTD, os.X_OK):
        pytest.fail(
            f"{private_libvirtd.LIBVIRTD} is missing: install the Debian packages "
            "bindep.txt lists for 'test' (tools/bootstrap.sh does, as root)"
        )
    libvirt_events.start_event_loop()  # before any connection, so all can get events
    server = private_libvirtd.Libvirtd(tmp_path_factory.mktemp("libvirtd"))
    server.start()
    try:
        yield server
    finally:
        try:
            _undefine_leftovers(server.uri)
        finally:
            status = server.stop()
    # After SIGTERM libvirtd shuts down cleanly; a SIGKILL would show as -9.
    assert status == 0, f"libvirtd {server.pid} exited with {status}\n{server.log()}"


def _undefine_leftovers(uri):
    """Undefine every domain these tests defined (they matter on a shared host)."""
    conn = libvirt.open(uri)
    try:
        for dom in conn.listAllDomains(0):
            if dom.name().startswith(PREFIX):
                if dom.isActive():
                    dom.destroy()
                dom.undefine()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def conn(daemon):
    connection = libvirt.open(daemon.uri)
    yield connection
    connection.close()


@pytest.fixture(scope="module")
def domain_type(conn):
    """'kvm' when the daemon's QEMU can use KVM here, else plain 'qemu' (TCG)."""
    caps = etree.fromstring(conn.getCapabilities().encode())
    types = caps.xpath("guest[arch/@name='x86_64']/arch/domain/@type")
    assert "qemu" in types, f"the daemon offers no x86_64 guests: {types}"
    return "kvm" if "kvm" in types else "qemu"


@pytest.fixture
def hosts(daemon):
    """Make domain indexes on the daemon, fed by its events as nova-compute
    feeds them (``events=False``: ``LibvirtHost``, a full read per lookup,
    as ``vgpu-manage`` reads); their connections close after."""
    made = []

    def make(events=True, **kwargs):
        made.append(
            libvirt_events.EventedIndex(daemon.uri, **kwargs)
            if events
            else libvirt_host.LibvirtHost(daemon.uri, **kwargs)
        )
        return made[-1]

    yield make
    for host in made:
        host.close()


@pytest.fixture
def define(conn):
    """Define a domain; whatever a test leaves defined is undefined after it."""
    defined = {}  # a redefinition keeps the domain's UUID

    def define_xml(xml):
        dom = conn.defineXML(xml)
        defined[dom.UUIDString()] = None
        return dom

    yield define_xml
    for domain_uuid in defined:
        try:
            conn.lookupByUUIDString(domain_uuid).undefine()
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
                raise


def guest_root(domain_type, name=None):
    """The nova-like guest as our tree, with a fresh name and UUID."""
    root = guest.parse(GUEST_XML)
    root.set("type", domain_type)
    root.find("name").text = name or PREFIX + uuid.uuid4().hex[:8]
    root.find("uuid").text = new_uuid()
    return root


def mdev_hostdev_xml(mdev, **kwargs):
    """One ``<hostdev>`` for attach/detach, exactly as ``guest.add_mdev`` writes it."""
    scratch = guest.add_mdev(guest.parse("<domain><devices/></domain>"), mdev, **kwargs)
    [hostdev] = scratch.findall("devices/hostdev")
    return guest.to_string(hostdev)


def read_back(dom, flags=0):
    xml = dom.XMLDesc(flags)
    return xml, guest.parse(xml)


# -- the tests ------------------------------------------------------------------------------


def test_libvirt_keeps_the_mdevs_our_code_added(define, domain_type):
    """The qemu driver keeps both mdev hostdevs as add_mdev wrote them.

    It checks the hostdevs (``display='on'`` needs a graphics device), fills
    in its defaults and gives each vfio-pci mdev a PCI slot;
    what it hands back, live or inactive, must still name our UUIDs with our
    model/display/ramfb, and must be valid by libvirt's own schema.
    """
    with_display, plain = new_uuid(), new_uuid()
    root = guest_root(domain_type)
    guest.add_mdev(root, with_display, display=True, ramfb=True)
    guest.add_mdev(root, plain)
    libvirt_schema.assert_valid_domain(guest.to_string(root))
    dom = define(guest.to_string(root))

    for flags in (0, INACTIVE):
        xml, back = read_back(dom, flags)
        libvirt_schema.assert_valid_domain(xml)
        assert back.get("type") == domain_type
        assert back.findtext("devices/emulator") == "/usr/bin/qemu-system-x86_64"
        assert guest.mdev_uuids(back) == [with_display, plain]
        first, second = back.findall("devices/hostdev[@type='mdev']")
        for hostdev in (first, second):
            assert (hostdev.get("mode"), hostdev.get("model"), hostdev.get("managed")) == (
                "subsystem",
                "vfio-pci",
                "no",
            )
            assert hostdev.find("address").get("type") == "pci"  # placed on a PCI slot
        assert (first.get("display"), first.get("ramfb")) == ("on", "on")
        # Ours left display/ramfb unset on the second: libvirt's default is off.
        assert second.get("display") in (None, "off") and second.get("ramfb") in (None, "off")
        # Nothing else of ours was lost on the way.
        assert back.find("metadata/{*}instance/{*}name").text == "vgpu-guest"
        assert back.find("devices/graphics/listen").get("type") == "socket"


def test_remove_and_rewrite_redefine_the_guest_and_the_index_follows(define, domain_type, hosts):
    """Editing libvirt's own XML (remove_mdev; a live migration's rewrite)
    and redefining it works.

    That is how the driver changes a guest's mdevs (and a migration's
    destination XML is made); each redefinition is a libvirt event the
    event-driven index must turn into the new mdev set.
    """
    host = hosts()
    assert host.event_driven
    first, second, moved = new_uuid(), new_uuid(), new_uuid()
    root = guest_root(domain_type)
    guest.add_mdev(root, first)
    guest.add_mdev(root, second)
    dom = define(guest.to_string(root))
    wait_until(lambda: set(host.mdev_users()) >= {first, second}, "define")
    ref = host.mdev_users()[first]
    assert (ref.uuid, ref.name) == (dom.UUIDString(), dom.name())

    _, back = read_back(dom, INACTIVE)
    assert guest.remove_mdev(back, first)
    dom = define(guest.to_string(back))
    assert guest.mdev_uuids(read_back(dom, INACTIVE)[1]) == [second]
    wait_until(lambda: first not in host.mdev_users(), "redefine without an mdev")

    xml, _ = read_back(dom, INACTIVE)
    dom = define(libvirt_domains.migrated_xml(xml, {second: moved}))
    assert guest.mdev_uuids(read_back(dom, INACTIVE)[1]) == [moved]
    wait_until(
        lambda: moved in host.mdev_users() and second not in host.mdev_users(),
        "redefine with a rewritten mdev",
    )
    assert host.domain_mdevs(dom.UUIDString()) == (moved,)

    dom.undefine()
    wait_until(lambda: moved not in host.mdev_users(), "undefine")


def test_attach_and_detach_change_the_persistent_config(define, domain_type, hosts):
    """A hostdev our code writes can be attached to, and detached from, a shut-off guest.

    libvirt takes the one ``<hostdev>`` add_mdev produces as a device XML;
    the persistent config gains it and loses it again, and a full scan of
    the daemon (LibvirtHost without events) sees both changes.
    """
    kept, attached = new_uuid(), new_uuid()
    root = guest_root(domain_type)
    guest.add_mdev(root, kept)
    dom = define(guest.to_string(root))
    hostdev = mdev_hostdev_xml(attached)

    dom.attachDeviceFlags(hostdev, CONFIG)
    xml, back = read_back(dom, INACTIVE)
    libvirt_schema.assert_valid_domain(xml)
    assert guest.mdev_uuids(back) == [kept, attached]
    scan = hosts(events=False)
    assert not scan.event_driven
    assert scan.mdev_users()[attached].uuid == dom.UUIDString()

    dom.detachDeviceFlags(hostdev, CONFIG)
    assert guest.mdev_uuids(read_back(dom, INACTIVE)[1]) == [kept]
    assert attached not in scan.mdev_users() and kept in scan.mdev_users()


def test_config_only_attach_and_detach_are_seen_within_the_staleness_bound(
    define, domain_type, hosts
):
    """libvirt 9.0 sends no event at all when AFFECT_CONFIG attaches or detaches
    a device of a shut-off domain; the event-driven index catches it by its
    bounded full re-read instead, so such an mdev never looks free for long."""
    attached = new_uuid()
    host = hosts(max_staleness=0.5)
    assert host.event_driven
    dom = define(guest.to_string(guest_root(domain_type)))
    dom.attachDeviceFlags(mdev_hostdev_xml(attached), CONFIG)
    assert attached in guest.mdev_uuids(read_back(dom, INACTIVE)[1])
    wait_until(lambda: attached in host.mdev_users(), "config attach")
    dom.detachDeviceFlags(mdev_hostdev_xml(attached), CONFIG)
    wait_until(lambda: attached not in host.mdev_users(), "config detach")


def test_start_is_refused_only_for_want_of_vfio(define, domain_type):
    """libvirt accepts the guest but will not start it without VFIO (no GPU here).

    The refusal must be about the mediated device, not about anything else in
    the XML; the failed start leaves the guest defined, with its mdevs.
    """
    mdevs = [new_uuid(), new_uuid()]
    root = guest_root(domain_type)
    guest.add_mdev(root, mdevs[0], display=True, ramfb=True)
    guest.add_mdev(root, mdevs[1])
    dom = define(guest.to_string(root))

    with pytest.raises(libvirt.libvirtError) as refused:
        dom.create()
    message = str(refused.value)
    assert re.search(r"(?i)mediated|mdev", message) and "VFIO" in message.upper(), message
    if not os.path.exists("/dev/vfio/vfio"):
        assert refused.value.get_error_code() == libvirt.VIR_ERR_CONFIG_UNSUPPORTED
        assert "Mediated host device assignment requires VFIO support" in message
    assert not dom.isActive() and dom.isPersistent()
    assert guest.mdev_uuids(read_back(dom, INACTIVE)[1]) == mdevs


def test_vendor_vfio_vf_is_kept_and_refused_to_start(define, domain_type):
    """A VF passed through by add_pci_vf (NVIDIA's vendor VFIO) survives libvirt too."""
    root = guest_root(domain_type)
    guest.add_pci_vf(root, "0000:41:00.4")
    dom = define(guest.to_string(root))
    xml, back = read_back(dom, INACTIVE)
    libvirt_schema.assert_valid_domain(xml)
    assert guest.pci_vfs(back) == ["0000:41:00.4"]
    assert back.find("devices/hostdev[@type='pci']").get("managed") == "no"
    with pytest.raises(libvirt.libvirtError) as refused:
        dom.create()
    assert not dom.isActive()
    if not os.path.exists("/dev/vfio/vfio"):
        assert "passthrough of host PCI devices" in str(refused.value)


def _version(argv, pattern):
    output = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return tuple(int(x) for x in re.search(pattern, output).groups())


def test_versions_are_the_daemons(daemon, hosts):
    """versions() reports what the running libvirtd and QEMU binaries say of themselves."""
    versions = hosts(events=False).versions()
    libvirtd = _version([private_libvirtd.LIBVIRTD, "--version"], r"(\d+)\.(\d+)\.(\d+)")
    qemu = _version(["/usr/bin/qemu-system-x86_64", "--version"], r"version (\d+)\.(\d+)\.(\d+)")
    kernel = _version(["uname", "-r"], r"^(\d+)\.(\d+)")
    assert versions["libvirt"] == libvirtd
    assert versions["libvirt"] >= (9, 0, 0)  # Debian 12's, the oldest this lane runs on
    assert versions["qemu"] == qemu and qemu > (0, 0, 0)
    assert versions["kernel"][:2] == kernel
