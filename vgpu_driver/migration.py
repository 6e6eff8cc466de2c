"""Live migration of guests with vGPUs: the gates, claims, XML mapping.

A vGPU is an mdev, or on NVIDIA's vendor-specific VFIO a VF set to a type,
which QEMU migrates as any VFIO device (migration protocol v2, no
post-copy).  Destination: check that the source's vGPU types are served
here, claim vGPUs for them (journal state ``migrating_in``, so a restart
during the migration keeps them; a VF gets its type when claimed), and
return the mapping source id -> destination id, an mdev for an mdev and a
VF for a VF.  nova rewrites the domain XML it sends with that mapping
(``target_mdevs`` for mdev UUIDs, ``pci_dev_map_src_dst`` for the VFs' PCI
hostdevs; :mod:`vgpu_driver.nova.live_migration`) and refuses an mdev it
does not name.  Rollback drops the destination claims and removes the vGPUs that
were created for this attempt only; success turns the claims into ordinary
``attached`` ones.
"""

import collections

from oslo_log import log as logging

from vgpu_driver import claims
from vgpu_driver import host_snapshot
from vgpu_driver import inventory
from vgpu_driver import libvirt_host
from vgpu_driver import names
from vgpu_driver.exception import MigrationPreCheckFailed
from vgpu_driver.exception import SourceNotMigratable
from vgpu_driver.placement import ownership

LOG = logging.getLogger(__name__)

MIN_KERNEL = (5, 18, 0)  # VFIO migration's v2 protocol
# QEMU 8.2 migrates several VFIO devices of one guest, and only when each
# supports the P2P quiescent state (QEMU reads that from the device when the
# guest starts; one without it blocks the migration as it begins).
MIN_QEMU_SEVERAL_VFIO = (8, 2, 0)


def _dotted(version):
    return ".".join(str(v) for v in version)


def check_kernel(instance, side, release=None):
    """Refuse when this host's kernel predates VFIO migration (its v2
    protocol); nova checks libvirt's and QEMU's versions, not the kernel's.
    Each side checks itself."""
    have = libvirt_host.kernel_version(release)
    if have < MIN_KERNEL:
        raise MigrationPreCheckFailed(
            instance=instance,
            reason=f"the {side} host's Linux kernel is {_dotted(have)}, "
            f"{_dotted(MIN_KERNEL)} or later is needed",
        )


def check_several_vfio(instance, side, devices, qemu_version):
    """Refuse a guest with several VFIO devices (its vGPUs, mdevs or VFs,
    and other PCI hostdevs) where this host's QEMU migrates one at most.
    Each side checks itself; the devices' P2P support is QEMU's to check."""
    if len(devices) > 1 and tuple(qemu_version) < MIN_QEMU_SEVERAL_VFIO:
        raise MigrationPreCheckFailed(
            instance=instance,
            reason=f"it has {len(devices)} VFIO devices ({', '.join(sorted(devices))}); "
            f"QEMU migrates several from {_dotted(MIN_QEMU_SEVERAL_VFIO)} on, each "
            f"supporting P2P, and the {side} host's QEMU is {_dotted(qemu_version)}",
        )


def check_post_copy(instance, vfs, permit_post_copy):
    """Refuse a guest with vendor-VFIO VFs while nova may switch to
    post-copy: QEMU migrates no VFIO device in post-copy, and NVIDIA
    supports none for these vGPUs."""
    if vfs and permit_post_copy:
        raise MigrationPreCheckFailed(
            instance=instance,
            reason=f"its vGPUs on VFs {', '.join(vfs)} (NVIDIA vendor-specific VFIO) cannot "
            "be migrated in post-copy mode, and [libvirt] "
            "live_migration_permit_post_copy is on: set it to false on vGPU hosts",
        )


def check_vgpu_manager(instance, vfs, source_traits, own_version):
    """Refuse moving vendor-VFIO vGPUs between hosts whose NVIDIA vGPU
    managers differ, or where either cannot be told: NVIDIA migrates them
    only between hosts running one manager version.

    ``source_traits`` are the traits of the GPU providers the guest holds on
    the source (Placement's: the destination reads no other host), which
    carry the source's version (:func:`vgpu_driver.inventory.manager_trait`);
    ``own_version`` is this host's.  mdevs are not judged: NVIDIA's rules for
    them allow some version pairs.
    """
    if not vfs:
        return
    source_managers = {t for t in source_traits if t.startswith(ownership.MANAGER_TRAIT_PREFIX)}
    source = sorted(inventory.manager_version_of(t) for t in source_managers)
    if not source:
        reason = (
            "the source host's NVIDIA vGPU manager version is unknown: its GPU "
            f"providers carry no {ownership.MANAGER_TRAIT_PREFIX}* trait (no NVIDIA "
            "module loaded there, or a vgpu-driver too old to report it)"
        )
    elif own_version is None:
        reason = (
            "this host's NVIDIA vGPU manager version is unknown (no readable "
            "/sys/module/nvidia/version)"
        )
    elif source_managers != {inventory.manager_trait(own_version)}:
        reason = (
            f"the source host runs NVIDIA vGPU manager {', '.join(source)} and this "
            f"host {own_version}; vGPUs on VFs {', '.join(vfs)} (vendor-specific "
            "VFIO) migrate only between hosts of one manager version"
        )
    else:
        return
    raise MigrationPreCheckFailed(instance=instance, reason=reason)


def post_copy_warning(permit_post_copy):
    """QEMU refuses VFIO migration with post-copy; say so before it fails."""
    if not permit_post_copy:
        return None
    message = (
        "live_migration_permit_post_copy is on: QEMU refuses to migrate a guest "
        "with a vGPU (VFIO device) in post-copy mode; set it to false on vGPU "
        "hosts"
    )
    LOG.warning(message)
    return message


def _map_by_type(instance, source_types, claimed_by_type):
    """``{source id: destination id}`` pairing each source vGPU with a claimed
    one of its type and kind (mdev or VF), a VF with its own address first."""
    pending = sorted(source_types.items())
    mapping = {s: s for s, t in pending if s in claimed_by_type.get(t, ())}
    for source_id, type_id in pending:
        if source_id in mapping:
            claimed_by_type[type_id].remove(source_id)
    for source_id, type_id in pending:
        if source_id in mapping:
            continue
        candidates = claimed_by_type.get(type_id, [])
        same_kind = [
            c for c in candidates if names.is_vf_vgpu_id(c) == names.is_vf_vgpu_id(source_id)
        ]
        if not same_kind:
            kind = "VF" if names.is_vf_vgpu_id(source_id) else "mdev"
            raise MigrationPreCheckFailed(
                instance=instance,
                reason=f"the destination's allocation has no {type_id} {kind} for source "
                f"vGPU {source_id}",
            )
        candidates.remove(same_kind[0])
        mapping[source_id] = same_kind[0]
    extra = [u for ids in claimed_by_type.values() for u in ids]
    if extra:
        raise MigrationPreCheckFailed(
            instance=instance,
            reason=f"the destination's allocation has {len(extra)} more vGPU(s) than the guest",
        )
    crossed = sorted(
        s
        for s, d in mapping.items()
        if s != d and d in mapping and source_types[d] != source_types[s]
    )
    if crossed:
        raise MigrationPreCheckFailed(
            instance=instance,
            reason=f"the destination's VFs for {', '.join(crossed)} are the source's "
            "addresses of vGPUs of another type; rewritten one hostdev at a time "
            "they would swap types (try again: the destination's free VFs change)",
        )
    return mapping


class Migrations:
    """Both ends of a live migration, on top of an MdevManager."""

    def __init__(self, manager):
        self.manager = manager

    # -- source ------------------------------------------------------------------------

    def source_mdev_types(self, mdev_uuids):
        """``{vGPU id: type id}`` of a guest's vGPUs (mdev UUIDs, VF
        addresses), as this host's sysfs has them."""
        types = {v.id: v.type_id for v in self.manager.snapshot(refresh=True).vgpus}
        missing = [u for u in mdev_uuids if u not in types]
        if missing:
            raise SourceNotMigratable(
                reason=f"vGPUs {', '.join(missing)} of the guest are not on this host"
            )
        return {u: types[u] for u in mdev_uuids}

    # -- destination ---------------------------------------------------------------------

    def check_vgpu_manager(self, instance, source_mdev_types, source_traits):
        """:func:`check_vgpu_manager` against this host's manager, now."""
        vfs = sorted(u for u in source_mdev_types if names.is_vf_vgpu_id(u))
        own = self.manager.host.vgpu_manager_version()  # one file, not a whole read
        check_vgpu_manager(instance, vfs, source_traits, own)

    def claim_incoming(self, instance, source_mdev_types, allocations, providers):
        """Claim this host's vGPUs for an incoming guest; ``{source: destination}``.

        Of each type, a source VF keeps its address here when this host
        claimed the same one, so the mapping moves as few hostdevs as it
        can; a mapping whose destinations are other sources' addresses of
        another type is refused (applied one hostdev at a time, as nova's
        PCI rewrite applies it, it would swap their types).
        """
        wanted = collections.Counter(source_mdev_types.values())
        served = {
            t for p in providers.values() for t in (dict(p.sizes) if p.mixed else (p.type_id,))
        }
        unsupported = sorted(
            t for t in wanted if t not in served or t not in self.manager.config.enabled
        )
        if unsupported:
            raise MigrationPreCheckFailed(
                instance=instance,
                reason=f"source mdev types {unsupported} are not served by this host "
                f"(it serves {sorted(served)})",
            )
        if any(not names.is_vf_vgpu_id(u) for u in source_mdev_types):
            self._refuse_vf_destinations(instance, allocations, providers)
        # The source's types name those of a mixed-size board's MiB.
        mdevs = self.manager.allocate(
            instance,
            allocations,
            providers,
            state=claims.MIGRATING_IN,
            type_traits={inventory.type_traits(t, None)[0] for t in wanted},
        )
        by_type = collections.defaultdict(list)
        for claim in self.manager.journal.claims(instance):
            if claim.mdev_uuid in mdevs:
                by_type[claim.type_id].append(claim.mdev_uuid)
        try:
            mapping = _map_by_type(instance, source_mdev_types, by_type)
        except MigrationPreCheckFailed:
            self.rollback_incoming(instance)
            raise
        LOG.info("Incoming migration of %s: vGPUs %s", instance, mapping)
        return mapping

    def _refuse_vf_destinations(self, instance, allocations, providers):
        """An mdev cannot arrive on a vendor-VFIO GPU: the guest would need a
        PCI hostdev of a VF in place of its mdev hostdev."""
        snapshot = self.manager.snapshot()
        for rp_uuid in sorted(allocations):
            provider = providers.get(rp_uuid)
            gpu = snapshot.gpu(provider.gpu) if provider is not None else None
            if gpu is not None and gpu.mode == host_snapshot.MODE_VENDOR_VFIO:
                raise MigrationPreCheckFailed(
                    instance=instance,
                    reason=f"the destination's GPU {gpu.address} serves vGPUs as "
                    "vendor-VFIO VFs, which cannot take a migrated mdev",
                )

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
        LOG.info(
            "Rolled back incoming migration of %s; removed %s",
            instance,
            ", ".join(removed) or "nothing",
        )
        return removed

    def finish_outgoing(self, instance):
        """The guest left: its claims here go, its mdevs are free again."""
        return self.manager.release(instance)
