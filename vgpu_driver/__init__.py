"""vgpu-driver: virtual GPUs (VFIO mediated devices) for OpenStack Nova.

The core (config, sysfs, discovery, inventory) never imports nova; the
nova-compute adapter lives in :mod:`vgpu_driver.nova` and is optional.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
