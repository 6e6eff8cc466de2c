"""Domain XML for libvirt's test driver, built with our own guest code."""

import uuid

from lxml import etree

from vgpu_driver import guest


def domain_xml(name, mdevs=(), domain_uuid=None, device_api="vfio-pci", vfs=()):
    """A test-driver domain using ``mdevs`` (and PCI hostdevs of ``vfs``,
    vendor-VFIO vGPUs), built as a tree, never as text."""
    root = etree.Element("domain", type="test")
    etree.SubElement(root, "name").text = name
    etree.SubElement(root, "uuid").text = domain_uuid or str(uuid.uuid4())
    etree.SubElement(root, "memory", unit="MiB").text = "1024"
    os_el = etree.SubElement(root, "os")
    etree.SubElement(os_el, "type").text = "hvm"
    etree.SubElement(root, "devices")
    for mdev in mdevs:
        guest.add_mdev(root, mdev, device_api=device_api)
    for vf in vfs:
        guest.add_pci_vf(root, vf)
    return guest.to_string(root)


def node_file(path, domains):
    """A ``test:///<path>`` node file holding ``domains`` (XML strings)."""
    node = etree.Element("node")
    for xml in domains:
        node.append(guest.parse(xml))
    path.write_bytes(etree.tostring(node))
    return f"test://{path}"


def migrated_xml(xml, mapping):
    """The domain XML as nova's live migration sends it to the destination:
    each mdev hostdev's UUID and each mapped PCI hostdev's address replaced
    by ``mapping``'s (nova's ``_update_mdev_xml`` and PCI rewrite, from the
    ``target_mdevs`` and ``pci_dev_map_src_dst`` the destination gave it);
    nova refuses an mdev the mapping does not name."""
    root = guest.parse(xml)
    for hostdev in root.findall("devices/hostdev"):
        address = hostdev.find("source/address")
        if hostdev.get("type") == "mdev":
            address.set("uuid", mapping[address.get("uuid")])
            continue
        vf = guest.pci_vfs(
            etree.fromstring(
                f"<domain><devices>{etree.tostring(hostdev, encoding='unicode')}</devices></domain>"
            )
        )
        if vf and vf[0] in mapping:
            new = guest.pci_hostdev(mapping[vf[0]]).find("source/address")
            for key, value in new.attrib.items():
                address.set(key, value)
    return guest.to_string(root)
