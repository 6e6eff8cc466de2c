"""libvirt's view: which domain (active or inactive) uses which mdev.

Every defined domain counts, running or not: a shut-off guest still owns its
mdev.  The XML is read with lxml, never searched as text.
"""

from lxml import etree

from vgpu_driver import domains
from vgpu_driver import exception

MDEV_UUID_XPATH = "./devices/hostdev[@type='mdev']/source/address/@uuid"


class LibvirtUnavailable(exception.VgpuDriverError):
    msg_fmt = ("Cannot reach libvirt at %(uri)s: %(reason)s. Without it, mdevs used by "
               "guests cannot be told from free ones.")


def mdev_uuids_of(domain_xml):
    """The mdev UUIDs a domain XML references, lower-cased, in order."""
    root = etree.fromstring(domain_xml.encode() if isinstance(domain_xml, str)
                            else domain_xml)
    return [u.lower() for u in root.xpath(MDEV_UUID_XPATH)]


class LibvirtDomains(domains.DomainReferences):
    """Domain references read from a libvirt connection on each call."""

    def __init__(self, uri):
        self.uri = uri
        try:
            import libvirt
        except ImportError as exc:
            raise LibvirtUnavailable(uri=uri, reason="libvirt-python is not installed "
                                                     "(pip install vgpu-driver[libvirt])"
                                     ) from exc
        # Errors are raised as exceptions; libvirt need not also print them.
        libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
        try:
            self._conn = libvirt.open(uri)
        except libvirt.libvirtError as exc:
            raise LibvirtUnavailable(uri=uri, reason=str(exc)) from exc

    def mdev_users(self):
        users = {}
        for domain in self._conn.listAllDomains(0):
            ref = domains.DomainRef(domain.UUIDString(), domain.name())
            for mdev in mdev_uuids_of(domain.XMLDesc(0)):
                users[mdev] = ref
        return users
