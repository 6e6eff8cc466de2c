"""mdev hostdevs in a libvirt domain XML, edited as a tree (lxml).

Only ``<hostdev>`` elements vgpu-driver owns are touched: everything else in
the document (metadata, namespaces, other devices, comments) stays as it was.
XML is never assembled from strings.

* mdev: ``<hostdev mode='subsystem' type='mdev' model='vfio-pci'
  managed='no'><source><address uuid='…'/></source></hostdev>``, the model
  following the type's ``device_api`` (vfio-pci, vfio-ccw, vfio-ap), with
  ``display``/``ramfb`` where the type asks for them;
* NVIDIA vendor-specific VFIO: the VF itself, ``<hostdev mode='subsystem'
  type='pci' managed='no'>`` with its PCI address.
"""

from lxml import etree

from vgpu_driver import names
from vgpu_driver.exception import UnsupportedDeviceApi

MODELS = {"vfio-pci": "vfio-pci", "vfio-ccw": "vfio-ccw", "vfio-ap": "vfio-ap"}
_MDEV_XPATH = "./devices/hostdev[@type='mdev']"
_PCI_XPATH = "./devices/hostdev[@type='pci']"


def parse(xml):
    """A domain XML (str or bytes) as an lxml tree; comments and blanks kept."""
    parser = etree.XMLParser(remove_blank_text=False, resolve_entities=False, no_network=True)
    data = xml.encode() if isinstance(xml, str) else xml
    return etree.fromstring(data, parser)


def to_string(root):
    return etree.tostring(root, encoding="unicode")


def _devices(root):
    devices = root.find("devices")
    if devices is None:
        devices = etree.SubElement(root, "devices")
    return devices


def _append(devices, element):
    """Add after the last hostdev (else last), keeping the file's indentation."""
    hostdevs = devices.findall("hostdev")
    anchor = hostdevs[-1] if hostdevs else (devices[-1] if len(devices) else None)
    if anchor is None:
        devices.append(element)
        return
    element.tail = anchor.tail
    if anchor is devices[-1]:
        # The last child's tail indents </devices>; the anchor now needs a sibling's.
        previous = anchor.getprevious()
        anchor.tail = previous.tail if previous is not None else devices.text
    anchor.addnext(element)


def mdev_uuids(root):
    """The mdev UUIDs a domain references, lower-cased, in document order."""
    return [
        h.find("source/address").get("uuid").lower()
        for h in root.findall(_MDEV_XPATH)
        if h.find("source/address") is not None
    ]


def mdev_hostdev(uuid, device_api="vfio-pci", display=None, ramfb=None):
    """The ``<hostdev>`` element of an mdev: the one writer of it, for
    nova's path and the demo alike."""
    uuid = names.check_mdev_uuid(uuid)
    if device_api not in MODELS:
        raise UnsupportedDeviceApi(api=device_api, known=", ".join(sorted(MODELS)))
    hostdev = etree.Element(
        "hostdev", mode="subsystem", type="mdev", model=MODELS[device_api], managed="no"
    )
    if display is not None:
        hostdev.set("display", "on" if display else "off")
    if ramfb is not None:
        hostdev.set("ramfb", "on" if ramfb else "off")
    source = etree.SubElement(hostdev, "source")
    etree.SubElement(source, "address", uuid=uuid)
    return hostdev


def pci_hostdev(address):
    """The ``<hostdev>`` element passing a vendor-VFIO VF through
    (``managed='no'``: the host binds it)."""
    hostdev = etree.Element("hostdev", mode="subsystem", type="pci", managed="no")
    source = etree.SubElement(hostdev, "source")
    etree.SubElement(source, "address", **_pci_address_attrs(address))
    return hostdev


def add_hostdev(root, hostdev):
    """Add a hostdev element (from :func:`mdev_hostdev` or
    :func:`pci_hostdev`) unless the domain has one for its vGPU already."""
    address = hostdev.find("source/address")
    if hostdev.get("type") == "mdev":
        present = address.get("uuid") in mdev_uuids(root)
    else:
        present = _pci_address(address) in pci_vfs(root)
    if not present:
        _append(_devices(root), hostdev)
    return root


def add_mdev(root, uuid, device_api="vfio-pci", display=None, ramfb=None):
    """Add an mdev hostdev for ``uuid`` (no-op if the domain has it already)."""
    return add_hostdev(root, mdev_hostdev(uuid, device_api, display, ramfb))


def remove_mdev(root, uuid):
    """Remove the hostdev of ``uuid``; returns whether there was one."""
    found = False
    for hostdev in root.findall(_MDEV_XPATH):
        address = hostdev.find("source/address")
        if address is not None and address.get("uuid", "").lower() == uuid.lower():
            _drop(hostdev)
            found = True
    return found


def _drop(element):
    """Remove an element, giving its tail to what came before it."""
    previous = element.getprevious()
    parent = element.getparent()
    if previous is not None:
        previous.tail = element.tail
    else:
        parent.text = element.tail if element.tail and parent.text is None else parent.text
    parent.remove(element)


def _pci_address_attrs(address):
    address = names.parse_pci_address(str(address))
    return {
        "domain": f"0x{address.domain:04x}",
        "bus": f"0x{address.bus:02x}",
        "slot": f"0x{address.slot:02x}",
        "function": f"0x{address.function:x}",
    }


def _pci_address(element):
    """A ``<address domain= bus= slot= function=>`` as ``dddd:bb:ss.f``, or None."""
    try:
        parts = [
            int(element.get(k, "0" if k == "domain" else ""), 16)
            for k in ("domain", "bus", "slot", "function")
        ]
    except ValueError:
        return None
    address = str(names.PciAddress(*parts))
    return address if names.is_pci_address(address) else None


def pci_vfs(root):
    """The PCI addresses of ``type='pci'`` hostdevs, as ``dddd:bb:ss.f``.

    An address that is not one (hand-written XML) is skipped, not fatal: this
    runs over every domain of a host.
    """
    found = []
    for hostdev in root.findall(_PCI_XPATH):
        address = hostdev.find("source/address")
        text = _pci_address(address) if address is not None else None
        if text is not None:
            found.append(text)
    return found


def vgpu_ids(root):
    """Every id of a vGPU the domain may use: its mdev UUIDs, then the
    addresses of its PCI hostdevs (a vendor-VFIO vGPU is passed through as
    its VF).  Which addresses are vGPUs is for sysfs and the claims to say."""
    return [*mdev_uuids(root), *pci_vfs(root)]


def add_pci_vf(root, address):
    """Pass a vendor-VFIO VF through (no-op if the domain has it already)."""
    return add_hostdev(root, pci_hostdev(address))


def remove_pci_vf(root, address):
    wanted = str(names.parse_pci_address(str(address)))
    found = False
    for hostdev in root.findall(_PCI_XPATH):
        address_el = hostdev.find("source/address")
        if address_el is not None and _pci_address(address_el) == wanted:
            _drop(hostdev)
            found = True
    return found
