"""What the privileged side may write: only what this host's configuration
enables.

The daemon reads the same files as nova-compute.  A create is allowed only
for a type ``[devices] enabled_mdev_types`` lists, on a GPU the
configuration gives that type (``device_addresses`` or ``device_ids`` and
``gpu_count`` resolved against this host, as the inventory resolves them); a vendor
vGPU type only on an NVIDIA virtual function, and other than "none" only
the type configured for its GPU; a GPU's vGPU mode (equal or mixed sizes)
only on a vendor-VFIO board the configuration serves.  A removal, or clearing a vendor type,
frees a device and is not limited by the types: a type change or an orphan
leaves mdevs of types that are no longer configured.  Every refusal is a
:class:`~vgpu_driver.exception.PrivilegedWriteRefused` naming its rule.
"""

from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import inventory
from vgpu_driver.conf import mdev_types

NVIDIA_VENDOR = "0x10de"


class WritePolicy:
    """The configuration's answer for one write, read against the host now."""

    def __init__(self, conf):
        config, problems = mdev_types.load(conf)
        errors = [str(p) for p in problems if p.severity == "error"]
        self.config = None if errors else config
        self.config_errors = errors

    def _served(self, host):
        """``(snapshot, {GPU address: configured types})`` of the host as it is."""
        if self.config is None:
            raise exception.PrivilegedWriteRefused(
                "sysfs", "the configuration has errors, so it enables nothing: "
                         + "; ".join(self.config_errors))
        snapshot = discovery.discover(host)
        return snapshot, inventory.configured_types(snapshot, self.config)

    def check_create(self, host, parent, type_id):
        target = f"{type_id} on {parent}"
        if self.config is not None and type_id not in self.config.enabled:
            raise exception.PrivilegedWriteRefused(
                target, f"type {type_id} is not enabled ([devices] enabled_mdev_types)")
        snapshot, served = self._served(host)
        gpu = snapshot.gpu_of_parent(parent)
        self._require_type(target, gpu, served, type_id, f"parent {parent}")

    def check_vgpu_mode(self, host, pf_address):
        """A GPU's vGPU mode switches only on a vendor-VFIO board the
        configuration serves (whose VFs are on: the mode is theirs)."""
        snapshot, served = self._served(host)
        gpu = snapshot.gpu(pf_address)
        target = f"the vGPU mode of {pf_address}"
        self._require_served(target, gpu, served,
                             f"GPU {pf_address} is given no vGPU type by the configuration")
        if gpu.mode != discovery.MODE_VENDOR_VFIO:
            raise exception.PrivilegedWriteRefused(
                target, f"GPU {pf_address} serves no vendor-VFIO vGPUs (its VFs are off, or "
                        "it serves mdevs), and only those mix sizes")

    def check_vgpu_type(self, host, vf_address, type_id):
        snapshot, served = self._served(host)
        self._require_type(f"vGPU type {type_id} on {vf_address}",
                           snapshot.gpu_of_parent(vf_address), served, type_id,
                           f"VF {vf_address}")

    def check_free_parent(self, host, parent):
        """A removal on a parent that is not a PCI display controller: only
        on a device the configuration serves (the kernel's mtty sample)."""
        snapshot, served = self._served(host)
        self._require_served(
            f"an mdev of {parent}", snapshot.gpu_of_parent(parent), served,
            f"parent {parent} is neither a display controller nor a device the "
            "configuration gives an mdev type")

    @staticmethod
    def _require_served(target, gpu, served, rule):
        if gpu is None or gpu.address not in served:
            raise exception.PrivilegedWriteRefused(target, rule)

    @staticmethod
    def _require_type(target, gpu, served, type_id, where):
        if gpu is None:
            raise exception.PrivilegedWriteRefused(target, f"{where} is on no GPU of this host")
        configured = served.get(gpu.address)
        if configured is None:
            raise exception.PrivilegedWriteRefused(
                target, f"GPU {gpu.address} is given no mdev type by the configuration")
        if type_id not in configured:
            raise exception.PrivilegedWriteRefused(
                target, f"GPU {gpu.address} is configured for {', '.join(configured)}, "
                        f"not {type_id}")
