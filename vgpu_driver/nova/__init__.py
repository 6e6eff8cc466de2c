"""The nova-compute adapter: ``compute_driver = vgpu_driver.nova.LibvirtVGPUDriver``.

Importing this package imports nova (``pip install vgpu-driver[nova]``); the
rest of vgpu_driver never does.
"""

from vgpu_driver.nova.driver import LibvirtVGPUDriver

__all__ = ["LibvirtVGPUDriver"]
