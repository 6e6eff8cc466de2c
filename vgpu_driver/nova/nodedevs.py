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

Each inventory update undefines again what nothing wants (what was removed
through sysfs since), so mdevctl's autostart at a host boot does not bring
it back either.
"""

import dataclasses

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


def mdev_uuid(device):
    """The UUID of a libvirt mdev node device.

    libvirt names it ``mdev_<uuid>`` or ``mdev_<uuid>_<parent>`` (uuid with
    underscores); since 7.3 its XML also carries ``<uuid>``, used first.
    """
    root = etree.fromstring(device.XMLDesc(0).encode())
    found = root.findtext("capability[@type='mdev']/uuid")
    if found:
        return found.strip().lower()
    return device.name()[len("mdev_"):][:36].replace("_", "-").lower()


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


def wanted(journal, domains):
    """UUIDs a claim that is not being released, or a domain, references."""
    held = {c.mdev_uuid for c in journal.claims() if c.state != claims.RELEASING}
    return held | set(domains.mdev_users())


def settle(connection, journal, domains, start=True):
    """Undefine every defined mdev nothing here wants; with ``start``, start
    the wanted ones that are inactive, where they can start now.  Returns a
    :class:`Settled`.
    """
    keep = wanted(journal, domains)
    kept, undefined, started = [], [], []
    for uuid, device in defined_mdevs(connection):
        if uuid not in keep:
            if _undefine(device, uuid):
                undefined.append(uuid)
            continue
        kept.append(uuid)
        if start and not device.isActive() and _start(device, uuid):
            started.append(uuid)
    return Settled(tuple(sorted(kept)), tuple(sorted(undefined)), tuple(sorted(started)))


def _undefine(device, uuid):
    """Undefine an mdev nothing wants; False (logged) if libvirt refuses."""
    try:
        device.undefine(0)
    except nova_host.libvirt.libvirtError as exc:
        LOG.error("Could not undefine mdev %s, which no claim and no domain "
                  "references (%s): its autostart may bring it back at a host boot",
                  uuid, exc)
        return False
    LOG.info("Undefined libvirt's mdev %s: no claim and no domain references it, "
             "so it is not started again", uuid)
    return True


def _start(device, uuid):
    """Start a defined mdev; False (logged) if libvirt cannot yet."""
    try:
        device.create(0)
    except nova_host.libvirt.libvirtError as exc:
        LOG.warning("Defined mdev %s does not start yet (%s); its claim's restore "
                    "retries it", uuid, exc)
        return False
    LOG.info("Started defined mdev %s", uuid)
    return True
