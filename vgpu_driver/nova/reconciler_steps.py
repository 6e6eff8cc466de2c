"""What the host reconciler does for nova-compute, beside the host's own steps.

The core's worker (:mod:`vgpu_driver.host_reconciler`) runs the host's own
steps (:mod:`vgpu_driver.reconciler_steps`); nova-compute gives it a keeper
(the claims no pass may drop while nova still needs them) and steps of its
own: libvirt's mdev definitions settled, and what nova left unfinished here
(incoming live migrations it forgot, vGPUs nobody comes back for,
:mod:`vgpu_driver.nova.abandoned`).  Apart from
:class:`~vgpu_driver.nova.driver.LibvirtVGPUDriver` because they run on the
worker's thread, never on a call from nova; they use what the driver holds
(its core driver, domain index, nova's Host, the operations under way).
"""

import functools

import nova.conf
from oslo_log import log as logging

from vgpu_driver import host_reconciler
from vgpu_driver.nova import abandoned
from vgpu_driver.nova import operations

CONF = nova.conf.CONF
LOG = logging.getLogger(__name__)


def attach(driver):
    """Give the driver's host reconciler nova-compute's keeper and steps,
    before its first (start-up) pass."""
    worker = driver.vgpu.worker
    # No pass, the start-up one first, drops the claims of an instance
    # nova is mid-operation on (one this service was killed in, which
    # nova resumes next), nor those a stopped guest keeps.
    worker.keeper = functools.partial(keep_claims_of, driver)
    # libvirt's mdev definitions are settled by the host reconciler too,
    # at each periodic update's pass.
    worker.add_step("libvirt definitions", functools.partial(settle_definitions, driver))
    worker.add_step("forgotten live migrations", functools.partial(end_forgotten, driver))


def keep_claims_of(driver, instance_uuids):
    """The host reconciler's keeper: of ``instance_uuids`` (instances
    holding claims no domain here uses), those nova is mid-operation
    on, and those nova keeps on this node, not in ERROR, with no domain
    here (a stopped guest whose next start defines it from its claims).
    A guest whose domain here uses other vGPUs keeps only those."""
    busy = driver.operations.busy(instance_uuids)
    rest = set(instance_uuids) - busy
    if not rest:
        return busy
    defined = driver._domains.domain_uuids()
    return busy | operations.kept_without_domain(rest - defined, driver._host.get_hostname())


def settle_definitions(driver, reasons):
    """mdevs removed through sysfs since: their definitions go too."""
    if host_reconciler.PERIODIC in reasons:
        driver.definitions.settle_if_due(driver._host.get_connection())


def end_forgotten(driver, reasons):
    """The step for what nova left unfinished here: incoming live
    migrations (:meth:`~vgpu_driver.nova.live_migration.LiveMigration.end_forgotten_migrations`),
    then guests a move took away, or a failed step left, without the vGPUs
    they hold here being released."""
    driver.end_forgotten_migrations(reasons)
    if host_reconciler.PERIODIC in reasons:
        release_abandoned(driver)


def release_abandoned(driver):
    """Undefine the domains and release the vGPUs that guests hold here
    and nobody will come back for; their instance UUIDs."""
    found = abandoned.abandoned(
        driver.vgpu.journal.claims(),
        driver._domains.domain_uuids(),
        # Whether a domain runs is nova's to say; the index knows who uses what.
        {g.uuid for g in driver._host.list_guests(only_running=True)},
        driver._host.get_hostname(),
        CONF.vgpu.claim_grace,
    )
    for instance in found:
        LOG.warning(
            "Instance %s holds vGPUs here that nothing will use (it left this "
            "host, or a step failed on it, and no move of it is under way): "
            "its domain here and its vGPUs are released",
            instance.uuid,
        )
        driver._undefine_domain(instance)
        driver.vgpu.release(instance.uuid)
    return [instance.uuid for instance in found]
