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

The same reshape gives the allocations made before mixed-size boards had
size classes (:mod:`vgpu_driver.size_classes`) their vGPUs in the class of
their size, beside their framebuffer MiB (:func:`add_size_classes`): their
guests' vGPUs are then counted where the board's inventory expects them.
It is asked for once per process, at nova-compute's start (a periodic
update may not reshape); until then, and for an allocation still made
without them, the inventory reserves what they do not count.
"""

import weakref

from nova import exception as nova_exception
from oslo_log import log as logging

from vgpu_driver import framebuffer
from vgpu_driver import takeover

LOG = logging.getLogger(__name__)

# The core drivers (one per nova-compute start) that checked the
# allocations for size classes already.
_SIZES_CHECKED = weakref.WeakSet()


def existing_children(provider_tree, nodename):
    """The root's child providers as :class:`takeover.ExistingProvider`."""
    root = provider_tree.data(nodename)
    found = []
    for uuid in provider_tree.get_provider_uuids_in_tree(nodename):
        data = provider_tree.data(uuid)
        if data.parent_uuid == root.uuid:
            found.append(takeover.ExistingProvider(data.name, data.uuid, frozenset(data.inventory)))
    return found


def plan(provider_tree, nodename, vgpu, gpu_tree):
    """Which existing providers our GPU providers replace on this host."""
    return takeover.plan(
        nodename, gpu_tree, vgpu.manager.snapshot(), existing_children(provider_tree, nodename)
    )


def take_over(provider_tree, nodename, vgpu, gpu_tree, allocations, allocations_on=None):
    """Ask for a reshape, or do it, when another driver's providers are there.

    ``vgpu`` is the core :class:`~vgpu_driver.driver.VGPUDriver` and
    ``gpu_tree`` the desired tree it computed, whose providers are already
    in ``provider_tree``.  With ``allocations`` None, raises
    ``ReshapeNeeded`` if there is anything to take over; with them, moves
    the allocations onto the GPU providers and removes the replaced
    providers from ``provider_tree``.  ``allocations_on(provider name)``
    (``{consumer: {class: units}}``) tells, at the first call, whether
    allocations on mixed-size boards lack their size class.
    """
    if allocations is not None:
        add_size_classes(provider_tree, vgpu, gpu_tree, allocations)
    elif vgpu not in _SIZES_CHECKED and allocations_on is not None:
        _SIZES_CHECKED.add(vgpu)
        if lacking_size_classes(gpu_tree, vgpu, allocations_on):
            LOG.info(
                "Requesting a reshape: allocations on mixed-size boards get their "
                "vGPUs in the class of their size"
            )
            raise nova_exception.ReshapeNeeded()
    found = plan(provider_tree, nodename, vgpu, gpu_tree)
    if not found:
        return
    if allocations is None:
        LOG.info(
            "Requesting a reshape to take over providers %s: their inventory and "
            "allocations move to %s",
            ", ".join(m.source.name for m in found.moves),
            ", ".join(t.name for t in found.targets),
        )
        raise nova_exception.ReshapeNeeded()
    target_uuids = {t.name: provider_tree.data(t.name).uuid for t in found.targets}
    moved = takeover.move_allocations(allocations, found, target_uuids)
    _warn_mismatches(vgpu, moved)
    for move in found.moves:
        provider_tree.remove(move.source.uuid)
    LOG.info(
        "Reshaping: providers %s replaced by %s; allocations of %d consumer(s) moved",
        ", ".join(m.source.name for m in found.moves),
        ", ".join(t.name for t in found.targets),
        len(moved),
    )


def _warn_mismatches(vgpu, moved):
    held = takeover.held_per_gpu(vgpu.journal.claims())
    for consumer, gpu, units, mdevs in takeover.mismatches(moved, held):
        LOG.warning(
            "Consumer %s had %d unit(s) allocated on GPU %s's old providers but "
            "holds %d mdev(s) of it here; the allocation is moved unchanged",
            consumer,
            units,
            gpu,
            mdevs,
        )


def _size_units(provider, resources, claims_of):
    """``(size class, vGPUs)`` an allocation's ``resources`` on a mixed-size
    ``provider`` lacks, or None: its type told by the consumer's claims
    (``claims_of``: their type ids), else by the one type whose vGPUs
    its MiB make."""
    mib = resources.get(framebuffer.RESOURCE_CLASS, 0)
    if not mib:
        return None
    sizes = dict(provider.sizes)
    types = {t for t in claims_of if t in sizes}
    if not types:
        types = {t for t, size in sizes.items() if mib % size == 0}
    classes = {provider.size_class_of(t): mib // sizes[t] for t in types}
    if len(classes) != 1:
        return None
    ((size_class, count),) = classes.items()
    return None if size_class in resources else (size_class, count)


def _claims_by(vgpu):
    found = {}
    for claim in vgpu.journal.claims():
        found.setdefault((claim.instance_uuid, claim.gpu), []).append(claim.type_id)
    return found


def lacking_size_classes(gpu_tree, vgpu, allocations_on):
    """Whether an allocation on a mixed-size board lacks its size class."""
    claims = _claims_by(vgpu)
    for provider in gpu_tree.providers:
        if not provider.mixed:
            continue
        for consumer, resources in (allocations_on(provider.name) or {}).items():
            if _size_units(provider, resources, claims.get((consumer, provider.gpu), ())):
                return True
    return False


def add_size_classes(provider_tree, vgpu, gpu_tree, allocations):
    """Give each allocation on a mixed-size board its size class, in the
    reshape's ``allocations`` (edited in place)."""
    claims = _claims_by(vgpu)
    mixed = {
        provider_tree.data(p.name).uuid: p
        for p in gpu_tree.providers
        if p.mixed and provider_tree.exists(p.name)
    }
    added = 0
    for consumer, record in allocations.items():
        for rp_uuid, allocation in record.get("allocations", {}).items():
            provider = mixed.get(rp_uuid)
            if provider is None:
                continue
            resources = allocation.setdefault("resources", {})
            found = _size_units(provider, resources, claims.get((consumer, provider.gpu), ()))
            if found:
                resources[found[0]] = found[1]
                added += 1
    if added:
        LOG.info(
            "Reshaping: %d allocation(s) on mixed-size boards get their vGPUs in their size class",
            added,
        )
