"""``demo``: vgpu-driver on a shipped fake host, as an operator sees it.

It writes a fake host (an A100 SR-IOV board and eight T4), leaves an old
orphan mdev on one T4 (what a type change leaves behind), boots a few guests
through the core driver, then runs the operator commands against it with a
nova.conf shipped in the package, printing each command line before its
output.
"""

import importlib.resources
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid

from oslo_config import cfg

from vgpu_driver import conf as vgpu_conf
from vgpu_driver import domains
from vgpu_driver import driver
from vgpu_driver.cmd import base
from vgpu_driver.sysfs import fakekernel
from vgpu_driver.sysfs import profiles

ORPHAN = ("0000:35:00.0", "nvidia-222", "7f5a0e0c-3a59-4b7e-9f65-2bb1d1f1e0aa")
INVENTORY = ("inventory", "-c", "provider", "-c", "type", "-c", "total", "-c", "reserved",
             "-c", "reason")


# (instance name, GPU, vGPUs): what the demo boots through the driver.
BOOTS = (("web-1", "0000:41:00.0", 1), ("web-2", "0000:41:00.0", 1),
         ("render-1", "0000:18:00.0", 2))


class Demo(base.Command):
    """Show types and the per-GPU inventory of a shipped fake host."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("--dir", help="Write the fake host here and keep it "
                                          "(default: a temporary directory, removed).")
        return parser

    def _run(self, conf_file, root, *args):
        argv = ["vgpu-manage", "--config-file", conf_file, "--sysfs-root", root,
                "--state-dir", self.state_dir, "--libvirt-uri", "test:///default",
                "--nodename", "demo-host", *args]
        self.app.stdout.write(f"\n$ {shlex.join(argv)}\n")
        self.app.stdout.flush()
        done = subprocess.run([sys.executable, "-m", "vgpu_driver.cmd.manage", *argv[1:]],
                              capture_output=True, text=True, check=False)
        self.app.stdout.write(done.stdout)
        if done.stderr:
            self.app.stdout.write(done.stderr)
        return done.returncode

    def _boot(self, conf_file, sys_root):
        """Boot a few guests through the core driver, as nova-compute would."""
        conf = cfg.ConfigOpts()
        vgpu_conf.register_opts(conf)
        conf([], project="nova", default_config_files=[conf_file])
        conf.set_override("sysfs_root", sys_root, group="vgpu")
        conf.set_override("state_dir", self.state_dir, group="vgpu")
        # The driver logs each allocation; here the demo tells the story itself.
        logging.getLogger("vgpu_driver").setLevel(logging.WARNING)
        vgpu = driver.VGPUDriver(conf, domains.InProcessDomains())
        self.app.stdout.write("\n==> starting the driver: it removes unused mdevs of "
                              "types their GPU no longer serves\n")
        tree = vgpu.provider_tree("demo-host")
        gone = ORPHAN[2] not in {m.uuid for m in vgpu.host.list_mdevs()}
        self.app.stdout.write(f"    {ORPHAN[2]} ({ORPHAN[1]} on {ORPHAN[0]}): "
                              f"{'removed' if gone else 'still there'}\n")
        self.app.stdout.write("\n==> booting guests through the driver (allocation -> "
                              "claims -> mdevs)\n")
        for name, gpu, units in BOOTS:
            provider = tree.by_gpu(gpu)
            instance = str(uuid.uuid5(uuid.NAMESPACE_URL, f"vgpu-demo/{name}"))
            got = vgpu.allocate(instance, {provider.name: {"resources": {
                provider.resource_class: units}}}, {provider.name: provider})
            vgpu.domains.define(instance, got, name=name)
            vgpu.instance_defined(instance)
            self.app.stdout.write(f"    {name} ({instance}): {units} x {provider.type_id} "
                                  f"on {gpu} -> {', '.join(got)}\n")

    def take_action(self, parsed_args):
        root = parsed_args.dir or tempfile.mkdtemp(prefix="vgpu-demo-")
        try:
            profile = profiles.combine("a100-sriov+t4x8", profiles.load("a100-sriov"),
                                       profiles.load("t4x8"))
            self.app.stdout.write("==> writing a fake host (1 A100 with 16 VFs, 8 T4) "
                                  f"to {root}\n")
            kernel = fakekernel.FakeKernel.build(os.path.join(root, "sys"), profile)
            kernel.create_mdev(*ORPHAN)
            self.app.stdout.write(f"==> left an unused {ORPHAN[1]} mdev on {ORPHAN[0]}, as "
                                  "a type change leaves behind\n")
            conf = importlib.resources.files("vgpu_driver.cmd.demo").joinpath("nova.conf")
            with importlib.resources.as_file(conf) as conf_file:
                self.app.stdout.write(f"\n$ cat {conf_file}\n{conf.read_text()}")
                sys_root = kernel.paths.root
                self.state_dir = os.path.join(root, "state")
                codes = [
                    self._run(str(conf_file), sys_root, "config", "check"),
                    self._run(str(conf_file), sys_root, "types", "--parent",
                              "0000:41:00.4", "-c", "type", "-c", "name", "-c",
                              "available_instances"),
                    self._run(str(conf_file), sys_root, "orphans", "list", "-c", "uuid",
                              "-c", "gpu", "-c", "type", "-c", "kind"),
                    self._run(str(conf_file), sys_root, *INVENTORY, "-c", "traits"),
                ]
                self._boot(str(conf_file), sys_root)
                codes += [
                    self._run(str(conf_file), sys_root, "mdev", "list"),
                    self._run(str(conf_file), sys_root, *INVENTORY),
                ]
        finally:
            if not parsed_args.dir:
                shutil.rmtree(root, ignore_errors=True)
        return max(codes)
