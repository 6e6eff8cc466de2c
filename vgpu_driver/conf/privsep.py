"""``[vgpu_driver_sysfs_writer]`` and ``[vgpu_driver_gpu_admin]``: the
privileged helpers, one that writes sysfs and one that switches a GPU's
vGPU mode through NVML.

oslo.privsep registers these options itself when the context is used; they
are listed here so that the sample config shows where ``helper_command``
is set.  The helper's own configuration is ``/etc/vgpu-driver/privsep.conf``
(root's, :mod:`vgpu_driver.privsep.helper_conf`); its sysfs root is the
``[vgpu] sysfs_root`` of the nova-compute files that file names, never a
call's argument.
"""

from oslo_config import cfg
from oslo_privsep import priv_context

GROUP = "vgpu_driver_sysfs_writer"
GPU_ADMIN_GROUP = "vgpu_driver_gpu_admin"


def list_opts() -> list[tuple[cfg.OptGroup, list[cfg.Opt]]]:
    group = cfg.OptGroup(
        GROUP,
        title="vgpu-driver privileged helper",
        help="The oslo.privsep daemon that makes vgpu-driver's sysfs writes "
        "(create/remove mdevs, SR-IOV VFs, vendor vGPU types) with "
        "CAP_DAC_OVERRIDE only.  By default nova-compute starts it with "
        "'sudo <bin>/vgpu-privsep-helper --config-file "
        "/etc/vgpu-driver/privsep.conf --privsep_context "
        "vgpu_driver.privsep.sysfs_writer', which the sudoers rule "
        "install-units writes allows exactly.  The helper reads "
        "nova-compute's files (named in privsep.conf) as data: it writes "
        "under [vgpu] sysfs_root only, and only what [devices] and [mdev_*] "
        "enable.",
    )
    gpu_admin = cfg.OptGroup(
        GPU_ADMIN_GROUP,
        title="vgpu-driver NVML helper",
        help="The oslo.privsep daemon that switches a GPU between equal-size and "
        "mixed-size vGPUs through NVIDIA's management library, with "
        "CAP_SYS_ADMIN only (NVIDIA's driver asks for it); it writes no file.  "
        "Started only when a mode is switched, with 'sudo "
        "<bin>/vgpu-privsep-helper --config-file /etc/vgpu-driver/privsep.conf "
        "--privsep_context vgpu_driver.privsep.gpu_admin', the second line of "
        "the sudoers rule.  It switches only a vendor-VFIO "
        "board that [devices] and [mdev_*] serve.",
    )
    return [(group, priv_context.OPTS), (gpu_admin, priv_context.OPTS)]
