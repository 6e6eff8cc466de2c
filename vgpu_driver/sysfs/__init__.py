"""The kernel's mdev ABI seen from user space.

:func:`open_host` returns the production backend, :class:`LinuxSysfs`, for a
sysfs root.  Tests and demos that want a fake kernel's write behaviour build
one from :mod:`vgpu_driver.fake` explicitly; production never imports it.
"""

from vgpu_driver.sysfs import paths


def open_host(root=paths.DEFAULT_ROOT):
    from vgpu_driver.sysfs import linux

    return linux.LinuxSysfs(root)
