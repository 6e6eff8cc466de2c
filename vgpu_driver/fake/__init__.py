"""A fake host for tests, demos and ``vgpu-manage fake-host``.

Production code never imports this package: :func:`vgpu_driver.sysfs.open_host`
returns the Linux backend only.  :mod:`.fakekernel` lays out a sysfs tree as
the kernel does and answers writes with the kernel's rules; :mod:`.fuse`
serves that same model as a filesystem any process can drive.
"""
