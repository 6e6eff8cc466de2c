"""The privsep context and the configuration its privileged side works under.

In the daemon that configuration is the global ``cfg.CONF`` that
``privsep-helper`` loaded from the ``--config-file`` arguments nova-compute
started it with; in-process (``vgpu-manage`` as root) it is the CLI's own,
fixed by :func:`fix_configuration`.  It is read once per process side.
"""

from oslo_config import cfg
from oslo_privsep import capabilities
from oslo_privsep import priv_context

from vgpu_driver.conf import devices as devices_conf
from vgpu_driver.conf import vgpu as vgpu_conf

sysfs_writer = priv_context.PrivContext(
    "vgpu_driver",
    cfg_section="vgpu_driver_sysfs_writer",
    pypath="vgpu_driver.privsep.sysfs_writer",
    capabilities=[capabilities.CAP_DAC_OVERRIDE],
)

# NVIDIA's kernel driver lets only a caller with CAP_SYS_ADMIN change a GPU's
# settings (its os_is_administrator() is capable(CAP_SYS_ADMIN)), and NVML's
# vGPU mode switch is one: a second daemon holds that capability, runs the
# one NVML entry point and writes no file.  It is started only on a host
# that switches a GPU's mode.
gpu_admin = priv_context.PrivContext(
    "vgpu_driver",
    cfg_section="vgpu_driver_gpu_admin",
    pypath="vgpu_driver.privsep.gpu_admin",
    capabilities=[capabilities.CAP_SYS_ADMIN],
)
CONTEXTS = (sysfs_writer, gpu_admin)

# What this process's privileged side has fixed: "conf", and the things read
# from it once ("policy"); "refuse_writes" on a caller that may not write.
state = {}


def fix_configuration(conf):
    """In-process: ``conf`` from now on (None: back to the daemon's own)."""
    state.pop("policy", None)
    if conf is None:
        state.pop("conf", None)
    else:
        state["conf"] = conf


def configuration():
    """The configuration the privileged side obeys, our options registered."""
    conf = state.get("conf", cfg.CONF)
    for group, option, module in (("vgpu", "sysfs_root", vgpu_conf),
                                  ("devices", "enabled_mdev_types", devices_conf)):
        try:
            conf[group][option]
        except (cfg.NoSuchOptError, cfg.NoSuchGroupError, KeyError):
            module.register_opts(conf)
    return conf
