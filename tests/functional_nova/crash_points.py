"""nova-compute killed while libvirt defines a guest's domain.

Every operation that gives a guest a domain (spawn, hard reboot, power-on,
resume, rescue, a resize's finish and revert, unshelve) defines it through
nova's ``Host.write_instance_config``.  The kill is :class:`Killed` raised
there, a ``BaseException`` that none of nova's error handling (``except
Exception``) or the driver's runs for, as none runs in a killed process;
the caller then starts the compute again on the same host, as systemd
would.  Shared by the crash scenarios and the soak.
"""

import contextlib

import fixtures
from nova.compute import task_states

# The compute manager's method for each operation killed, and the task
# state nova's API sets before it casts it.
OPERATIONS = {
    "hard_reboot": ("reboot_instance", task_states.REBOOTING_HARD,
                    {"block_device_info": None, "reboot_type": "HARD"}),
    "start": ("start_instance", task_states.POWERING_ON, {}),
}


class Killed(BaseException):
    """nova-compute killed: no handler of the process runs."""


@contextlib.contextmanager
def killed_in_define():
    """While it lasts, a compute defining a domain is killed."""
    def define(this, xml):
        raise Killed("nova-compute killed while libvirt defined a domain")

    with fixtures.MonkeyPatch("nova.virt.libvirt.host.Host.write_instance_config", define):
        yield


def kill_during(manager, context, instance, operation):
    """Run ``operation`` (a key of :data:`OPERATIONS`) on ``instance`` in
    the compute ``manager`` as nova's API casts it; the compute is killed
    when it defines the domain.  Whether it was (False: the operation ended
    before any define)."""
    method, task_state, kwargs = OPERATIONS[operation]
    instance.task_state = task_state
    instance.save()
    with killed_in_define():
        try:
            getattr(manager, method)(context, instance, **kwargs)
        except Killed:
            return True
    return False
