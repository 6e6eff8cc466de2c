"""The mdevs libvirt keeps defined, kept in line with the claims journal.

nova's libvirt driver creates each mdev through libvirt's node-device API
and also *defines* it (mdevctl keeps its definition, autostarted), and its
``init_host`` starts every defined mdev that is not active.  vgpu-driver
creates and removes mdevs through sysfs, so a definition nova left behind
outlives the mdev it described: without this step, the next start-up would
bring back an mdev we removed, or one no guest and no claim stands for.

At start-up, in place of nova's step, every defined mdev is therefore
either kept (a claim not being released, or a domain, still references it:
it is adopted with its claim) or undefined (libvirt forgets it; an active
one stays in sysfs, where the orphan rules decide its fate).  A kept one
that is inactive is started; one that cannot start yet (its VF is not back)
is left to the claims' restore, which keeps retrying in the background,
instead of failing the service's start as nova's step would.

Inventory updates undefine again what nothing wants (what was removed
through sysfs since), so mdevctl's autostart at a host boot does not bring
it back either.  Listing the definitions asks libvirt about every mdev node
device (on a full host most of an update's time), so :class:`Definitions`
does it only when something since the last time can have left a definition
nothing wants: see :meth:`Definitions.due`.
"""

import dataclasses
import time

from lxml import etree
from nova.virt.libvirt import host as nova_host
from oslo_log import log as logging

from vgpu_driver import claims

LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Settled:
    """What :func:`settle` did: UUIDs kept defined, undefined, and started
    (of the kept ones)."""

    kept: tuple[str, ...] = ()
    undefined: tuple[str, ...] = ()
    started: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()  # libvirt would not undefine these


def mdev_uuid(device):
    """The UUID of a libvirt mdev node device.

    libvirt names it ``mdev_<uuid>`` or ``mdev_<uuid>_<parent>`` (uuid with
    underscores); since 7.3 its XML also carries ``<uuid>``, used first.
    """
    root = etree.fromstring(device.XMLDesc(0).encode())
    found = root.findtext("capability[@type='mdev']/uuid")
    if found:
        return found.strip().lower()
    return device.name()[len("mdev_") :][:36].replace("_", "-").lower()


def defined_mdevs(connection):
    """``[(uuid, device)]`` of the mdevs libvirt keeps a definition of,
    active or not (transient ones vanish with their mdev: nothing to do)."""
    flags = nova_host.libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV
    try:
        devices = connection.listAllDevices(flags)
    except nova_host.libvirt.libvirtError as exc:
        LOG.warning("libvirt lists no mdev definitions (%s): none is started", exc)
        return []
    return [(mdev_uuid(d), d) for d in devices if d.isPersistent()]


def _may_be_defined(connection, uuid, parent):
    """Whether libvirt keeps a definition of one mdev, or cannot say (it
    does not know the mdev by either of its names yet)."""
    base = "mdev_" + uuid.replace("-", "_")
    for name in (f"{base}_{parent.replace(':', '_').replace('.', '_')}", base):
        try:
            return bool(connection.nodeDeviceLookupByName(name).isPersistent())
        except nova_host.libvirt.libvirtError:
            continue
    return True


def wanted(journal, domains):
    """UUIDs a claim that is not being released, or a domain, references."""
    held = {c.mdev_uuid for c in journal.claims() if c.state != claims.RELEASING}
    return held | set(domains.mdev_users())


def settle(connection, journal, domains, start=True, keep=None):
    """Undefine every defined mdev nothing here wants (``keep``, else read
    now); with ``start``, start the wanted ones that are inactive, where
    they can start now.  Returns a :class:`Settled`.
    """
    keep = wanted(journal, domains) if keep is None else keep
    kept, undefined, started, refused = [], [], [], []
    for uuid, device in defined_mdevs(connection):
        if uuid not in keep:
            (undefined if _undefine(device, uuid) else refused).append(uuid)
            continue
        kept.append(uuid)
        if start and not device.isActive() and _start(device, uuid):
            started.append(uuid)
    return Settled(*(tuple(sorted(found)) for found in (kept, undefined, started, refused)))


class Definitions:
    """Settles libvirt's mdev definitions when something may need it.

    ``vgpu`` is the core :class:`~vgpu_driver.driver.VGPUDriver`: its
    journal and domains say what is wanted, its udev monitor whether the
    mdevs it last read are current.
    """

    def __init__(self, vgpu, clock=time.monotonic):
        self.vgpu = vgpu
        self.clock = clock
        self._wanted = None  # what was wanted at the last settle
        self._mdevs = frozenset()  # the mdevs sysfs had at the last update
        self._at = None
        self._refused = False

    def settle(self, connection, start=False):
        """Settle now (at start-up, and when :meth:`due`)."""
        keep = wanted(self.vgpu.journal, self.vgpu.domains)
        return self._settle(connection, keep, self._present(), start)

    def settle_if_due(self, connection):
        """After an inventory update: settle if :meth:`due`, else None.
        The mdevs are those of the snapshot the update just read."""
        keep = wanted(self.vgpu.journal, self.vgpu.domains)
        present = self._present()
        if not self.due(connection, keep, present):
            self._mdevs = frozenset(present)
            return None
        return self._settle(connection, keep, present, start=False)

    def due(self, connection, keep, present):
        """Whether a definition nothing wants can be there since the last settle.

        After a settle every definition is wanted (or was refused, and is
        tried again).  One becomes unwanted when a claim or a domain stops
        referencing it, and a new one can come with an mdev that appears
        in sysfs (udev keeps the snapshot current): for one nothing wants,
        libvirt is asked about that mdev alone.  An unwanted mdev that goes
        has no definition left (it was undefined when it appeared or was
        released).  A definition added without an mdev appearing (the
        operator's ``mdevctl define``) waits for ``[vgpu]
        full_refresh_interval``, as a missed udev event does; without udev
        running, every update settles.
        """
        if (
            self._wanted is None
            or self._refused
            or not self.vgpu.changes.running
            or self.clock() - self._at >= self.vgpu.conf.vgpu.full_refresh_interval
            or self._wanted - keep
        ):
            return True
        appeared = set(present) - self._mdevs - keep
        return any(_may_be_defined(connection, uuid, present[uuid]) for uuid in appeared)

    def _present(self):
        """``{uuid: parent}`` of the mdevs in the current snapshot."""
        return {m.uuid: m.parent for m in self.vgpu.manager.snapshot().mdevs}

    def _settle(self, connection, keep, present, start):
        result = settle(connection, self.vgpu.journal, self.vgpu.domains, start, keep)
        self._wanted, self._mdevs, self._at = keep, frozenset(present), self.clock()
        self._refused = bool(result.refused)
        return result


def _undefine(device, uuid):
    """Undefine an mdev nothing wants; False (logged) if libvirt refuses."""
    try:
        device.undefine(0)
    except nova_host.libvirt.libvirtError as exc:
        LOG.error(
            "Could not undefine mdev %s, which no claim and no domain "
            "references (%s): its autostart may bring it back at a host boot",
            uuid,
            exc,
        )
        return False
    LOG.info(
        "Undefined libvirt's mdev %s: no claim and no domain references it, "
        "so it is not started again",
        uuid,
    )
    return True


def _start(device, uuid):
    """Start a defined mdev; False (logged) if libvirt cannot yet."""
    try:
        device.create(0)
    except nova_host.libvirt.libvirtError as exc:
        LOG.warning(
            "Defined mdev %s does not start yet (%s); its claim's restore retries it", uuid, exc
        )
        return False
    LOG.info("Started defined mdev %s", uuid)
    return True
