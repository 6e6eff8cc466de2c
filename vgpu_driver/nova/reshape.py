"""Taking over the providers nova's own driver left, through Placement's reshaper.

On a host nova's libvirt driver managed, an SR-IOV board has one provider
per VF and the guests' allocations are on those.  They cannot simply be
deleted (Placement refuses while allocations use them) nor left (the
scheduler would keep using them).  nova's answer is a reshape: at start-up
``update_provider_tree`` raises ``ReshapeNeeded``; the resource tracker
calls again with every allocation of the host's providers; the driver moves
inventory and allocations in the tree and in that dict; the report client
sends both to ``POST /reshaper`` in one atomic request, then deletes the
providers that left the tree.  The decisions are
:mod:`vgpu_driver.takeover`'s; this module only speaks nova.
"""

from nova import exception as nova_exception
from oslo_log import log as logging

from vgpu_driver import takeover

LOG = logging.getLogger(__name__)


def existing_children(provider_tree, nodename):
    """The root's child providers as :class:`takeover.ExistingProvider`."""
    root = provider_tree.data(nodename)
    found = []
    for uuid in provider_tree.get_provider_uuids_in_tree(nodename):
        data = provider_tree.data(uuid)
        if data.parent_uuid == root.uuid:
            found.append(takeover.ExistingProvider(data.name, data.uuid,
                                                   frozenset(data.inventory)))
    return found


def plan(provider_tree, nodename, vgpu, gpu_tree):
    """Which existing providers our GPU providers replace on this host."""
    return takeover.plan(nodename, gpu_tree, vgpu.manager.snapshot(),
                         existing_children(provider_tree, nodename))


def take_over(provider_tree, nodename, vgpu, gpu_tree, allocations):
    """Ask for a reshape, or do it, when another driver's providers are there.

    ``vgpu`` is the core :class:`~vgpu_driver.driver.VGPUDriver` and
    ``gpu_tree`` the desired tree it computed, whose providers are already
    in ``provider_tree``.  With ``allocations`` None, raises
    ``ReshapeNeeded`` if there is anything to take over; with them, moves
    the allocations onto the GPU providers and removes the replaced
    providers from ``provider_tree``.
    """
    found = plan(provider_tree, nodename, vgpu, gpu_tree)
    if not found:
        return
    if allocations is None:
        LOG.info("Requesting a reshape to take over providers %s: their inventory and "
                 "allocations move to %s", ", ".join(m.source.name for m in found.moves),
                 ", ".join(t.name for t in found.targets))
        raise nova_exception.ReshapeNeeded()
    target_uuids = {t.name: provider_tree.data(t.name).uuid for t in found.targets}
    moved = takeover.move_allocations(allocations, found, target_uuids)
    _warn_mismatches(vgpu, moved)
    for move in found.moves:
        provider_tree.remove(move.source.uuid)
    LOG.info("Reshaping: providers %s replaced by %s; allocations of %d consumer(s) "
             "moved", ", ".join(m.source.name for m in found.moves),
             ", ".join(t.name for t in found.targets), len(moved))


def _warn_mismatches(vgpu, moved):
    held = takeover.held_per_gpu(vgpu.journal.claims())
    for consumer, gpu, units, mdevs in takeover.mismatches(moved, held):
        LOG.warning("Consumer %s had %d unit(s) allocated on GPU %s's old providers but "
                    "holds %d mdev(s) of it here; the allocation is moved unchanged",
                    consumer, units, gpu, mdevs)
