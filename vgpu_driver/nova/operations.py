"""Which instances nova is in the middle of an operation on, or keeps
here without a domain: the claims the host reconciler must not let go.

A claim no domain uses is normal for a while: a hard reboot, a rescue or a
resize undefines the guest's domain and defines it again; a move claims on
the destination before its domain exists.  The host reconciler drops such a
claim only once its grace has passed *and* nothing is under way on its
instance: neither an operation of this process (the driver marks each one
it wraps, :meth:`OperationGuard.running`) nor one nova records, a task
state or a migration from or to this node that has not finished (an
operation nova-compute was killed in, which its ``init_host`` resumes).
"""

import collections
import contextlib
import threading

from nova import context as nova_context
from nova import objects
from nova.compute import vm_states

# Migration states after which nova does nothing more on either host.
FINISHED = frozenset({"confirmed", "reverted", "error", "failed", "completed", "cancelled", "done"})


class OperationGuard:
    """The instances under an operation, in this process and in nova's records."""

    def __init__(self, nodename):
        """``nodename()``: this node's name (known once nova's Host has
        connected to libvirt)."""
        self.nodename = nodename
        self._lock = threading.Lock()
        self._running = collections.Counter()

    @contextlib.contextmanager
    def running(self, instance_uuid):
        """Around a nova operation this process runs on the instance."""
        with self._lock:
            self._running[instance_uuid] += 1
        try:
            yield
        finally:
            with self._lock:
                self._running[instance_uuid] -= 1
                if not self._running[instance_uuid]:
                    del self._running[instance_uuid]

    def busy(self, instance_uuids):
        """Those of ``instance_uuids`` nova is mid-operation on here."""
        instance_uuids = set(instance_uuids)
        if not instance_uuids:
            return set()
        with self._lock:
            found = instance_uuids & set(self._running)
        rest = sorted(instance_uuids - found)
        if not rest:
            return found
        context = nova_context.get_admin_context(read_deleted="yes")
        known = {
            i.uuid: i
            for i in objects.InstanceList.get_by_filters(context, {"uuid": rest}, expected_attrs=[])
        }
        for uuid in rest:
            instance = known.get(uuid)
            if instance is not None and not instance.deleted and instance.task_state is not None:
                found.add(uuid)
            elif moving(context, uuid, self.nodename(), instance):
                found.add(uuid)
        return found


def moving(context, instance_uuid, nodename, instance=None):
    """Whether a move of the instance from or to ``nodename`` is under way:
    a migration record there not finished, of an instance nova may still
    act on (``instance``, when known: mid-task, or a resize waiting to be
    confirmed or reverted).  A move whose finish was killed leaves its
    record unfinished for ever, while the instance, reset and rebooted,
    goes on with no task: nothing will ever come for that move."""
    if instance is not None and (
        instance.deleted or (instance.task_state is None and instance.vm_state != vm_states.RESIZED)
    ):
        return False
    return any(
        m.status not in FINISHED and nodename in (m.source_node, m.dest_node)
        for m in objects.MigrationList.get_by_filters(context, {"instance_uuid": instance_uuid})
    )


def kept_without_domain(instance_uuids, nodename):
    """Those of ``instance_uuids`` nova keeps on ``nodename``, not in ERROR:
    guests that keep their vGPUs while they have no domain here (stopped,
    their domain lost), which their next start or hard reboot defines
    again from their claims."""
    if not instance_uuids:
        return set()
    context = nova_context.get_admin_context()
    return {
        i.uuid
        for i in objects.InstanceList.get_by_filters(
            context, {"uuid": sorted(instance_uuids)}, expected_attrs=[]
        )
        if not i.deleted and i.node == nodename and i.vm_state != vm_states.ERROR
    }
