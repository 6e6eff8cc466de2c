"""nova-compute killed while libvirt defines a guest's domain.

Every operation that gives a guest a domain (spawn, hard reboot, power-on,
resume, rescue and unrescue, a resize's finish and revert, unshelve)
defines it through nova's ``Host.write_instance_config``; a live
migration's destination does not (libvirt defines the domain there as the
migration ends, with ``VIR_MIGRATE_PERSIST_DEST``).  The kill is :class:`Killed` raised
there, a ``BaseException`` that none of nova's error handling (``except
Exception``) or the driver's runs for, as none runs in a killed process;
the caller then starts the compute again on the same host, as systemd
would.  Shared by the crash scenarios and the soak.
"""

import contextlib

import fixtures
from nova.compute import task_states
from nova.virt.libvirt import host as libvirt_host

_REAL_DEFINE = libvirt_host.Host.write_instance_config

# The compute manager's method for each operation killed, and the task
# state nova's API sets before it casts it.
OPERATIONS = {
    "hard_reboot": (
        "reboot_instance",
        task_states.REBOOTING_HARD,
        {"block_device_info": None, "reboot_type": "HARD"},
    ),
    "start": ("start_instance", task_states.POWERING_ON, {}),
    "resume": ("resume_instance", task_states.RESUMING, {}),
    "rescue": (
        "rescue_instance",
        task_states.RESCUING,
        {"rescue_password": None, "rescue_image_ref": None, "clean_shutdown": True},
    ),
    "unrescue": ("unrescue_instance", task_states.UNRESCUING, {}),
}


class Killed(BaseException):
    """nova-compute killed: no handler of the process runs."""


@contextlib.contextmanager
def killed_in_define(hosts=None):
    """While it lasts, a compute defining a domain is killed (a compute
    whose nova ``Host`` is in ``hosts``, when given: another defines as
    usual)."""
    real = _REAL_DEFINE

    def define(this, xml):
        if hosts is None or any(this is host for host in hosts):
            raise Killed("nova-compute killed while libvirt defined a domain")
        return real(this, xml)

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


def kill_in_cast(computes, method, call):
    """Run ``call``, an API request whose work reaches a compute of
    ``computes`` (``{name: service}``) through a cast to its manager's
    ``method`` (``finish_resize``, ``finish_revert_resize``,
    ``unshelve_instance``); that compute is killed when it defines a domain
    there.  The name of the compute killed, or None.

    nova's harness runs casts as calls: the kill ends the cast alone, whose
    sender goes on as it does when a compute dies under a real cast.  The
    kill is caught where each compute's RPC servers dispatch, the one step
    every nova release takes for every message: nova 34's service hands its
    RPC server an endpoint that keeps the manager's method it first
    dispatched (``_TrackingEndpointWrapper``), so a method replaced on the
    manager after one such cast is never called.  A kill meant to be caught
    on the manager then went on through nova's RPC server, which answers
    ``Exception`` alone: no reply came, each caller waited
    ``rpc_response_timeout`` (60 s) for it, and the API answered
    MessagingTimeout.
    """
    killed = []

    def guarded(name, dispatch):
        def guarded_dispatch(message):
            if message.message.get("method") != method:
                return dispatch(message)
            try:
                return dispatch(message)
            except Killed:
                killed.append(name)
                return None

        return guarded_dispatch

    dispatchers = {
        id(server.dispatcher): (name, server.dispatcher)
        for name, compute in computes.items()
        for server in _rpc_servers(compute)
    }
    for name, dispatcher in dispatchers.values():
        dispatcher.dispatch = guarded(name, dispatcher.dispatch)
    try:
        with killed_in_define([c.driver._host for c in computes.values()]):
            call()
    finally:
        for _name, dispatcher in dispatchers.values():
            del dispatcher.dispatch
    return killed[0] if killed else None


def _rpc_servers(service):
    """The service's RPC servers: nova 34's compute has a second one, on
    the ``compute-alt`` topic, for what must finish while it stops."""
    return [
        server
        for server in (service.rpcserver, getattr(service, "rpcserver_alt", None))
        if server is not None
    ]
