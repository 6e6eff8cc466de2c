"""``[vgpu]``: vgpu-driver's own options."""

from oslo_config import cfg

from vgpu_driver.sysfs import paths

vgpu_group = cfg.OptGroup(
    "vgpu",
    title="vgpu-driver",
    help="Options of vgpu-driver itself (not read by nova).")

vgpu_opts = [
    cfg.StrOpt(
        "sysfs_root",
        default=paths.DEFAULT_ROOT,
        help="""
Directory that plays the kernel's sysfs.  Keep the default on a real host.
Point it at a tree made by ``vgpu-manage fake-host create`` to run the driver
on a fake host (demos, tests); writes to such a tree are answered by the fake
kernel that lives in it.
"""),
    cfg.StrOpt(
        "state_dir",
        default="/var/lib/vgpu-driver",
        help="""
Directory for the driver's persistent state (the mdev claims journal).  It
must survive reboots and be local to the host.
"""),
]


def register_opts(conf):
    conf.register_group(vgpu_group)
    conf.register_opts(vgpu_opts, group=vgpu_group)
