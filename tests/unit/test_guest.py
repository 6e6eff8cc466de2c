"""mdev hostdevs in domain XML: round trips on real-world domains, and every
document produced validates against libvirt's own RelaxNG schema."""

import pathlib

import pytest
from lxml import etree

from tests import libvirt_schema
from vgpu_driver import exception
from vgpu_driver import guest

DOMAINS = pathlib.Path(__file__).parent / "domains"
XMLS = sorted(p.name for p in DOMAINS.glob("*.xml"))
UUID1 = "b568cf21-ed57-4499-933b-93552f2da4fe"
UUID2 = "502ec7ab-69de-433b-b29d-699317acc4cd"


def load(name):
    return guest.parse((DOMAINS / name).read_text())


def canonical(root):
    return etree.tostring(root, method="c14n")


@pytest.mark.parametrize("name", XMLS)
def test_every_sample_is_a_valid_domain(name):
    libvirt_schema.assert_valid_domain((DOMAINS / name).read_text())


@pytest.mark.parametrize("name", XMLS)
def test_add_then_remove_gives_the_document_back(name):
    original = canonical(load(name))
    root = load(name)
    before = guest.mdev_uuids(root)
    guest.add_mdev(root, UUID1)
    guest.add_mdev(root, UUID2, display=True, ramfb=True)
    assert guest.mdev_uuids(root) == [*before, UUID1, UUID2]
    libvirt_schema.assert_valid_domain(guest.to_string(root))
    assert guest.remove_mdev(root, UUID1) and guest.remove_mdev(root, UUID2)
    assert canonical(root) == original


def test_the_added_hostdev_is_exactly_libvirts_mdev_form():
    root = load("nova-kvm.xml")
    guest.add_mdev(root, UUID1)
    (hostdev,) = root.findall("devices/hostdev")
    assert etree.tostring(hostdev, with_tail=False).decode() == (
        '<hostdev mode="subsystem" type="mdev" model="vfio-pci" managed="no"><source>'
        f'<address uuid="{UUID1}"/></source></hostdev>'
    )
    # Indented like its siblings, after the last device.
    assert hostdev.getprevious().tag == "memballoon"
    assert "\n    <hostdev" in guest.to_string(root)


def test_metadata_namespaces_and_comments_survive():
    root = load("nova-kvm.xml")
    guest.add_mdev(root, UUID1)
    text = guest.to_string(root)
    assert 'xmlns:nova="http://openstack.org/xmlns/libvirt/nova/1.1"' in text
    assert "<nova:name>web-1</nova:name>" in text
    assert "<!-- the root disk, from nova's image cache -->" in text
    root = load("with-hostdevs.xml")
    guest.add_mdev(root, UUID1)
    text = guest.to_string(root)
    assert "<qemu:arg value='ICH9-LPC.disable_s3=1'/>" in text.replace('"', "'")
    assert guest.pci_vfs(root) == ["0000:3b:00.2"]


@pytest.mark.parametrize("api", ["vfio-pci", "vfio-ccw", "vfio-ap"])
def test_model_follows_the_device_api(api):
    root = load("test-driver.xml")
    guest.add_mdev(root, UUID1, device_api=api)
    assert root.find("devices/hostdev").get("model") == api
    libvirt_schema.assert_valid_domain(guest.to_string(root))


def test_unknown_device_api_is_refused():
    with pytest.raises(guest.UnsupportedDeviceApi, match="'vfio-platform'"):
        guest.add_mdev(load("test-driver.xml"), UUID1, device_api="vfio-platform")


def test_adding_twice_is_a_no_op_and_bad_uuids_are_refused():
    root = load("with-hostdevs.xml")
    guest.add_mdev(root, "b3145c68-91f6-4f51-88dc-2120f019e4aa")
    assert len(root.findall("devices/hostdev")) == 2
    with pytest.raises(exception.InvalidSysfsName):
        guest.add_mdev(root, "not-a-uuid")


def test_vendor_vfio_vf_is_a_pci_hostdev_unmanaged():
    root = load("nova-kvm.xml")
    guest.add_pci_vf(root, "0000:c1:00.4")
    hostdev = root.find("devices/hostdev")
    assert (hostdev.get("type"), hostdev.get("managed")) == ("pci", "no")
    assert dict(hostdev.find("source/address").attrib) == {
        "domain": "0x0000",
        "bus": "0xc1",
        "slot": "0x00",
        "function": "0x4",
    }
    libvirt_schema.assert_valid_domain(guest.to_string(root))
    assert guest.pci_vfs(root) == ["0000:c1:00.4"]
    assert guest.remove_pci_vf(root, "0000:c1:00.4") and guest.pci_vfs(root) == []


def test_a_domain_without_devices_gets_them():
    root = guest.parse(
        "<domain type='test'><name>bare</name><memory>1024</memory>"
        "<os><type>hvm</type></os></domain>"
    )
    guest.add_mdev(root, UUID1)
    libvirt_schema.assert_valid_domain(guest.to_string(root))


def test_the_schema_check_does_reject_a_bad_hostdev():
    root = load("test-driver.xml")
    guest.add_mdev(root, UUID1)
    root.find("devices/hostdev").set("model", "vfio-bogus")
    with pytest.raises(AssertionError, match="hostdev|Invalid|Extra element"):
        libvirt_schema.assert_valid_domain(guest.to_string(root))
