"""The domain index over libvirt's domains, against libvirt's own test driver:
fed by events as nova-compute feeds it (:mod:`tests.libvirt_events`), and
without events as ``vgpu-manage`` reads it (:class:`LibvirtHost`)."""

import time
import uuid

import libvirt
import pytest

from tests import libvirt_domains
from tests import libvirt_events
from vgpu_driver import libvirt_host


def wait_until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "no libvirt event in time"
        time.sleep(0.005)


@pytest.fixture(scope="module")
def events():
    libvirt_events.start_event_loop()


@pytest.fixture
def big_host(tmp_path):
    """A test:/// host with 500 domains, each using one mdev (some none)."""
    mdevs = [str(uuid.uuid4()) for _ in range(500)]
    xmls = [
        libvirt_domains.domain_xml(f"guest-{i}", [m] if i % 10 else []) for i, m in enumerate(mdevs)
    ]
    return libvirt_domains.node_file(tmp_path / "node.xml", xmls), mdevs


def test_index_of_500_domains_matches_their_xml(big_host, events):
    uri, mdevs = big_host
    host = libvirt_events.EventedIndex(uri)
    users = host.mdev_users()
    assert host.event_driven
    assert set(users) == {m for i, m in enumerate(mdevs) if i % 10}
    assert users[mdevs[1]].name == "guest-1"


def test_free_set_follows_define_and_undefine(big_host, events):
    uri, mdevs = big_host
    host = libvirt_events.EventedIndex(uri)
    conn = host.conn  # the same in-memory test driver instance
    new = str(uuid.uuid4())
    dom = conn.defineXML(libvirt_domains.domain_xml("late-guest", [new]))
    wait_until(lambda: new in host.mdev_users())
    assert host.mdev_users()[new].uuid == dom.UUIDString()
    # A config change that swaps the mdev is seen too.
    other = str(uuid.uuid4())
    conn.defineXML(libvirt_domains.domain_xml("late-guest", [other], domain_uuid=dom.UUIDString()))
    wait_until(lambda: other in host.mdev_users() and new not in host.mdev_users())
    dom.undefine()
    wait_until(lambda: other not in host.mdev_users())
    # Undefined while running, a guest is transient and still holds its mdev.
    victim = conn.lookupByName("guest-7")
    heard = host.heard[victim.UUIDString()]
    victim.undefine()
    wait_until(lambda: host.heard[victim.UUIDString()] > heard)
    assert mdevs[7] in host.mdev_users()
    victim.destroy()
    wait_until(lambda: mdevs[7] not in host.mdev_users())
    assert len(host.mdev_users()) == 449


def test_running_and_shut_off_domains_both_count(tmp_path, events):
    used_running, used_off = str(uuid.uuid4()), str(uuid.uuid4())
    uri = libvirt_domains.node_file(
        tmp_path / "node.xml",
        [
            libvirt_domains.domain_xml("running", [used_running]),
            libvirt_domains.domain_xml("off", [used_off]),
        ],
    )
    host = libvirt_events.EventedIndex(uri)
    off = host.conn.lookupByName("off")
    off.destroy()  # the node file's domains start running
    assert host.conn.lookupByName("running").isActive() and not off.isActive()
    # The stop event has come: it must not drop the guest.
    wait_until(lambda: host.heard[off.UUIDString()] > 0)
    assert set(host.mdev_users()) == {used_running, used_off}


def test_without_an_event_loop_every_lookup_rescans(tmp_path):
    uri = libvirt_domains.node_file(tmp_path / "node.xml", [])
    host = libvirt_host.LibvirtHost(uri)
    assert not host.event_driven
    mdev = str(uuid.uuid4())
    host.conn.defineXML(libvirt_domains.domain_xml("g", [mdev]))
    assert mdev in host.mdev_users()


def test_versions_and_unreachable_libvirt():
    host = libvirt_host.LibvirtHost("test:///default")
    versions = host.versions()
    assert versions["libvirt"] == libvirt_host.version_tuple(libvirt.getVersion())
    assert versions["kernel"] >= (3, 0, 0)
    assert libvirt_host.kernel_version("5.18.0-1-amd64") == (5, 18, 0)
    assert libvirt_host.kernel_version("6.1") == (6, 1, 0)
    with pytest.raises(libvirt_host.LibvirtUnavailable, match="Cannot reach libvirt"):
        libvirt_host.LibvirtHost("qemu+unix:///system?socket=/nonexistent")
