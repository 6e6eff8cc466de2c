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
