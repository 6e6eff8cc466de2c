"""LibvirtVGPUDriver: nova's libvirt driver, its vGPU work done by vgpu-driver.

Only the vGPU concerns are replaced, each by a call into
:class:`vgpu_driver.driver.VGPUDriver`: the GPU part of the provider tree
(one provider per physical GPU, traits, reserved inventory, stale providers
removed, nova's per-VF providers taken over), and the vGPUs an instance gets
and keeps, claims first, through spawn, resize, hard reboot, rescue, resume
and live migration (:mod:`vgpu_driver.nova.live_migration`).  What the host
reconciler does for nova-compute is :mod:`vgpu_driver.nova.reconciler_steps`.
Everything else is nova's.
"""

import collections
import threading

import nova.conf
from nova import exception as nova_exception
from oslo_log import log as logging
from oslo_utils import excutils

from vgpu_driver import board_stats
from vgpu_driver import claims as vgpu_claims
from vgpu_driver import driver as core
from vgpu_driver import exception
from vgpu_driver import framebuffer
from vgpu_driver import sriov_notices
from vgpu_driver.conf import devices as devices_conf
from vgpu_driver.conf import mdev_types
from vgpu_driver.conf import vgpu as vgpu_conf
from vgpu_driver.nova import allocation
from vgpu_driver.nova import compat
from vgpu_driver.nova import events
from vgpu_driver.nova import hostdevs as nova_hostdevs
from vgpu_driver.nova import nodedevs
from vgpu_driver.nova import operations
from vgpu_driver.nova import providers
from vgpu_driver.nova import reconciler_steps
from vgpu_driver.nova import reshape
from vgpu_driver.nova import startup
from vgpu_driver.nova import usage

CONF = nova.conf.CONF
LOG = logging.getLogger(__name__)

# As nova's own options: registered on import, so nova.conf can set them.
vgpu_conf.register_opts(CONF)
devices_conf.register_beside_nova(CONF)


class LibvirtVGPUDriver(allocation.Allocation):
    """nova's libvirt driver (through its live-migration and allocation
    layers), vGPUs ours."""

    def __init__(self, virtapi, read_only=False):
        # Before anything of nova's is touched: a nova without the hooks
        # below stops nova-compute here, saying which, not at a spawn.
        compat.check()
        super().__init__(virtapi, read_only)
        compat.check_driver(self)
        self._vgpu = None
        # Before nova's init_host opens the connection: the index wraps how
        # the Host connects and registers its event callbacks, or it would
        # never hear that connection's events and re-read every domain at
        # each lookup.
        self._domains = events.domain_index_of(self._host)
        self._definitions = None
        self._gpu_tree = None
        self._operation = allocation.Operation()
        # Instances under an operation that destroys their domain to define
        # it again (hard reboot, rescue...): their destroy keeps the claims.
        self._keeping = collections.Counter()
        self._keeping_lock = threading.Lock()
        # Instances under a nova operation: the host reconciler leaves their
        # claims alone (:mod:`vgpu_driver.nova.operations`).
        self.operations = operations.OperationGuard(lambda: self._host.get_hostname())
        # A configured GPU whose SR-IOV VFs are off is logged once, not at
        # every periodic update.
        self._vfs_notices = sriov_notices.PendingNotices()

    def _get_supported_vgpu_types(self):
        """nova's reading of ``[devices]`` and ``[mdev_*]``, but for a board
        several NVIDIA types share (mixed sizes), which nova refuses as a
        duplicate.  With such a board, nova's maps are filled from this
        package's reading of the same options, which validates them instead:
        each board its type (a mixed-size board its first, with the
        framebuffer class), so nova's own code finds the classes it filters
        allocations by."""
        # nova's [mdev_*] options first, as nova's reading registers them.
        nova.conf.devices.register_dynamic_opts(CONF)
        # Read once, and handed to the core driver made at init_host.
        self._mdev_config = config = mdev_types.from_conf(CONF)
        if not config.mixed_types:
            return super()._get_supported_vgpu_types()
        for type_config in config.types:
            if type_config.max_instances:
                self.mdev_type_max_mapping[type_config.type_id] = type_config.max_instances
        for address, type_id in config.by_address.items():
            self.pgpu_type_mapping[address] = type_id
            self.mdev_class_mapping[address] = config.type_config(type_id).mdev_class
        for address, types in config.mixed_by_address.items():
            self.pgpu_type_mapping[address] = types[0]
            self.mdev_class_mapping[address] = framebuffer.RESOURCE_CLASS
        self.pgpu_type_default = config.default_type
        self.mdev_classes.update(config.mdev_classes)
        return [
            t.type_id
            for t in config.types
            if t.device_addresses or t.device_ids or t.type_id == config.default_type
        ]

    @property
    def vgpu(self):
        """The core driver, made once nova's dynamic [mdev_*] options exist."""
        if self._vgpu is None:
            self._vgpu = core.VGPUDriver(CONF, self._domains, mdev_config=self._mdev_config)
        return self._vgpu

    @property
    def definitions(self):
        """libvirt's mdev definitions, settled when something may need it."""
        if self._definitions is None:
            self._definitions = nodedevs.Definitions(self.vgpu)
        return self._definitions

    # -- start-up ----------------------------------------------------------------------

    def init_host(self, host):
        super().init_host(host)
        # nova's event loop runs now: domain events keep the index current.
        self.vgpu.domains.event_driven = True
        # nova-compute's keeper and steps, before the start-up pass below.
        reconciler_steps.attach(self)
        for outcome in self.vgpu.init_host():
            if outcome.result == "waiting":
                LOG.warning(
                    "vGPU %s is not back yet: %s; the host reconciler re-creates "
                    "it as soon as it appears",
                    outcome.mdev_uuid,
                    outcome.reason,
                )
            elif outcome.result != "restored":
                LOG.error("vGPU %s could not be restored: %s", outcome.mdev_uuid, outcome.reason)
        startup.settle_interrupted_reboots(self, host)

    def cleanup_host(self, host):
        """The service stops: so does its host reconciler."""
        if self._vgpu is not None:
            self._vgpu.close()
        super().cleanup_host(host)

    def _start_inactive_mediated_devices(self):
        """Instead of nova's start of every defined mdev: undefine those no
        claim and no domain wants (never resurrected), start the others
        that can start now (a late VF does not stop the service)."""
        self.definitions.settle(self._host.get_connection(), start=True)

    # -- inventory -----------------------------------------------------------------------

    def _update_provider_tree_for_vgpu(self, provider_tree, nodename, allocations=None):
        reportclient = self.virtapi.reportclient
        tree = self._write_gpu_providers(
            provider_tree,
            nodename,
            lambda name: usage.allocations_on(reportclient, provider_tree, name),
        )
        # After the GPU providers are in the tree: a reshape moves allocations
        # to them, and sends them with their inventory in the same request.
        reshape.take_over(
            provider_tree,
            nodename,
            self.vgpu,
            tree,
            allocations,
            lambda name: usage.allocations_on(reportclient, provider_tree, name),
        )
        if allocations is not None:
            # Reserve only the claims the moved allocations do not cover.
            tree = self._write_gpu_providers(
                provider_tree,
                nodename,
                lambda name: usage.allocations_in(allocations, provider_tree, name),
            )
        providers.prune(provider_tree, nodename, tree, self.vgpu.journal, reportclient)

    def get_available_resource(self, nodename):
        """nova's, with the boards of the last inventory written as a stat
        (:mod:`vgpu_driver.board_stats`), for the scheduler's weigher.  At
        start, before nova has asked for an inventory, the boards as the
        host is now: nova's update at start publishes them, not a periodic
        one a minute later (nova clears a node's stats at each update)."""
        resources = super().get_available_resource(nodename)
        tree = self._gpu_tree if self._gpu_tree is not None else self.vgpu.inventory_now(nodename)
        published = board_stats.encode(tree)
        if published:
            resources["stats"] = {**(resources.get("stats") or {}), board_stats.STAT: published}
        return resources

    def _write_gpu_providers(self, provider_tree, nodename, allocations_on):
        tree = self.vgpu.provider_tree(nodename, allocations_on)
        self._gpu_tree = tree
        self._vfs_notices.report(tree, LOG)
        providers.write(provider_tree, nodename, tree)
        return tree

    def _instance_mdevs(self, instance):
        """The vGPUs (mdevs, vendor-VFIO VFs) the instance's domain here
        uses, by the domain index (that domain read again now)."""
        return list(self._domains.domain_now(instance.uuid))

    def _guest_add_mdevs(self, guest, chosen_mdevs):
        """The hostdevs the core writes (the demo's too): an mdev hostdev
        as its type wants it, a vendor-VFIO vGPU's VF as a PCI hostdev
        the host has bound (``managed='no'``)."""
        for element in self.vgpu.hostdevs(chosen_mdevs):
            guest.add_device(nova_hostdevs.config_of(element))

    def _get_all_assigned_mediated_devices(self, instance=None):
        """nova's view (the domains) plus our claims: an instance keeps its
        mdevs even while its domain is undefined (hard reboot, rescue, a
        domain lost after a failed reboot)."""
        assigned = super()._get_all_assigned_mediated_devices(instance)
        for claim in self.vgpu.journal.claims(instance.uuid if instance else None):
            if claim.state != vgpu_claims.RELEASING:
                assigned.setdefault(claim.mdev_uuid, claim.instance_uuid)
        return assigned

    def _get_mdev_types_from_uuids(self, mdev_uuids):
        """Types from this host's sysfs; a guest's mdev that is gone is an error,
        not a vGPU silently left behind by a migration."""
        try:
            return self.vgpu.mdev_types(list(mdev_uuids))
        except exception.VgpuDriverError as exc:
            raise nova_exception.MigrationPreCheckError(reason=str(exc)) from exc

    # -- spawn, resize, delete -------------------------------------------------------

    def spawn(self, context, instance, *args, **kwargs):
        return self._define_or_release(instance, super().spawn, context, instance, *args, **kwargs)

    def finish_migration(self, context, migration, instance, *args, **kwargs):
        return self._define_or_release(
            instance, super().finish_migration, context, migration, instance, *args, **kwargs
        )

    def confirm_migration(self, context, migration, instance, network_info):
        super().confirm_migration(context, migration, instance, network_info)
        self.vgpu.release_unused(instance.uuid, self._instance_mdevs(instance))

    def finish_revert_migration(self, context, instance, *args, **kwargs):
        """Define the guest here again with the vGPUs of the allocation nova
        has just moved back to it (the source domain's, unless a failed step
        changed them), never with claims another step left."""
        self._claim_allocated(context, instance)
        self._define_or_release(
            instance, super().finish_revert_migration, context, instance, *args, **kwargs
        )
        self.vgpu.release_unused(instance.uuid, self._instance_mdevs(instance))

    def _define_or_release(self, instance, operation, *args, keep_claims=False, **kwargs):
        """Run a nova operation that defines the guest here; if it fails, the
        guest keeps only the claims a domain of it still uses.

        nova gives the guest no vGPU after such a failure: a failed resize
        goes back to the old flavor (keeping the new one's allocation), a
        failed build or unshelve goes elsewhere.  A claim left would hand
        its vGPU to whatever defines the guest here next (a revert, a hard
        reboot), whichever its flavor then.

        Only on an exception: a service killed (a ``BaseException`` here,
        nothing at all in a killed process) leaves the claims to its next
        start, where nova resumes or ends the operation.
        """
        try:
            return self._for_instance(instance, operation, *args, keep_claims=keep_claims, **kwargs)
        except Exception:
            with excutils.save_and_reraise_exception():
                self.vgpu.release_unused(instance.uuid, self._instance_mdevs(instance))

    # -- delete -------------------------------------------------------------------------

    def destroy(
        self,
        context,
        instance,
        network_info,
        block_device_info=None,
        destroy_disks=True,
        destroy_secrets=True,
    ):
        super().destroy(
            context,
            instance,
            network_info,
            block_device_info=block_device_info,
            destroy_disks=destroy_disks,
            destroy_secrets=destroy_secrets,
        )
        if not self._keeps_claims(instance.uuid):
            self.vgpu.release(instance.uuid)
