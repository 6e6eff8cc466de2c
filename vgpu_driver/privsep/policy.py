"""What the privileged side may write: only what this host's configuration
enables.

The daemon reads the same files as nova-compute.  A create is allowed only
for a type ``[devices] enabled_mdev_types`` lists, on a GPU the
configuration gives that type (``device_addresses``, or ``device_ids`` and
``gpu_count`` resolved against this host, as the inventory resolves them); a vendor
vGPU type only on an NVIDIA virtual function, and other than "none" only
the type configured for its GPU; a GPU's vGPU mode (equal or mixed sizes)
only on a vendor-VFIO board the configuration serves.  A removal, or clearing a vendor type,
frees a device and is not limited by the types: a type change or an orphan
leaves mdevs of types that are no longer configured.  Every refusal is a
:class:`~vgpu_driver.exception.PrivilegedWriteRefused` naming its rule.

The policy reads only the GPU the write is on, beneath the root the entry
point holds (:mod:`.device`), and of it only the addresses the
configuration names (and its mode where two types would share it), and
decides from the configuration.  One rule
needs the whole host: ``device_ids`` with ``gpu_count`` give a type to the
first GPUs of a model on the host, so only a configuration that uses them
has the host discovered (:func:`_resolved`) to count them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from vgpu_driver import exception
from vgpu_driver import names
from vgpu_driver.conf import mdev_settings
from vgpu_driver.conf import mdev_types
from vgpu_driver.privsep import device

if TYPE_CHECKING:
    from oslo_config import cfg

    from vgpu_driver.privsep.beneath import SysfsRoot

NVIDIA_VENDOR = device.NVIDIA_VENDOR


def _can_mix(gpu: device.Gpu, type_ids: Sequence[str], pools: bool) -> bool:
    """As the inventory: NVIDIA's types, on a board whose VFs serve
    vendor-VFIO vGPUs (or are not there yet to tell); in a type pool, on
    a GPU whose vGPUs are mdevs too."""
    modes = {device.MODE_VENDOR_VFIO, device.MODE_VFS_PENDING}
    if pools:
        modes.add(device.MODE_MDEV)
    return all(map(names.is_vendor_type_id, type_ids)) and gpu.mode in modes


def configured_types(gpu: device.Gpu, config: mdev_settings.MdevConfig) -> tuple[str, ...]:
    """The types ``config`` gives ``gpu`` (the inventory's rule), or ().
    ``gpu``'s mode is needed only where it is given more than one type."""
    assigned = config.types_for(gpu.addresses)
    if len(assigned) > 1 and not _can_mix(gpu, assigned, config.pools):
        return ()
    if assigned:
        return tuple(assigned)
    return (config.default_type,) if config.default_type else ()


def named_addresses(config: mdev_settings.MdevConfig) -> frozenset[str]:
    """Every address ``config`` looks a GPU up by."""
    return frozenset((*config.by_address, *config.mixed_by_address, *config.by_model))


def _resolved(config: mdev_settings.MdevConfig, root_path: str) -> mdev_settings.MdevConfig:
    """``config`` with ``device_ids`` resolved against the whole host."""
    if not any(t.device_ids for t in config.types):
        return config
    from vgpu_driver import discovery  # only for a fleet configuration
    from vgpu_driver.sysfs import linux

    return config.for_host(discovery.discover(linux.LinuxSysfs(root_path)))


class WritePolicy:
    """The configuration's answer for one write, read against the host now."""

    def __init__(self, conf: cfg.ConfigOpts) -> None:
        config, problems = mdev_types.load(conf)
        errors = [str(p) for p in problems if p.severity == "error"]
        self.config = None if errors else config
        self.config_errors = errors
        self._named = named_addresses(config)

    def _require_config(self) -> mdev_settings.MdevConfig:
        if self.config is None:
            raise exception.PrivilegedWriteRefused(
                "sysfs",
                "the configuration has errors, so it enables nothing: "
                + "; ".join(self.config_errors),
            )
        return self.config

    def _served(self, root: SysfsRoot, gpu: device.Gpu | None) -> tuple[str, ...]:
        """The types the configuration gives ``gpu`` (none: no GPU)."""
        if gpu is None:
            return ()
        return configured_types(gpu, _resolved(self._require_config(), root.path))

    def _served_parent(
        self, root: SysfsRoot, parent: str, parent_device: str
    ) -> tuple[device.Gpu | None, tuple[str, ...]]:
        """The GPU of ``parent`` and the types the configuration gives it:
        the GPU read for the addresses the configuration names, then
        whole only when it is given more than one type (its mode decides)."""
        config = _resolved(self._require_config(), root.path)
        among = self._named if config is self.config else named_addresses(config)
        gpu = device.gpu_of_parent(root, parent, parent_device, among=among)
        if gpu is None:
            return None, ()
        if len(config.types_for(gpu.addresses)) > 1:
            gpu = device.gpu_of_parent(root, parent, parent_device)
            if gpu is None:
                return None, ()
        return gpu, configured_types(gpu, config)

    def check_create(self, root: SysfsRoot, parent: str, parent_device: str, type_id: str) -> None:
        target = f"{type_id} on {parent}"
        if self.config is not None and type_id not in self.config.enabled:
            raise exception.PrivilegedWriteRefused(
                target, f"type {type_id} is not enabled ([devices] enabled_mdev_types)"
            )
        self._require_config()
        gpu, served = self._served_parent(root, parent, parent_device)
        self._require_type(target, gpu, served, type_id, f"parent {parent}")

    def check_vgpu_mode(self, root: SysfsRoot, pf_address: str, pf_device: str) -> None:
        """A GPU's vGPU mode switches only on a vendor-VFIO board the
        configuration serves (whose VFs are on: the mode is theirs)."""
        self._require_config()
        gpu = device.physical_gpu(root, pf_address, pf_device)
        target = f"the vGPU mode of {pf_address}"
        if gpu is None or not self._served(root, gpu):
            raise exception.PrivilegedWriteRefused(
                target, f"GPU {pf_address} is given no vGPU type by the configuration"
            )
        if gpu.mode != device.MODE_VENDOR_VFIO:
            raise exception.PrivilegedWriteRefused(
                target,
                f"GPU {pf_address} serves no vendor-VFIO vGPUs (its VFs are off, or "
                "it serves mdevs), and only those mix sizes",
            )

    def check_vgpu_type(
        self, root: SysfsRoot, vf_address: str, vf_device: str, type_id: str
    ) -> None:
        self._require_config()
        gpu, served = self._served_parent(root, vf_address, vf_device)
        self._require_type(
            f"vGPU type {type_id} on {vf_address}", gpu, served, type_id, f"VF {vf_address}"
        )

    def check_free_parent(self, root: SysfsRoot, parent: str, parent_device: str) -> None:
        """A removal on a parent that is not a PCI display controller: only
        on a device the configuration serves (the kernel's mtty sample)."""
        self._require_config()
        _gpu, served = self._served_parent(root, parent, parent_device)
        if not served:
            raise exception.PrivilegedWriteRefused(
                f"an mdev of {parent}",
                f"parent {parent} is neither a display controller nor a device the "
                "configuration gives an mdev type",
            )

    @staticmethod
    def _require_type(
        target: str, gpu: device.Gpu | None, configured: Sequence[str], type_id: str, where: str
    ) -> None:
        if gpu is None:
            raise exception.PrivilegedWriteRefused(target, f"{where} is on no GPU of this host")
        if not configured:
            raise exception.PrivilegedWriteRefused(
                target, f"GPU {gpu.address} is given no mdev type by the configuration"
            )
        if type_id not in configured:
            raise exception.PrivilegedWriteRefused(
                target,
                f"GPU {gpu.address} is configured for {', '.join(configured)}, not {type_id}",
            )
