"""Configuration: option declarations, registration and validation.

There is no global config object: callers create a ``cfg.ConfigOpts``, call
:func:`register_opts` on it and pass it around.  The ``[mdev_<type>]``
groups are registered by :func:`vgpu_driver.conf.mdev_types.load`, once the
enabled types are known.
"""

from oslo_config import cfg

from vgpu_driver.conf import devices
from vgpu_driver.conf import limits
from vgpu_driver.conf import placement
from vgpu_driver.conf import vgpu

__all__ = ["register_opts"]


def register_opts(conf: cfg.ConfigOpts) -> None:
    devices.register_opts(conf)
    vgpu.register_opts(conf)
    placement.register_opts(conf)
    limits.register_opts(conf)
