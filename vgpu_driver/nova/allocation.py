"""How nova's operations get their vGPUs: claims for the instance under way.

nova asks the driver for an allocation's vGPUs through
``_allocate_mdevs(allocations)``, a signature that does not name the
instance: the operations the driver wraps (spawn, resize, hard reboot, live
migration) record it, per thread, while they run (:class:`Operation`), and
``_allocate_mdevs`` claims for it.  Paths of the adapter's own
(``_claim_allocated``, a hard reboot's or a resume's reclaim) hand the
instance to ``_claim`` directly.  :class:`Allocation` sits between
:class:`~vgpu_driver.nova.live_migration.LiveMigration` and
:class:`~vgpu_driver.nova.driver.LibvirtVGPUDriver`; it uses what the
driver class provides (``vgpu``, ``_instance_mdevs``, ``_gpu_tree`` and
the state its ``__init__`` sets).
"""

import contextlib
import threading

from keystoneauth1 import exceptions as ks_exceptions
from nova import context as nova_context
from nova import exception as nova_exception
from oslo_log import log as logging

from vgpu_driver import exception
from vgpu_driver.nova import compat
from vgpu_driver.nova import flavors
from vgpu_driver.nova import live_migration
from vgpu_driver.nova import providers
from vgpu_driver.nova import usage

LOG = logging.getLogger(__name__)


class Operation(threading.local):
    """The instance a nova operation works on, per thread: nova's call into
    ``_allocate_mdevs(allocations)`` does not say which.  (``destroy``
    names its instance: whether it keeps the claims is asked by instance,
    :meth:`Allocation._keeps_claims`.)"""

    instance = None


def _set_inventory(reportclient, context, rp_uuid, inventory):
    """Set a provider's inventory through nova's report client, after
    reading its generation again: the one nova keeps is outdated by every
    allocation made since (the guest's own, at least)."""
    reportclient._refresh_and_get_inventory(context, rp_uuid)
    reportclient.set_inventory_for_provider(context, rp_uuid, inventory)


class Allocation(live_migration.LiveMigration):
    """The adapter's allocation layer: claims, through the journal, for
    the instance of the operation under way."""

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
            return {known.data(p.name).uuid: p for p in tree.providers if known.exists(p.name)}
        uuids = providers.uuids_by_name(self.virtapi.reportclient, allocations or {}, nodename)
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
                version=compat.nova_version(), supported=compat.supported_range()
            )
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
        if any(
            rp not in providers
            for rp, allocation in allocations.items()
            if classes & set(allocation.get("resources", {}))
        ):
            return instance.flavor.extra_specs
        specs, why = flavors.judge(instance, allocations, providers, classes)
        if why is not None:
            raise nova_exception.ComputeResourcesUnavailable(
                reason=f"instance {instance.uuid} gets no vGPU here: {why}"
            )
        return specs

    def _claim(self, instance, allocations, providers=None, specs=None):
        """The instance's vGPUs; the type traits of its flavor (``specs``,
        the one the allocation is for) name the type of a mixed-size
        board's."""
        providers = providers or self._providers_by_uuid(allocations)
        specs = instance.flavor.extra_specs if specs is None else specs
        try:
            mdevs = self.vgpu.allocate(
                instance.uuid, allocations or {}, providers, flavors.required_type_traits(specs)
            )
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
        boards = {
            rp: providers[rp].name for rp in allocations if rp in providers and providers[rp].mixed
        }
        if not boards:
            return
        reportclient = self.virtapi.reportclient
        try:
            tree = self.vgpu.inventory_now(
                self._host.get_hostname(),
                lambda name: usage.allocations_on(reportclient, self.provider_tree, name),
            )
            self._gpu_tree = tree
            context = nova_context.get_admin_context()
            for rp, name in sorted(boards.items()):
                provider = tree.provider(name)
                if provider is not None:
                    _set_inventory(reportclient, context, rp, provider.inventory())
        except Exception:  # noqa: BLE001 - the periodic update sends it anyway
            LOG.warning(
                "The inventory of mixed-size boards %s reaches Placement at the "
                "next periodic update",
                ", ".join(sorted(boards.values())),
                exc_info=True,
            )

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
            allocations = self.virtapi.reportclient.get_allocs_for_consumer(context, instance.uuid)[
                "allocations"
            ]
        except (
            nova_exception.ConsumerAllocationRetrievalFailed,
            ks_exceptions.ClientException,
        ) as exc:
            if not held and flavors.vgpu_groups(specs, classes):
                raise nova_exception.ComputeResourcesUnavailable(
                    reason=f"instance {instance.uuid} gets no vGPU here: Placement did not "
                    f"say which it is allocated ({exc})"
                ) from exc
            LOG.warning(
                "Instance %s keeps the vGPUs it holds: Placement did not say "
                "which it is allocated: %s",
                instance.uuid,
                exc,
            )
            return None
        providers = self._providers_by_uuid(allocations)
        if any(
            rp not in providers
            for rp, allocation in allocations.items()
            if classes & set(allocation.get("resources", {}))
        ):
            LOG.warning(
                "Instance %s keeps the vGPUs it holds: its allocation is on "
                "providers that are not this host's GPUs",
                instance.uuid,
            )
            return None
        specs, why = flavors.judge(instance, allocations, providers, classes)
        if why is not None:
            self.vgpu.release_unused(instance.uuid, domain)
            raise nova_exception.ComputeResourcesUnavailable(
                reason=f"instance {instance.uuid} gets no vGPU here: {why}"
            )
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
        return self._for_instance(
            instance, super()._hard_reboot, context, instance, *args, keep_claims=True, **kwargs
        )

    def _reclaim_for_reboot(self, context, instance):
        held = set(self.vgpu.instance_claims(instance.uuid))
        if held:
            self._restore_claimed(instance)
        mdevs = self._claim_allocated(context, instance)
        if mdevs is not None and set(mdevs) - held:
            LOG.info(
                "Instance %s is given again the vGPUs of its allocation: %s",
                instance.uuid,
                ", ".join(mdevs),
            )

    def resume(self, context, instance, *args, **kwargs):
        """A guest suspended across a host reboot finds its mdevs again: nova
        re-attaches those its saved XML names, which the reboot removed."""
        self._restore_claimed(instance)
        return super().resume(context, instance, *args, **kwargs)

    def _restore_claimed(self, instance):
        for outcome in self.vgpu.restore_instance(instance.uuid):
            if outcome.result != "restored":
                LOG.error(
                    "mdev %s of instance %s: %s", outcome.mdev_uuid, instance.uuid, outcome.reason
                )
