"""Configuration: option declarations, registration and validation.

There is no global config object: callers create a ``cfg.ConfigOpts``, call
:func:`register_opts` on it and pass it around.
"""

from vgpu_driver.conf import devices
from vgpu_driver.conf import placement
from vgpu_driver.conf import vgpu

__all__ = ["register_opts", "register_dynamic_opts"]


def register_opts(conf):
    devices.register_opts(conf)
    vgpu.register_opts(conf)
    placement.register_opts(conf)


def register_dynamic_opts(conf):
    """Register the ``[mdev_<type>]`` groups named by enabled_mdev_types.

    Must run after the config files were parsed, as it reads the list.
    """
    devices.register_dynamic_opts(conf)
