"""Live migration of vGPU guests: nova's libvirt driver, its mdev steps ours.

The source checks that its kernel migrates VFIO devices; the destination
claims its vGPUs for the incoming guest (journalled ``migrating_in``, so a
restart of nova-compute during the migration keeps them) and maps the
source's vGPUs to them; the claims then become the guest's, or go again on
a rollback.  The mapping travels in nova's own migrate data: mdevs in
``target_mdevs`` (nova rewrites the mdev hostdevs), vendor-VFIO VFs in
``pci_dev_map_src_dst`` (nova rewrites the PCI hostdevs' addresses, as
for its own live-migratable PCI devices).  The work itself is
:mod:`vgpu_driver.migration`'s; this layer only hooks it into nova's calls.

:class:`LiveMigration` sits between nova's ``LibvirtDriver`` and
:class:`~vgpu_driver.nova.driver.LibvirtVGPUDriver` (under
:class:`~vgpu_driver.nova.allocation.Allocation`), so its ``super()`` is
nova's.  It uses what the driver class provides: ``vgpu`` (the core driver),
``_instance_mdevs``, ``_providers_by_uuid`` and ``_operating_on``.
"""

import time

import nova.conf
from keystoneauth1 import exceptions as ks_exceptions
from nova import context as nova_context
from nova import exception as nova_exception
from nova import objects
from nova.virt.libvirt import driver as libvirt_driver
from oslo_log import log as logging

from vgpu_driver import claims as vgpu_claims
from vgpu_driver import exception
from vgpu_driver import host_reconciler
from vgpu_driver import libvirt_host
from vgpu_driver import migration as vgpu_migration
from vgpu_driver import names

CONF = nova.conf.CONF
LOG = logging.getLogger(__name__)


class LiveMigration(libvirt_driver.LibvirtDriver):
    """nova's live-migration steps, with the guest's vGPUs claimed and freed."""

    def check_source_migrate_data_at_dest(
        self, ctxt, instance, migrate_data, migration, limits, allocs
    ):
        """Claim this host's mdevs for the incoming guest and map the source's.

        The claims are journalled ``migrating_in``, so a restart of this
        service during the migration keeps them.  (nova's implementation only
        does this mdev work, so it is not called when there is some.)
        """
        source_types = (
            migrate_data.source_mdev_types if "source_mdev_types" in migrate_data else None
        )
        if not source_types:
            return super().check_source_migrate_data_at_dest(
                ctxt, instance, migrate_data, migration, limits, allocs
            )
        nova_pci = dict(
            migrate_data.pci_dev_map_src_dst if "pci_dev_map_src_dst" in migrate_data else {}
        )
        try:
            vgpu_migration.check_kernel(instance.uuid, "destination")
            vgpu_migration.check_several_vfio(
                instance.uuid, "destination", [*source_types, *nova_pci], self._qemu_version()
            )
            if any(names.is_vf_vgpu_id(u) for u in source_types):
                self.vgpu.migrations.check_vgpu_manager(
                    instance.uuid, source_types, self._source_gpu_traits(ctxt, migration)
                )
            mapping = self.vgpu.migrations.claim_incoming(
                instance.uuid, dict(source_types), allocs or {}, self._providers_by_uuid(allocs)
            )
        except exception.VgpuDriverError as exc:
            raise nova_exception.MigrationPreCheckError(reason=str(exc)) from exc
        vfs = {s: d for s, d in mapping.items() if names.is_vf_vgpu_id(s)}
        # Set even when empty: it is what makes nova send the rollback here.
        migrate_data.target_mdevs = {s: d for s, d in mapping.items() if s not in vfs}
        if vfs:
            # nova's flavor-based PCI claims are in it already: added to, not replaced.
            migrate_data.pci_dev_map_src_dst = {**nova_pci, **vfs}
        return migrate_data

    def _qemu_version(self):
        return libvirt_host.version_tuple(self._host.get_connection().getVersion())

    def _source_gpu_traits(self, context, migration):
        """The traits of the source GPU providers the guest holds: nova moved
        the source's allocation to the migration's consumer."""
        reportclient = self.virtapi.reportclient
        classes = self.vgpu.mdev_config.mdev_classes
        try:
            allocations = reportclient.get_allocs_for_consumer(context, migration.uuid)[
                "allocations"
            ]
            return {
                trait
                for rp, allocation in sorted(allocations.items())
                if classes & set(allocation.get("resources", {}))
                for trait in reportclient.get_provider_traits(context, rp).traits
            }
        except (
            nova_exception.ConsumerAllocationRetrievalFailed,
            nova_exception.TraitRetrievalFailed,
            ks_exceptions.ClientException,
        ) as exc:
            raise nova_exception.MigrationPreCheckError(
                reason=f"Placement did not say which NVIDIA vGPU manager the source runs "
                f"({exc}); vendor-VFIO vGPUs migrate only between hosts of one "
                "version"
            ) from exc

    def check_can_live_migrate_source(self, context, instance, dest_check_data, *args, **kwargs):
        """A guest with vGPUs needs a kernel that migrates VFIO devices here
        too; QEMU refuses their post-copy, so that setting is warned about,
        and refused for a guest with vendor-VFIO VFs."""
        vgpus = self._instance_mdevs(instance)
        if vgpus:
            try:
                vgpu_migration.check_kernel(instance.uuid, "source")
                vgpu_migration.check_several_vfio(
                    instance.uuid, "source", vgpus, self._qemu_version()
                )
                vgpu_migration.check_post_copy(
                    instance.uuid,
                    [v for v in vgpus if names.is_vf_vgpu_id(v)],
                    CONF.libvirt.live_migration_permit_post_copy,
                )
            except exception.VgpuDriverError as exc:
                raise nova_exception.MigrationPreCheckError(reason=str(exc)) from exc
            vgpu_migration.post_copy_warning(CONF.libvirt.live_migration_permit_post_copy)
        return super().check_can_live_migrate_source(
            context, instance, dest_check_data, *args, **kwargs
        )

    def post_live_migration_at_destination(self, context, instance, *args, **kwargs):
        super().post_live_migration_at_destination(context, instance, *args, **kwargs)
        self.vgpu.migrations.finish_incoming(instance.uuid)

    def post_live_migration_at_source(self, context, instance, network_info):
        super().post_live_migration_at_source(context, instance, network_info)
        self.vgpu.migrations.finish_outgoing(instance.uuid)

    def rollback_live_migration_at_destination(self, context, instance, *args, **kwargs):
        with self._operating_on(instance, keep_claims=True):
            super().rollback_live_migration_at_destination(context, instance, *args, **kwargs)
        self._rollback_incoming(instance)

    def cleanup_lingering_instance_resources(self, instance):
        super().cleanup_lingering_instance_resources(instance)
        self._rollback_incoming(instance)

    def end_forgotten_migrations(self, reasons):
        """A host reconciler step (at each periodic update's pass): roll back
        the incoming live migrations nova no longer has in progress.

        A destination's ``migrating_in`` claims end with the migration, or
        with its rollback reaching this host; when nova's record says the
        migration is over and no domain here uses the vGPUs, that rollback
        was lost, and waiting for ``[vgpu] migration_claim_timeout`` would
        only keep the vGPUs reserved.  Claims younger than ``claim_grace``
        are left alone: nova writes its record before asking us.
        """
        if host_reconciler.PERIODIC not in reasons:
            return
        users = self.vgpu.domains.mdev_users()
        now = time.time()
        candidates = {
            c.instance_uuid
            for c in self.vgpu.journal.claims()
            if c.state == vgpu_claims.MIGRATING_IN
            and c.mdev_uuid not in users
            and now - c.updated_at > CONF.vgpu.claim_grace
        }
        if not candidates:
            return
        context = nova_context.get_admin_context()
        for instance in sorted(candidates):
            if any(ref.uuid == instance for ref in users.values()):
                continue
            if objects.MigrationList.get_in_progress_by_instance(
                context, instance, migration_type="live-migration"
            ):
                continue
            LOG.warning(
                "Instance %s: nova has no live migration to this host in "
                "progress any more, and no domain here uses the vGPUs held "
                "for it; its rollback never reached this host, done now",
                instance,
            )
            self.vgpu.migrations.rollback_incoming(instance)

    def _rollback_incoming(self, instance):
        if any(
            c.state == vgpu_claims.MIGRATING_IN for c in self.vgpu.journal.claims(instance.uuid)
        ):
            self.vgpu.migrations.rollback_incoming(instance.uuid)
