"""LibvirtVGPUDriver: nova's libvirt driver, its vGPU work done by vgpu-driver.

Only the vGPU concerns are replaced, each by a call into
:class:`vgpu_driver.driver.VGPUDriver`: the GPU part of the provider tree
(one provider per physical GPU, traits, reserved inventory, stale providers
removed), and the mdevs an instance gets (claims first).  Everything else is
nova's.
"""

import threading

import nova.conf
from nova import exception as nova_exception
from nova.virt.libvirt import driver as libvirt_driver
from oslo_log import log as logging

from vgpu_driver import domains
from vgpu_driver import driver as core
from vgpu_driver import exception
from vgpu_driver import guest as guest_xml
from vgpu_driver import inventory
from vgpu_driver import placement
from vgpu_driver.conf import vgpu as vgpu_conf

CONF = nova.conf.CONF
LOG = logging.getLogger(__name__)

# As nova's own options: registered on import, so nova.conf can set them.
vgpu_conf.register_opts(CONF)


class NovaGuests(domains.DomainReferences):
    """Who uses which mdev, from nova's own libvirt Host (every domain)."""

    def __init__(self, host):
        self._host = host

    def mdev_users(self):
        users = {}
        for guest in self._host.list_guests(only_running=False):
            ref = domains.DomainRef(guest.uuid, guest.name)
            for mdev in guest_xml.mdev_uuids(guest_xml.parse(guest.get_xml_desc())):
                users[mdev] = ref
        return users


class LibvirtVGPUDriver(libvirt_driver.LibvirtDriver):
    def __init__(self, virtapi, read_only=False):
        super().__init__(virtapi, read_only)
        self._vgpu = None
        self._gpu_tree = None
        self._spawning = threading.local()

    @property
    def vgpu(self):
        """The core driver, made once nova's dynamic [mdev_*] options exist."""
        if self._vgpu is None:
            self._vgpu = core.VGPUDriver(CONF, NovaGuests(self._host))
        return self._vgpu

    # -- start-up ----------------------------------------------------------------------

    def init_host(self, host):
        super().init_host(host)
        for outcome in self.vgpu.init_host():
            if outcome.result != "restored":
                LOG.error("mdev %s could not be restored: %s", outcome.mdev_uuid,
                          outcome.reason)

    # -- inventory -----------------------------------------------------------------------

    def _update_provider_tree_for_vgpu(self, provider_tree, nodename, allocations=None):
        tree = self.vgpu.provider_tree(nodename)
        self._gpu_tree = tree
        desired = {p.name: p for p in tree.providers}
        for name, provider in desired.items():
            if not provider_tree.exists(name):
                provider_tree.new_child(name, nodename)
            provider_tree.update_inventory(name, provider.inventory())
            kept = {t for t in provider_tree.data(name).traits
                    if not t.startswith(placement.MANAGED_TRAIT_PREFIXES)}
            provider_tree.update_traits(name, kept | set(provider.traits))
        self._prune_gpu_providers(provider_tree, nodename, desired)

    def _prune_gpu_providers(self, provider_tree, nodename, desired):
        """Remove providers of GPUs that vanished, unless guests still hold them."""
        held = {inventory.provider_name_for(nodename, c.gpu)
                for c in self.vgpu.journal.claims()}
        root = provider_tree.data(nodename)
        for uuid in provider_tree.get_provider_uuids_in_tree(nodename):
            data = provider_tree.data(uuid)
            if data.parent_uuid != root.uuid or data.name in desired or \
                    not data.name.startswith(f"{nodename}_"):
                continue
            if data.name in held:
                provider_tree.update_inventory(data.name, {
                    rc: {**inv, "reserved": inv["total"]}
                    for rc, inv in data.inventory.items()})
                LOG.warning("GPU of provider %s is gone but guests still hold it; keeping "
                            "it fully reserved", data.name)
                continue
            provider_tree.remove(data.name)

    # -- allocation ----------------------------------------------------------------------

    def _providers_by_uuid(self):
        tree = self._gpu_tree or self.vgpu.provider_tree(self._host.get_hostname())
        by_name = {p.name: p for p in tree.providers}
        found = {}
        for name in by_name:
            if self.provider_tree is not None and self.provider_tree.exists(name):
                found[self.provider_tree.data(name).uuid] = by_name[name]
        return found

    def _allocate_mdevs(self, allocations):
        instance = getattr(self._spawning, "instance", None)
        if instance is None:
            return super()._allocate_mdevs(allocations)
        try:
            mdevs = self.vgpu.allocate(instance.uuid, allocations or {},
                                       self._providers_by_uuid())
        except exception.AllocationError as exc:
            raise nova_exception.ComputeResourcesUnavailable(reason=str(exc)) from exc
        return mdevs

    def _for_instance(self, instance, operation, *args, **kwargs):
        """Run a nova operation whose _allocate_mdevs claims for ``instance``."""
        self._spawning.instance = instance
        try:
            result = operation(*args, **kwargs)
        finally:
            self._spawning.instance = None
        self.vgpu.instance_defined(instance.uuid)
        return result

    def _instance_mdevs(self, instance):
        return [m for m, i in self._get_all_assigned_mediated_devices(instance).items()
                if i == instance.uuid]

    def spawn(self, context, instance, *args, **kwargs):
        return self._for_instance(instance, super().spawn, context, instance, *args,
                                  **kwargs)

    def finish_migration(self, context, migration, instance, *args, **kwargs):
        return self._for_instance(instance, super().finish_migration, context, migration,
                                  instance, *args, **kwargs)

    def confirm_migration(self, context, migration, instance, network_info):
        super().confirm_migration(context, migration, instance, network_info)
        self.vgpu.release_unused(instance.uuid, self._instance_mdevs(instance))

    def finish_revert_migration(self, context, instance, *args, **kwargs):
        super().finish_revert_migration(context, instance, *args, **kwargs)
        self.vgpu.release_unused(instance.uuid, self._instance_mdevs(instance))

    def destroy(self, context, instance, network_info, block_device_info=None,
                destroy_disks=True, destroy_secrets=True):
        super().destroy(context, instance, network_info, block_device_info=block_device_info,
                        destroy_disks=destroy_disks, destroy_secrets=destroy_secrets)
        self.vgpu.release(instance.uuid)
