"""Reboots nova resumes as nova-compute starts, their vGPUs settled first.

nova's ``init_host`` reboots again each guest whose reboot the service was
killed in (``ComputeManager._retry_reboot``), and an exception from that
reboot stops nova-compute from starting, at every restart.  Before nova
gets there, the driver's own ``init_host`` gives each such guest the vGPUs
of its allocation here (its claims first, as the reboot itself does); a
guest that cannot have them is set to ERROR with the reason as its fault,
which nova's ``init_host`` leaves alone, and the service starts.  The
operator's hard reboot tries again later.
"""

import sys

from nova import context as nova_context
from nova import objects
from nova.compute import power_state
from nova.compute import task_states
from nova.compute import utils as compute_utils
from nova.compute import vm_states
from oslo_log import log as logging

from vgpu_driver.nova import flavors

LOG = logging.getLogger(__name__)

# nova reboots again a guest in these task states that does not run...
_STARTED = frozenset(
    {
        task_states.REBOOTING,
        task_states.REBOOTING_HARD,
        task_states.REBOOT_STARTED,
        task_states.REBOOT_STARTED_HARD,
    }
)
# ...and one in these whose vm state allows the reboot.
_PENDING = {
    task_states.REBOOT_PENDING: vm_states.ALLOW_SOFT_REBOOT,
    task_states.REBOOT_PENDING_HARD: vm_states.ALLOW_HARD_REBOOT,
}


def settle_interrupted_reboots(driver, host):
    """Give the guests nova is about to reboot again their vGPUs, or set
    them to ERROR; the instance UUIDs set to ERROR."""
    context = nova_context.get_admin_context()
    failed = []
    for instance in objects.InstanceList.get_by_host(context, host, expected_attrs=["flavor"]):
        if not _rebooted_at_start(driver, instance):
            continue
        try:
            with driver._operating_on(instance, keep_claims=True):
                driver._reclaim_for_reboot(context, instance)
        except Exception as exc:  # noqa: BLE001 - any reason: the service starts
            _set_error(context, instance, exc)
            failed.append(instance.uuid)
    return failed


def _rebooted_at_start(driver, instance):
    """Whether nova's init_host reboots the instance, and it has vGPUs here."""
    if instance.vm_state == vm_states.ERROR or instance.deleted:
        return False
    task = instance.task_state
    if task in _PENDING:
        if instance.vm_state not in _PENDING[task]:
            return False
    elif task not in _STARTED or _running(driver, instance):
        return False
    classes = driver.vgpu.mdev_config.mdev_classes
    return bool(
        flavors.vgpu_groups(instance.flavor.extra_specs, classes)
        or driver.vgpu.instance_claims(instance.uuid)
    )


def _running(driver, instance):
    try:
        return driver.get_info(instance).state == power_state.RUNNING
    except Exception:  # noqa: BLE001 - no domain: nova sees no state either
        return False


def _set_error(context, instance, exc):
    LOG.error(
        "Instance %s cannot be given its vGPUs as nova-compute starts: it is set "
        "to ERROR and nova does not resume its reboot (a hard reboot tries "
        "again): %s",
        instance.uuid,
        exc,
    )
    compute_utils.add_instance_fault_from_exc(context, instance, exc, sys.exc_info())
    instance.vm_state = vm_states.ERROR
    instance.task_state = None
    instance.save()
