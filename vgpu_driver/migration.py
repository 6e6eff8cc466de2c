"""Live migration of guests with mdevs: the kernel gate, claims, XML mapping.

Destination: check that the source's mdev types are served here, claim
mdevs for them (journal state ``migrating_in``, so a restart during the
migration keeps them), and return the mapping source UUID -> destination
UUID.  Source: rewrite the domain XML with that mapping, refusing any mdev
it does not name.  Rollback drops the destination claims and removes the
mdevs that were created for this attempt only; success turns the claims into
ordinary ``attached`` ones.
"""

import collections

from oslo_log import log as logging

from vgpu_driver import claims
from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import guest
from vgpu_driver import libvirt_host
from vgpu_driver import names

LOG = logging.getLogger(__name__)

MIN_KERNEL = (5, 18, 0)   # VFIO migration's v2 protocol


class MigrationPreCheckFailed(exception.VgpuDriverError):
    msg_fmt = "Cannot live-migrate instance %(instance)s with vGPUs: %(reason)s"


class SourceNotMigratable(exception.VgpuDriverError):
    msg_fmt = "Cannot live-migrate the guest's vGPUs from this host: %(reason)s"


def _dotted(version):
    return ".".join(str(v) for v in version)


def check_kernel(instance, side, release=None):
    """Refuse when this host's kernel predates VFIO migration (its v2
    protocol); nova checks libvirt's and QEMU's versions, not the kernel's.
    Each side checks itself."""
    have = libvirt_host.kernel_version(release)
    if have < MIN_KERNEL:
        raise MigrationPreCheckFailed(
            instance=instance, reason=f"the {side} host's Linux kernel is {_dotted(have)}, "
                                      f"{_dotted(MIN_KERNEL)} or later is needed")


def post_copy_warning(permit_post_copy):
    """QEMU refuses VFIO migration with post-copy; say so before it fails."""
    if not permit_post_copy:
        return None
    message = ("live_migration_permit_post_copy is on: QEMU refuses to migrate a guest "
               "with a vGPU (VFIO device) in post-copy mode; set it to false on vGPU "
               "hosts")
    LOG.warning(message)
    return message


class Migrations:
    """Both ends of a live migration, on top of an MdevManager."""

    def __init__(self, manager):
        self.manager = manager

    # -- source ------------------------------------------------------------------------

    def source_mdev_types(self, mdev_uuids):
        """``{uuid: type id}`` of a guest's mdevs, as this host's sysfs has them.

        A guest holding a vendor-VFIO vGPU is refused: its VF is a PCI
        hostdev, which the mapping and the XML rewrite do not carry.
        """
        vfs = [u for u in mdev_uuids if names.is_vf_vgpu_id(u)]
        if vfs:
            raise SourceNotMigratable(
                reason=f"its vGPUs on VFs {', '.join(vfs)} (NVIDIA vendor-specific VFIO) "
                       "cannot be live-migrated by vgpu-driver")
        types = {m.uuid: m.type_id for m in self.manager.snapshot(refresh=True).mdevs}
        missing = [u for u in mdev_uuids if u not in types]
        if missing:
            raise SourceNotMigratable(
                reason=f"mdevs {', '.join(missing)} of the guest are not on this host")
        return {u: types[u] for u in mdev_uuids}

    @staticmethod
    def rewrite_xml(domain_xml, mapping):
        """The domain XML to send, with every mdev mapped to the destination's."""
        return guest.to_string(guest.rewrite_mdevs(guest.parse(domain_xml), mapping))

    # -- destination ---------------------------------------------------------------------

    def claim_incoming(self, instance, source_mdev_types, allocations, providers):
        """Claim this host's mdevs for an incoming guest; ``{source: destination}``."""
        wanted = collections.Counter(source_mdev_types.values())
        served = {p.type_id for p in providers.values()}
        unsupported = sorted(t for t in wanted if t not in served
                             or t not in self.manager.config.enabled)
        if unsupported:
            raise MigrationPreCheckFailed(
                instance=instance,
                reason=f"source mdev types {unsupported} are not served by this host "
                       f"(it serves {sorted(served)})")
        self._refuse_vf_destinations(instance, allocations, providers)
        mdevs = self.manager.allocate(instance, allocations, providers,
                                      state=claims.MIGRATING_IN)
        by_type = collections.defaultdict(list)
        for claim in self.manager.journal.claims(instance):
            if claim.mdev_uuid in mdevs:
                by_type[claim.type_id].append(claim.mdev_uuid)
        mapping = {}
        for source_uuid, type_id in sorted(source_mdev_types.items()):
            if not by_type.get(type_id):
                self.rollback_incoming(instance)
                raise MigrationPreCheckFailed(
                    instance=instance,
                    reason=f"the destination's allocation has no {type_id} for source "
                           f"mdev {source_uuid}")
            mapping[source_uuid] = by_type[type_id].pop(0)
        extra = [u for uuids in by_type.values() for u in uuids]
        if extra:
            self.rollback_incoming(instance)
            raise MigrationPreCheckFailed(
                instance=instance,
                reason=f"the destination's allocation has {len(extra)} more vGPU(s) than "
                       "the guest")
        LOG.info("Incoming migration of %s: mdevs %s", instance, mapping)
        return mapping

    def _refuse_vf_destinations(self, instance, allocations, providers):
        """An mdev cannot arrive on a vendor-VFIO GPU: the guest would need a
        PCI hostdev of a VF in place of its mdev hostdev."""
        snapshot = self.manager.snapshot()
        for rp_uuid in sorted(allocations):
            provider = providers.get(rp_uuid)
            gpu = snapshot.gpu(provider.gpu) if provider is not None else None
            if gpu is not None and gpu.mode == discovery.MODE_VENDOR_VFIO:
                raise MigrationPreCheckFailed(
                    instance=instance,
                    reason=f"the destination's GPU {gpu.address} serves vGPUs as "
                           "vendor-VFIO VFs, which cannot take a migrated mdev")

    def finish_incoming(self, instance):
        """The guest runs here now: its claims are ordinary attached ones."""
        return self.manager.mark_attached(instance)

    def rollback_incoming(self, instance):
        """Drop the migration's claims; remove the mdevs made for it alone."""
        with self.manager.journal.transaction() as txn:
            incoming = [c for c in txn.claims(instance) if c.state == claims.MIGRATING_IN]
            made = [c.mdev_uuid for c in incoming if c.created]
            txn.remove(instance, [c.mdev_uuid for c in incoming if not c.created])
            # The ones to remove stay reserved until the kernel has removed them.
            if made:
                txn.set_state(instance, claims.RELEASING, made)
        removed = self.manager.finish_release(made) if made else []
        LOG.info("Rolled back incoming migration of %s; removed %s", instance,
                 ", ".join(removed) or "nothing")
        return removed

    def finish_outgoing(self, instance):
        """The guest left: its claims here go, its mdevs are free again."""
        return self.manager.release(instance)
