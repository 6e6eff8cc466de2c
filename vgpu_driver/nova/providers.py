"""Our GPU providers in nova's provider tree: written from the core's
desired tree, and removed once their GPU is gone and nothing holds them."""

from keystoneauth1 import exceptions as ks_exceptions
from nova import context as nova_context
from nova import exception as nova_exception
from nova.objects import service
from oslo_log import log as logging

from vgpu_driver import inventory
from vgpu_driver import placement
from vgpu_driver.nova import usage

LOG = logging.getLogger(__name__)

# nova marks every provider it creates with the standard trait OWNER_NOVA
# from service version 73 on (nova 34, 2026.2): the compute node's in its
# resource tracker, the GPU, PCI and memory-encryption children where its
# drivers create them; its scheduler's owner_nova_filter requires it on the
# root once every nova-compute reports that version
# (request_filter.MIN_COMPUTE_VERSION_OWNER_TRAIT).  Ours are nova's
# providers too, so they carry it inside such a nova, and not before: an
# older nova marks none of its own.  The name is a literal because os-traits
# has it long before nova sets it (os-traits 3.3.0 of 2025.1 already does).
OWNER_NOVA = "OWNER_NOVA"
OWNER_NOVA_SERVICE_VERSION = 73


def nova_owner_traits():
    """The owner traits the running nova puts on the providers it creates."""
    return {OWNER_NOVA} if service.SERVICE_VERSION >= OWNER_NOVA_SERVICE_VERSION else set()


def write(provider_tree, nodename, tree):
    """Each GPU's provider under the node, with its inventory and traits
    (traits others set are kept; nova's owner trait is added where nova
    adds it to its own)."""
    owner = nova_owner_traits()
    for provider in tree.providers:
        name = provider.name
        if not provider_tree.exists(name):
            provider_tree.new_child(name, nodename)
        provider_tree.update_inventory(name, provider.inventory())
        provider_tree.update_traits(
            name,
            placement.with_managed_traits(provider_tree.data(name).traits, provider.traits) | owner,
        )


def prune(provider_tree, nodename, tree, journal, reportclient):
    """Remove providers of GPUs that vanished, unless guests still hold them.

    A provider is held while a claim or an allocation in Placement uses
    it: a guest being deleted has released its claims before nova deletes
    its allocation.
    """
    held = None  # read from the journal only once a provider is stale
    root = provider_tree.data(nodename)
    for uuid in provider_tree.get_provider_uuids_in_tree(nodename):
        data = provider_tree.data(uuid)
        if not placement.is_vanished_gpu_provider(
            tree, data.name, data.parent_uuid, root.uuid, data.inventory, data.traits
        ):
            continue
        if held is None:
            held = {inventory.provider_name_for(nodename, c.gpu) for c in journal.claims()}
        if data.name in held or usage.has_usage(reportclient, data.uuid):
            provider_tree.update_inventory(data.name, placement.fully_reserved(data.inventory))
            LOG.warning(
                "GPU of provider %s is gone but guests still hold it; keeping it fully reserved",
                data.name,
            )
            continue
        provider_tree.remove(data.name)


def uuids_by_name(reportclient, allocations, nodename):
    """``{name: rp uuid}`` of the providers in Placement's tree of this
    compute node (the provider named ``nodename``) that holds one of
    ``allocations``' providers: what nova's provider tree says once its
    first update built it.  An allocation may also hold a sharing
    provider's resources (a shared disk), whose tree is not this host's:
    each provider's tree is asked for, in order, until one is."""
    for rp_uuid in sorted(allocations):
        try:
            found = reportclient.get_providers_in_tree(nova_context.get_admin_context(), rp_uuid)
        except (
            nova_exception.ResourceProviderRetrievalFailed,
            ks_exceptions.ClientException,
        ) as exc:
            raise nova_exception.ComputeResourcesUnavailable(
                reason=f"Placement did not say which providers hold the allocation ({exc})"
            ) from exc
        names = {p["name"]: p["uuid"] for p in found}
        if nodename in names:
            return names
    return {}
