"""nova's fake libvirt, taught libvirt's node-device API for mdevs.

The fake's ``nodeDeviceCreateXML`` and ``nodeDeviceDefineXML`` do nothing
and its ``listAllDevices`` knows no mdevs, so nova's ``_create_mdev`` and
its start-up's ``_start_inactive_mediated_devices`` cannot run against it.
Here, as in libvirt (with mdevctl keeping the definitions):

* an *active* mdev is one the host's kernel has (here the fake kernel's
  sysfs, whoever created it); a *defined* one has a persistent definition
  (parent, type, UUID, autostart) that survives a restart of the service;
* ``nodeDeviceCreateXML`` creates the mdev in the kernel (transient);
  ``nodeDeviceDefineXML`` adds the definition;
* a device ``create()`` starts a defined, inactive mdev in the kernel;
  ``undefine()`` drops the definition (an active mdev stays, transient);
  ``destroy()`` removes it from the kernel;
* ``listAllDevices`` with the mdev capability lists active and defined
  mdevs, filtered by the inactive flag as libvirt filters them; names are
  libvirt's ``mdev_<uuid>_<parent address>``.
"""

import fixtures
from lxml import etree
from nova.tests.fixtures import libvirt as fakelibvirt

from vgpu_driver import exception

Connection = fakelibvirt.Connection


def libvirt_parent(address):
    """``0000:41:00.4`` -> ``pci_0000_41_00_4``."""
    return "pci_" + address.replace(":", "_").replace(".", "_")


def kernel_parent(libvirt_name):
    """``pci_0000_41_00_4`` -> ``0000:41:00.4``."""
    domain, bus, slot, function = libvirt_name[len("pci_") :].split("_")
    return f"{domain}:{bus}:{slot}.{function}"


def _error(message, code=fakelibvirt.VIR_ERR_INTERNAL_ERROR):
    return fakelibvirt.make_libvirtError(
        fakelibvirt.libvirtError,
        message,
        error_code=code,
        error_domain=fakelibvirt.VIR_FROM_NODEDEV,
    )


class MdevNodeDevice:
    """A ``virNodeDevice`` for one mdev UUID, read live from the registry."""

    def __init__(self, registry, uuid):
        self.registry = registry
        self.uuid = uuid

    def _where(self):
        """``(kernel parent address, type id)`` from the kernel or the definition."""
        active = self.registry.active().get(self.uuid)
        if active is not None:
            return active
        definition = self.registry.definitions.get(self.uuid)
        if definition is None:
            raise _error(
                f"no node device with UUID {self.uuid}", fakelibvirt.VIR_ERR_NO_NODE_DEVICE
            )
        return definition["parent"], definition["type"]

    def name(self):
        parent, _type = self._where()
        return "mdev_{}_{}".format(
            self.uuid.replace("-", "_"), libvirt_parent(parent)[len("pci_") :]
        )

    def XMLDesc(self, flags):
        parent, type_id = self._where()
        group = "<iommuGroup number='99'/>" if self.isActive() else ""
        return (
            f"<device><name>{self.name()}</name><parent>{libvirt_parent(parent)}"
            f"</parent><driver><name>vfio_mdev</name></driver>"
            f"<capability type='mdev'><type id='{type_id}'/><uuid>{self.uuid}</uuid>"
            f"{group}</capability></device>"
        )

    def isActive(self):
        return self.uuid in self.registry.active()

    def isPersistent(self):
        return self.uuid in self.registry.definitions

    def create(self, flags=0):
        if self.isActive():
            raise _error(f"mediated device {self.uuid} is already active")
        parent, type_id = self._where()
        self.registry.create_in_kernel(parent, type_id, self.uuid)
        return 0

    def destroy(self):
        if not self.isActive():
            raise _error(f"mediated device {self.uuid} is not active")
        self.registry.kernel().remove_mdev(self.uuid)
        return 0

    def undefine(self, flags=0):
        if self.registry.definitions.pop(self.uuid, None) is None:
            raise _error(f"mediated device {self.uuid} is not defined")
        return 0

    def setAutostart(self, autostart):
        if not self.isPersistent():
            raise _error(f"mediated device {self.uuid} is transient")
        self.registry.definitions[self.uuid]["autostart"] = bool(autostart)
        return 0


class HostMdevs:
    """One host's mdevs as libvirt knows them: the fake kernel's (active)
    and the persistent definitions, ``{uuid: {"parent": address, "type":
    type id, "autostart": bool}}``."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.definitions = {}

    def active(self):
        """``{uuid: (parent address, type id)}`` of the kernel's mdevs."""
        return {m.uuid: (m.parent, m.type_id) for m in self.kernel().list_mdevs()}

    def create_in_kernel(self, parent, type_id, uuid):
        """Create the mdev; what the kernel refuses (its parent is gone, no
        room) fails as libvirt fails, with a libvirtError."""
        try:
            self.kernel().create_mdev(parent, type_id, uuid)
        except (exception.VgpuDriverError, OSError) as exc:
            raise _error(f"Unable to start mediated device {uuid}: {exc}") from exc

    def defined(self):
        """``{uuid: autostart}`` of the mdevs with a definition."""
        return {u: d["autostart"] for u, d in self.definitions.items()}

    def mdev_uuids(self):
        return sorted(set(self.active()) | set(self.definitions))


class MdevNodeDevices(fixtures.Fixture):
    """The node-device API for mdevs on every fake connection of the test.

    ``kernel_of(hostname)`` gives a host's fake kernel (None: a host without
    one, left to nova's fake); each host has its own :class:`HostMdevs`,
    found by the connection's hostname.
    """

    def __init__(self, kernel_of):
        super().__init__()
        self.kernel_of = kernel_of
        self.hosts = {}

    def _setUp(self):
        for name in (
            "nodeDeviceCreateXML",
            "nodeDeviceDefineXML",
            "listAllDevices",
            "listDevices",
            "nodeDeviceLookupByName",
        ):
            self.useFixture(
                fixtures.MonkeyPatch(
                    f"{Connection.__module__}.Connection.{name}",
                    getattr(self, f"_{name}")(getattr(Connection, name)),
                )
            )

    def host(self, hostname):
        """The host's :class:`HostMdevs`, or None if it has no fake kernel."""
        if self.kernel_of(hostname) is None:
            return None
        if hostname not in self.hosts:
            self.hosts[hostname] = HostMdevs(lambda: self.kernel_of(hostname))
        return self.hosts[hostname]

    def defined(self, hostname):
        """``{uuid: autostart}`` of the host's mdevs with a definition."""
        return self.host(hostname).defined()

    @staticmethod
    def _parse(xml):
        root = etree.fromstring(xml.encode() if isinstance(xml, str) else xml)
        return (
            kernel_parent(root.findtext("parent")),
            root.find("capability[@type='mdev']/type").get("id"),
            root.findtext("capability[@type='mdev']/uuid"),
        )

    def _nodeDeviceCreateXML(self, real):
        def create(conn, xml, flags):
            mdevs = self.host(conn.getHostname())
            if mdevs is None:
                return real(conn, xml, flags)
            parent, type_id, uuid = self._parse(xml)
            if uuid in mdevs.active():
                raise _error(f"mediated device {uuid} is already active")
            mdevs.create_in_kernel(parent, type_id, uuid)
            return MdevNodeDevice(mdevs, uuid)

        return create

    def _nodeDeviceDefineXML(self, real):
        def define(conn, xml, flags):
            mdevs = self.host(conn.getHostname())
            if mdevs is None:
                return real(conn, xml, flags)
            parent, type_id, uuid = self._parse(xml)
            mdevs.definitions[uuid] = {"parent": parent, "type": type_id, "autostart": False}
            return MdevNodeDevice(mdevs, uuid)

        return define

    def _listAllDevices(self, real):
        def list_all(conn, flags):
            devices = real(conn, flags)
            mdevs = self.host(conn.getHostname())
            if mdevs is not None and flags & fakelibvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV:
                found = [MdevNodeDevice(mdevs, u) for u in mdevs.mdev_uuids()]
                if flags & fakelibvirt.VIR_CONNECT_LIST_NODE_DEVICES_INACTIVE:
                    found = [d for d in found if not d.isActive()]
                devices.extend(found)
            return devices

        return list_all

    def _listDevices(self, real):
        def list_devices(conn, cap, flags):
            mdevs = self.host(conn.getHostname())
            if mdevs is not None and cap == "mdev":
                return [MdevNodeDevice(mdevs, u).name() for u in sorted(mdevs.active())]
            return real(conn, cap, flags)

        return list_devices

    def _nodeDeviceLookupByName(self, real):
        def lookup(conn, name):
            mdevs = self.host(conn.getHostname())
            if mdevs is not None and isinstance(name, str) and name.startswith("mdev_"):
                uuid = name[len("mdev_") :][:36].replace("_", "-")
                if uuid in mdevs.mdev_uuids():
                    return MdevNodeDevice(mdevs, uuid)
                raise _error(f"no node device with name {name}", fakelibvirt.VIR_ERR_NO_NODE_DEVICE)
            return real(conn, name)

        return lookup
