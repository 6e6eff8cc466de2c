"""The kernel's mdev ABI seen from user space.

:func:`open_host` returns the backend for a sysfs root: :class:`LinuxSysfs`
for a real one, :class:`FakeKernel` for a tree that a fake kernel owns (it
reads through the very same code and only answers writes differently).
"""

from vgpu_driver.sysfs import paths


def open_host(root=paths.DEFAULT_ROOT):
    from vgpu_driver.sysfs import fakekernel
    from vgpu_driver.sysfs import linux

    if fakekernel.FakeKernel.owns(root):
        return fakekernel.FakeKernel(root)
    return linux.LinuxSysfs(root)
