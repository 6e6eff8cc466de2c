"""What the demo sets up and boots: its fake host, flavors and nova.conf.

Kept apart from the command so that the steps read as a story and the
tests can check what the demo promises (which instances, which flavors,
which orphan mdev) against what it leaves behind.
"""

import importlib.resources
import os

from oslo_config import cfg

from vgpu_driver import conf as vgpu_conf
from vgpu_driver.cmd.demo import compute
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles

NODENAME = "demo-host"
LIBVIRT_URI = "test:///default"
ORPHAN = ("0000:35:00.0", "nvidia-222", "7f5a0e0c-3a59-4b7e-9f65-2bb1d1f1e0aa")

A100_4C = "CUSTOM_VGPU_NVIDIA_A100_4C"
T4_2Q = "CUSTOM_VGPU_GRID_T4_2Q"
FLAVORS = {
    f.name: f
    for f in (
        compute.Flavor("vdi.t4-2q", 4, 8192, 40, 1, T4_2Q),
        compute.Flavor("render.2x-t4-2q", 8, 16384, 80, 2, T4_2Q),
        compute.Flavor("ml.a100-4c", 8, 32768, 80, 1, A100_4C),
        compute.Flavor("train.2x-a100-4c", 16, 65536, 160, 2, A100_4C),
    )
}
# (instance, flavor): booted in this order.
BOOTS = (
    ("vdi-1", "vdi.t4-2q"),
    ("render-1", "render.2x-t4-2q"),
    ("ml-1", "ml.a100-4c"),
    ("train-1", "train.2x-a100-4c"),
)


def write_host(root):
    """The fake host under ``root/sys``, with the old-type orphan on one T4."""
    profile = profiles.combine(
        "a100-sriov+t4x8", profiles.load("a100-sriov"), profiles.load("t4x8")
    )
    kernel = fakekernel.FakeKernel.build(os.path.join(root, "sys"), profile)
    kernel.create_mdev(*ORPHAN)
    return kernel


def write_nova_conf(root, sys_root, endpoint):
    """The shipped nova.conf, plus where this run's pieces are."""
    shipped = importlib.resources.files("vgpu_driver.cmd.demo").joinpath("nova.conf")
    text = shipped.read_text() + (
        "\n# Added by the demo: this run's fake /sys, state and libvirt, and the\n"
        "# Placement it started (auth_strategy noauth2: the token 'admin' is an admin).\n"
        f"[vgpu]\nsysfs_root = {sys_root}\nstate_dir = {os.path.join(root, 'state')}\n"
        f"libvirt_uri = {LIBVIRT_URI}\n\n"
        f"[placement]\nauth_type = admin_token\nendpoint = {endpoint}\ntoken = admin\n"
    )
    path = os.path.join(root, "nova.conf")
    with open(path, "w") as f:
        f.write(text)
    return path, text


def load_conf(path):
    """The demo's nova.conf as the driver inside nova-compute reads it."""
    conf = cfg.ConfigOpts()
    vgpu_conf.register_opts(conf)
    conf([], project="nova", default_config_files=[path])
    return conf
