"""vGPUs a guest holds here that nobody will come back for.

nova tells the source of a resize or a cold migration that its guest has
gone by confirming the move there, or brings the guest back by reverting
it.  When the move fails after the source let the guest go (the finish
failing on the destination, a confirm failing half way), nothing more
reaches the source: its powered-off domain and its claims would stay, the
vGPUs reserved for nobody, until the instance is deleted and nova reaps the
domain, if ever.  Likewise a guest that a failed step left in ERROR here
without a domain, when the release of its claims failed too: it gets its
vGPUs again from its allocation if it is rebooted.

The host reconciler's periodic pass lets them go: the claims (and the
domain) of an instance whose domain here does not run, that nova places on
another node, has deleted, or holds in ERROR here with no domain and no
task under way, and that no move from or to this node is under way for (a
deleted instance has none, nor one back in service with no task, though a
move killed before it finished leaves its migration record unfinished for
ever).
Claims younger than ``[vgpu] claim_grace`` are left alone.
"""

import time

from nova import context as nova_context
from nova import objects
from nova.compute import vm_states
from oslo_utils import uuidutils

from vgpu_driver import claims as vgpu_claims
from vgpu_driver.nova import operations


def abandoned(claims, defined, running, nodename, grace, now=None):
    """The instances (``objects.Instance``) whose ``claims`` on this node
    nobody will come back for; ``defined`` and ``running``: the instance
    UUIDs whose domain here is defined, and runs."""
    now = time.time() if now is None else now
    newest = {}
    for claim in claims:
        if claim.state in (vgpu_claims.CLAIMED, vgpu_claims.ATTACHED) and uuidutils.is_uuid_like(
            claim.instance_uuid
        ):
            newest[claim.instance_uuid] = max(claim.updated_at, newest.get(claim.instance_uuid, 0))
    candidates = sorted(
        uuid for uuid, updated in newest.items() if uuid not in running and now - updated > grace
    )
    if not candidates:
        return []
    context = nova_context.get_admin_context(read_deleted="yes")
    known = {
        i.uuid: i
        for i in objects.InstanceList.get_by_filters(
            context, {"uuid": candidates}, expected_attrs=[]
        )
    }
    found = []
    for uuid in candidates:
        instance = known.get(uuid)
        if instance is not None and _kept(instance, nodename, uuid in defined):
            continue
        # A deleted guest, or one back in service with no task, has no move
        # under way, whatever its migration record says (a finish killed
        # mid-way leaves it unfinished).
        if operations.moving(context, uuid, nodename, instance):
            continue
        found.append(instance or objects.Instance(uuid=uuid))
    return found


def _kept(instance, nodename, defined):
    """Whether the instance still wants its claims here."""
    if instance.deleted or instance.node != nodename:
        return False
    return defined or instance.vm_state != vm_states.ERROR or instance.task_state is not None
