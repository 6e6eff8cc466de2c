"""Suspend and resume of vGPU guests under LibvirtVGPUDriver.

nova suspends a guest by detaching its mdevs from the running domain (a
live detach: the persistent definition keeps them) and saving its memory;
it resumes it by starting the domain from the saved state and attaching
the mdevs the definition names.  The guest must keep its claims meanwhile,
get the same mdevs back, and find them even if the host rebooted while it
was suspended (the reboot removed them; nova alone resumes it without them).
"""

import fixtures
from lxml import etree
from nova.tests.fixtures import libvirt as fakelibvirt

from tests.functional_nova import test_power

Domain = fakelibvirt.Domain


def _mdev_uuid(xml):
    """The UUID of an mdev ``<hostdev>``, or None for any other device."""
    element = etree.fromstring(xml)
    if element.tag != "hostdev" or element.get("type") != "mdev":
        return None
    return element.find("./source/address").get("uuid")


class LiveMdevHotplug(fixtures.Fixture):
    """nova's fake libvirt, taught what libvirt does with mdevs at suspend.

    The fake has one definition per domain and cannot detach or attach an
    mdev.  Here, as in libvirt: a live detach hides the mdev from the running
    domain's XML and leaves it in the persistent one; a managed save keeps
    the running domain's devices in the saved image, and a start from the
    image has only those, and one whose image was removed
    (``managedSaveRemove``, whose flags libvirt-python defaults to 0 as a
    hard reboot relies on) boots with its whole definition; a live attach
    of an mdev the host does not have fails with VIR_ERR_DEVICE_MISSING;
    and an mdev ``<hostdev>`` always says ``managed='no'`` (nova cannot
    write back one that does not).
    ``host_mdevs()`` gives the UUIDs the host has; with ``per_host``,
    ``host_mdevs(hostname)`` those of the host whose libvirt the domain is in.
    """

    def __init__(self, host_mdevs, per_host=False):
        super().__init__()
        self.host_mdevs = host_mdevs
        self.per_host = per_host
        self.saved_images = {}  # domain name -> mdevs hidden when it was saved

    def _setUp(self):
        for name in (
            "detachDevice",
            "attachDevice",
            "XMLDesc",
            "managedSave",
            "managedSaveRemove",
            "createWithFlags",
        ):
            self.useFixture(
                fixtures.MonkeyPatch(
                    f"{Domain.__module__}.Domain.{name}",
                    getattr(self, f"_{name}")(getattr(Domain, name)),
                )
            )

    @staticmethod
    def _hidden(dom):
        return dom.__dict__.setdefault("_mdevs_detached_live", set())

    def _detachDevice(self, real):
        def detach(dom, xml):
            uuid = _mdev_uuid(xml)
            if uuid is None:
                return real(dom, xml)
            self._hidden(dom).add(uuid)
            return True

        return detach

    def _attachDevice(self, real):
        def attach(dom, xml):
            uuid = _mdev_uuid(xml)
            if uuid is None:
                return real(dom, xml)
            if uuid not in (
                self.host_mdevs(dom._connection.getHostname())
                if self.per_host
                else self.host_mdevs()
            ):
                raise fakelibvirt.make_libvirtError(
                    fakelibvirt.libvirtError,
                    f"mediated device '{uuid}' not found",
                    error_code=fakelibvirt.VIR_ERR_DEVICE_MISSING,
                    error_domain=fakelibvirt.VIR_FROM_DOMAIN,
                )
            self._hidden(dom).discard(uuid)
            return True

        return attach

    def _XMLDesc(self, real):
        def describe(dom, flags):
            tree = etree.fromstring(real(dom, flags))
            # A saved domain is shut off (the fake still calls it active).
            live = (
                dom.isActive()
                and dom.name() not in self.saved_images
                and not flags & fakelibvirt.VIR_DOMAIN_XML_INACTIVE
            )
            hidden = self._hidden(dom) if live else set()
            for hostdev in tree.findall("./devices/hostdev[@type='mdev']"):
                hostdev.set("managed", hostdev.get("managed", "no"))  # libvirt always says
                if hostdev.find("./source/address").get("uuid") in hidden:
                    hostdev.getparent().remove(hostdev)
            return etree.tostring(tree, encoding="unicode")

        return describe

    def _managedSave(self, real):
        def save(dom, flags):
            self.saved_images[dom.name()] = set(self._hidden(dom))
            return real(dom, flags)

        return save

    def _managedSaveRemove(self, real):
        def remove(dom, flags=0):
            self.saved_images.pop(dom.name(), None)
            return real(dom, flags)

        return remove

    def _createWithFlags(self, real):
        def start(dom, flags):
            hidden = self.saved_images.pop(dom.name(), set())
            self._hidden(dom).clear()
            self._hidden(dom).update(hidden)
            return real(dom, flags)

        return start


class SuspendTests(test_power.PowerTestBase):
    def setUp(self):
        super().setUp()
        self.useFixture(LiveMdevHotplug(self.sysfs_mdevs))

    def running_xml_mdevs(self, server):
        guest = self.driver._host.get_guest(self._instance(server))
        return test_power.test_vgpu.guest_xml.mdev_uuids(
            test_power.test_vgpu.guest_xml.parse(guest._domain.XMLDesc(0))
        )

    def test_suspend_and_resume_keep_the_mdev(self):
        server, mdevs = self.boot()
        self._suspend_server(server)
        self.assertEqual([(mdevs[0], "attached")], self.claims(server))
        other, other_mdevs = self.boot("other")
        self.assertNotEqual(mdevs, other_mdevs)
        self._resume_server(server)
        self.assertEqual(mdevs, self.running_xml_mdevs(server))
        self.assert_holds(server, mdevs)
        self.assert_holds(other, other_mdevs)

    def test_resume_after_a_host_reboot_recreates_the_mdev(self):
        server, mdevs = self.boot()
        self._suspend_server(server)
        self.kernels["host1"].reboot()
        self.assertEqual(set(), self.sysfs_mdevs())
        self._resume_server(server)
        self.assertEqual(mdevs, self.running_xml_mdevs(server))
        self.assert_holds(server, mdevs)
