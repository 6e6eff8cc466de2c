"""Placement, and the providers a sync would write."""

from vgpu_driver.exception import base


class ProviderNotOurs(base.VgpuDriverError):
    """A provider a Placement sync would write holds a name of this host's
    tree but is not vgpu-driver's; found before anything is written."""

    msg_fmt = ("Refusing to write provider %(name)s: %(reason)s (%(where)s, traits "
               "%(traits)s); nothing was written. A provider vgpu-driver does not own is "
               "left to its owner.")
