"""``[vgpu_driver_sysfs_writer]``: the privileged helper that writes sysfs.

oslo.privsep registers these options itself when the context is used; they
are listed here so that the sample config shows where ``helper_command``
is set.  The helper's sysfs root is ``[vgpu] sysfs_root``
of the configuration files it is started with, never a call's argument.
"""

from oslo_config import cfg
from oslo_privsep import priv_context

GROUP = "vgpu_driver_sysfs_writer"


def list_opts():
    group = cfg.OptGroup(
        GROUP, title="vgpu-driver privileged helper",
        help="The oslo.privsep daemon that makes vgpu-driver's sysfs writes "
             "(create/remove mdevs, SR-IOV VFs, vendor vGPU types) with "
             "CAP_DAC_OVERRIDE only.  By default nova-compute starts it with "
             "'sudo privsep-helper --config-file ... --privsep_context "
             "vgpu_driver.privsep.sysfs_writer', which the sudoers rule "
             "etc/vgpu-driver/sudoers.d/vgpu-driver allows exactly.  The helper "
             "reads the same files: it writes under [vgpu] sysfs_root only, and "
             "only what [devices] and [mdev_*] enable.")
    return [(group, priv_context.OPTS)]
