"""LibvirtVGPUDriver: nova's libvirt driver, its vGPU work done by vgpu-driver.

Only the vGPU concerns are replaced, each by a call into
:class:`vgpu_driver.driver.VGPUDriver`: the GPU part of the provider tree
(one provider per physical GPU, traits, reserved inventory, stale providers
removed, nova's per-VF providers taken over), and the vGPUs an instance gets
and keeps, claims first, through spawn, resize, hard reboot, rescue, resume
and live migration (:mod:`vgpu_driver.nova.live_migration`).  Everything
else is nova's.
"""

import collections
import contextlib
import threading

import nova.conf
from keystoneauth1 import exceptions as ks_exceptions
from nova import context as nova_context
from nova import exception as nova_exception
from oslo_log import log as logging
from oslo_utils import excutils

from vgpu_driver import claims as vgpu_claims
from vgpu_driver import driver as core
from vgpu_driver import exception
from vgpu_driver import framebuffer
from vgpu_driver import host_reconciler
from vgpu_driver import sriov
from vgpu_driver.conf import mdev_types
from vgpu_driver.conf import vgpu as vgpu_conf
from vgpu_driver.nova import abandoned
from vgpu_driver.nova import compat
from vgpu_driver.nova import events
from vgpu_driver.nova import flavors
from vgpu_driver.nova import hostdevs as nova_hostdevs
from vgpu_driver.nova import live_migration
from vgpu_driver.nova import nodedevs
from vgpu_driver.nova import operations
from vgpu_driver.nova import providers
from vgpu_driver.nova import reshape
from vgpu_driver.nova import startup
from vgpu_driver.nova import usage

CONF = nova.conf.CONF
LOG = logging.getLogger(__name__)

# As nova's own options: registered on import, so nova.conf can set them.
vgpu_conf.register_opts(CONF)


class _Operation(threading.local):
    """The instance a nova operation works on, per thread: nova's call into
    ``_allocate_mdevs(allocations)`` does not say which.  (``destroy``
    names its instance: whether it keeps the claims is asked by instance,
    :meth:`LibvirtVGPUDriver._keeps_claims`.)"""

    instance = None


def _set_inventory(reportclient, context, rp_uuid, inventory):
    """Set a provider's inventory through nova's report client, after
    reading its generation again: the one nova keeps is outdated by every
    allocation made since (the guest's own, at least)."""
    reportclient._refresh_and_get_inventory(context, rp_uuid)
    reportclient.set_inventory_for_provider(context, rp_uuid, inventory)


class LibvirtVGPUDriver(live_migration.LiveMigration):
    """nova's libvirt driver (through its live-migration layer), vGPUs ours."""

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
        self._operation = _Operation()
        # Instances under an operation that destroys their domain to define
        # it again (hard reboot, rescue...): their destroy keeps the claims.
        self._keeping = collections.Counter()
        self._keeping_lock = threading.Lock()
        # Instances under a nova operation: the host reconciler leaves their
        # claims alone (:mod:`vgpu_driver.nova.operations`).
        self.operations = operations.OperationGuard(lambda: self._host.get_hostname())
        # A configured GPU whose SR-IOV VFs are off is logged once, not at
        # every periodic update.
        self._vfs_notices = sriov.PendingNotices()

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
        return [t.type_id for t in config.types if t.device_addresses or t.device_ids
                or t.type_id == config.default_type]

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
        # No pass, the start-up one first, drops the claims of an instance
        # nova is mid-operation on (one this service was killed in, which
        # nova resumes next), nor those a stopped guest keeps.
        self.vgpu.worker.keeper = self._keep_claims_of
        # libvirt's mdev definitions are settled by the host reconciler too,
        # at each periodic update's pass.
        self.vgpu.worker.add_step("libvirt definitions", self._settle_definitions)
        self.vgpu.worker.add_step("forgotten live migrations",
                                  self.end_forgotten_migrations)
        for outcome in self.vgpu.init_host():
            if outcome.result == "waiting":
                LOG.warning("vGPU %s is not back yet: %s; the host reconciler re-creates "
                            "it as soon as it appears", outcome.mdev_uuid, outcome.reason)
            elif outcome.result != "restored":
                LOG.error("vGPU %s could not be restored: %s", outcome.mdev_uuid,
                          outcome.reason)
        startup.settle_interrupted_reboots(self, host)

    def cleanup_host(self, host):
        """The service stops: so does its host reconciler."""
        if self._vgpu is not None:
            self._vgpu.close()
        super().cleanup_host(host)

    def _keep_claims_of(self, instance_uuids):
        """The host reconciler's keeper: of ``instance_uuids`` (instances
        holding claims no domain here uses), those nova is mid-operation
        on, and those nova keeps on this node, not in ERROR, with no domain
        here (a stopped guest whose next start defines it from its claims).
        A guest whose domain here uses other vGPUs keeps only those."""
        busy = self.operations.busy(instance_uuids)
        rest = set(instance_uuids) - busy
        if not rest:
            return busy
        defined = self._domains.domain_uuids()
        return busy | operations.kept_without_domain(rest - defined,
                                                     self._host.get_hostname())

    def _settle_definitions(self, reasons):
        """mdevs removed through sysfs since: their definitions go too."""
        if host_reconciler.PERIODIC in reasons:
            self.definitions.settle_if_due(self._host.get_connection())

    def _start_inactive_mediated_devices(self):
        """Instead of nova's start of every defined mdev: undefine those no
        claim and no domain wants (never resurrected), start the others
        that can start now (a late VF does not stop the service)."""
        self.definitions.settle(self._host.get_connection(), start=True)

    # -- inventory -----------------------------------------------------------------------

    def _update_provider_tree_for_vgpu(self, provider_tree, nodename, allocations=None):
        reportclient = self.virtapi.reportclient
        tree = self._write_gpu_providers(provider_tree, nodename, lambda name: (
            usage.allocations_on(reportclient, provider_tree, name)))
        # After the GPU providers are in the tree: a reshape moves allocations
        # to them, and sends them with their inventory in the same request.
        reshape.take_over(provider_tree, nodename, self.vgpu, tree, allocations,
                          lambda name: usage.allocations_on(reportclient, provider_tree, name))
        if allocations is not None:
            # Reserve only the claims the moved allocations do not cover.
            tree = self._write_gpu_providers(provider_tree, nodename, lambda name: (
                usage.allocations_in(allocations, provider_tree, name)))
        providers.prune(provider_tree, nodename, tree, self.vgpu.journal, reportclient)

    def _write_gpu_providers(self, provider_tree, nodename, allocations_on):
        tree = self.vgpu.provider_tree(nodename, allocations_on)
        self._gpu_tree = tree
        self._vfs_notices.report(tree, LOG)
        providers.write(provider_tree, nodename, tree)
        return tree

    # -- allocation ----------------------------------------------------------------------

    def _providers_by_uuid(self, allocations=None):
        """``{rp uuid: GpuProvider}`` of our GPU providers.

        Their UUIDs are nova's tree's; before nova's first inventory update
        has built it (an operation ``init_host`` resumes), the tree in
        Placement that holds ``allocations``' providers, and the providers
        from one read of the host.
        """
        nodename = self._host.get_hostname()
        tree = self._gpu_tree or self.vgpu.inventory_now(nodename)
        known = self.provider_tree
        if known is not None:
            return {known.data(p.name).uuid: p for p in tree.providers
                    if known.exists(p.name)}
        uuids = providers.uuids_by_name(self.virtapi.reportclient, allocations or {},
                                        nodename)
        return {uuids[p.name]: p for p in tree.providers if p.name in uuids}

    def _allocate_mdevs(self, allocations):
        """Claims for the instance of the nova operation under way.

        nova calls this from the operations the driver wraps; a call from
        anywhere else (a nova that added a caller) has no instance to claim
        for, and nova's own allocator would hand out vGPUs no claim records:
        refused, the build rescheduled.
        """
        instance = self._operation.instance
        if instance is None:
            error = exception.AllocationOutsideOperation(
                version=compat.nova_version(), supported=compat.supported_range())
            LOG.error("%s", error)
            raise nova_exception.ComputeResourcesUnavailable(reason=str(error))
        providers = self._providers_by_uuid(allocations)
        specs = self._flavor_of_allocation(instance, allocations or {}, providers)
        return self._claim(instance, allocations, providers, specs)

    def _flavor_of_allocation(self, instance, allocations, providers):
        """The extra specs of the instance's flavor whose vGPUs the
        allocation holds (:func:`vgpu_driver.nova.flavors.judge`); refused
        when none.  No guest is defined with another flavor's vGPUs,
        whichever operation defines it.

        The instance's own for an allocation on providers that are not this
        host's GPUs: the claim itself refuses those.
        """
        classes = self.vgpu.mdev_config.mdev_classes
        if any(rp not in providers for rp, allocation in allocations.items()
               if classes & set(allocation.get("resources", {}))):
            return instance.flavor.extra_specs
        specs, why = flavors.judge(instance, allocations, providers, classes)
        if why is not None:
            raise nova_exception.ComputeResourcesUnavailable(
                reason=f"instance {instance.uuid} gets no vGPU here: {why}")
        return specs

    def _claim(self, instance, allocations, providers=None, specs=None):
        """The instance's vGPUs; the type traits of its flavor (``specs``,
        the one the allocation is for) name the type of a mixed-size
        board's."""
        providers = providers or self._providers_by_uuid(allocations)
        specs = instance.flavor.extra_specs if specs is None else specs
        try:
            mdevs = self.vgpu.allocate(instance.uuid, allocations or {}, providers,
                                       flavors.required_type_traits(specs))
        except exception.AllocationError as exc:
            raise nova_exception.ComputeResourcesUnavailable(reason=str(exc)) from exc
        self._report_mixed_size_boards(allocations or {}, providers)
        return mdevs

    def _report_mixed_size_boards(self, allocations, providers):
        """Send Placement the inventory of the mixed-size boards a guest
        just got vGPUs on.  nova's resource tracker reported it when it
        claimed the guest, before the vGPUs had their place on the board:
        until its next periodic update, Placement would offer sizes that no
        longer fit.  A failure waits for that update."""
        boards = {rp: providers[rp].name for rp in allocations
                  if rp in providers and providers[rp].mixed}
        if not boards:
            return
        reportclient = self.virtapi.reportclient
        try:
            tree = self.vgpu.inventory_now(self._host.get_hostname(), lambda name: (
                usage.allocations_on(reportclient, self.provider_tree, name)))
            self._gpu_tree = tree
            context = nova_context.get_admin_context()
            for rp, name in sorted(boards.items()):
                provider = tree.provider(name)
                if provider is not None:
                    _set_inventory(reportclient, context, rp, provider.inventory())
        except Exception:  # noqa: BLE001 - the periodic update sends it anyway
            LOG.warning("The inventory of mixed-size boards %s reaches Placement at the "
                        "next periodic update", ", ".join(sorted(boards.values())),
                        exc_info=True)

    @contextlib.contextmanager
    def _operating_on(self, instance, keep_claims=False):
        """Within a nova operation on ``instance``: ``_allocate_mdevs`` claims
        for it, and with ``keep_claims`` a ``destroy`` of it keeps its claims
        (nova destroys the domain to define it again)."""
        self._operation.instance = instance
        if keep_claims:
            with self._keeping_lock:
                self._keeping[instance.uuid] += 1
        try:
            with self.operations.running(instance.uuid):
                yield
        finally:
            self._operation.instance = None
            if keep_claims:
                with self._keeping_lock:
                    self._keeping[instance.uuid] -= 1
                    if not self._keeping[instance.uuid]:
                        del self._keeping[instance.uuid]

    def _keeps_claims(self, instance_uuid):
        """Whether an operation that defines the instance again is under way."""
        with self._keeping_lock:
            return instance_uuid in self._keeping

    def _for_instance(self, instance, operation, *args, keep_claims=False, **kwargs):
        """Run a nova operation whose _allocate_mdevs claims for ``instance``."""
        with self._operating_on(instance, keep_claims):
            result = operation(*args, **kwargs)
        self.vgpu.instance_defined(instance.uuid)
        return result

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
        return self._define_or_release(instance, super().spawn, context, instance, *args,
                                       **kwargs)

    def finish_migration(self, context, migration, instance, *args, **kwargs):
        return self._define_or_release(instance, super().finish_migration, context,
                                       migration, instance, *args, **kwargs)

    def confirm_migration(self, context, migration, instance, network_info):
        super().confirm_migration(context, migration, instance, network_info)
        self.vgpu.release_unused(instance.uuid, self._instance_mdevs(instance))

    def finish_revert_migration(self, context, instance, *args, **kwargs):
        """Define the guest here again with the vGPUs of the allocation nova
        has just moved back to it (the source domain's, unless a failed step
        changed them), never with claims another step left."""
        self._claim_allocated(context, instance)
        self._define_or_release(instance, super().finish_revert_migration, context,
                                instance, *args, **kwargs)
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
            return self._for_instance(instance, operation, *args, keep_claims=keep_claims,
                                      **kwargs)
        except Exception:
            with excutils.save_and_reraise_exception():
                self.vgpu.release_unused(instance.uuid, self._instance_mdevs(instance))

    def _claim_allocated(self, context, instance):
        """Before nova defines the guest here again: claim the vGPUs its
        allocation here gives it (its own first, missing ones made again)
        and release the claims it holds beyond them (what a failed step
        left); their ids, or None, nothing changed, when the domain holds
        vGPUs that have no claim or Placement cannot say (then the claims
        are what the guest gets).

        Refused when the allocation's vGPUs are not the ones the flavor asks
        for (:mod:`vgpu_driver.nova.flavors`), or when Placement cannot say
        and the guest holds no vGPU here though its flavor asks for some:
        the guest then keeps only the claims its domain uses.
        """
        domain = set(self._instance_mdevs(instance))
        held = set(self.vgpu.instance_claims(instance.uuid))
        if domain - held:
            return None
        specs, classes = instance.flavor.extra_specs, self.vgpu.mdev_config.mdev_classes
        try:
            allocations = self.virtapi.reportclient.get_allocs_for_consumer(
                context, instance.uuid)["allocations"]
        except (nova_exception.ConsumerAllocationRetrievalFailed,
                ks_exceptions.ClientException) as exc:
            if not held and flavors.vgpu_groups(specs, classes):
                raise nova_exception.ComputeResourcesUnavailable(
                    reason=f"instance {instance.uuid} gets no vGPU here: Placement did not "
                           f"say which it is allocated ({exc})") from exc
            LOG.warning("Instance %s keeps the vGPUs it holds: Placement did not say "
                        "which it is allocated: %s", instance.uuid, exc)
            return None
        providers = self._providers_by_uuid(allocations)
        if any(rp not in providers for rp, allocation in allocations.items()
               if classes & set(allocation.get("resources", {}))):
            LOG.warning("Instance %s keeps the vGPUs it holds: its allocation is on "
                        "providers that are not this host's GPUs", instance.uuid)
            return None
        specs, why = flavors.judge(instance, allocations, providers, classes)
        if why is not None:
            self.vgpu.release_unused(instance.uuid, domain)
            raise nova_exception.ComputeResourcesUnavailable(
                reason=f"instance {instance.uuid} gets no vGPU here: {why}")
        mdevs = self._claim(instance, allocations, providers, specs)
        self.vgpu.release_unused(instance.uuid, mdevs)
        return mdevs

    # -- hard reboot ------------------------------------------------------------------

    def _hard_reboot(self, context, instance, *args, **kwargs):
        """Define the guest again with the vGPUs of its allocation here,
        whatever their class (a start does it too).

        Its claims say which vGPUs are its own even when the domain is gone;
        missing ones (a host reboot) are created again with their UUIDs; an
        instance that holds none gets them claimed now, and claims beyond
        its allocation go.  When Placement cannot say, its claims alone.

        If the define fails, the guest keeps them, as a stopped guest keeps
        its vGPUs without a running domain: they are its allocation's, its
        next start or hard reboot uses them (and judges them again), and
        the host reconciler lets them go if nova sets it to ERROR and
        nothing comes for them (:mod:`vgpu_driver.unused_claims`).
        """
        self._reclaim_for_reboot(context, instance)
        return self._for_instance(instance, super()._hard_reboot, context, instance,
                                  *args, keep_claims=True, **kwargs)

    def _reclaim_for_reboot(self, context, instance):
        held = set(self.vgpu.instance_claims(instance.uuid))
        if held:
            self._restore_claimed(instance)
        mdevs = self._claim_allocated(context, instance)
        if mdevs is not None and set(mdevs) - held:
            LOG.info("Instance %s is given again the vGPUs of its allocation: %s",
                     instance.uuid, ", ".join(mdevs))

    def resume(self, context, instance, *args, **kwargs):
        """A guest suspended across a host reboot finds its mdevs again: nova
        re-attaches those its saved XML names, which the reboot removed."""
        self._restore_claimed(instance)
        return super().resume(context, instance, *args, **kwargs)

    def _restore_claimed(self, instance):
        for outcome in self.vgpu.restore_instance(instance.uuid):
            if outcome.result != "restored":
                LOG.error("mdev %s of instance %s: %s", outcome.mdev_uuid,
                          instance.uuid, outcome.reason)

    # -- delete -------------------------------------------------------------------------

    def destroy(self, context, instance, network_info, block_device_info=None,
                destroy_disks=True, destroy_secrets=True):
        super().destroy(context, instance, network_info, block_device_info=block_device_info,
                        destroy_disks=destroy_disks, destroy_secrets=destroy_secrets)
        if not self._keeps_claims(instance.uuid):
            self.vgpu.release(instance.uuid)

    # -- vGPUs nobody comes back for -------------------------------------------------------

    def end_forgotten_migrations(self, reasons):
        """The host reconciler's step for what nova left unfinished here:
        incoming live migrations (:class:`LiveMigration`'s), then guests a
        move took away, or a failed step left, without the vGPUs they hold
        here being released (:mod:`vgpu_driver.nova.abandoned`)."""
        super().end_forgotten_migrations(reasons)
        if host_reconciler.PERIODIC in reasons:
            self.release_abandoned()

    def release_abandoned(self):
        """Undefine the domains and release the vGPUs that guests hold here
        and nobody will come back for; their instance UUIDs."""
        found = abandoned.abandoned(
            self.vgpu.journal.claims(),
            self._domains.domain_uuids(),
            # Whether a domain runs is nova's to say; the index knows who uses what.
            {g.uuid for g in self._host.list_guests(only_running=True)},
            self._host.get_hostname(), CONF.vgpu.claim_grace)
        for instance in found:
            LOG.warning("Instance %s holds vGPUs here that nothing will use (it left this "
                        "host, or a step failed on it, and no move of it is under way): "
                        "its domain here and its vGPUs are released", instance.uuid)
            self._undefine_domain(instance)
            self.vgpu.release(instance.uuid)
        return [instance.uuid for instance in found]
