"""``demo``: the whole read side on a shipped fake host, as an operator runs it.

It writes a fake host (an A100 SR-IOV board and eight T4), leaves an old
orphan mdev on one T4 (what a type change leaves behind), then runs the
operator commands against it with a nova.conf shipped in the package,
printing each command line before its output.
"""

import importlib.resources
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

from vgpu_driver.cmd import base
from vgpu_driver.sysfs import fakekernel
from vgpu_driver.sysfs import profiles

ORPHAN = ("0000:f5:00.0", "nvidia-222", "7f5a0e0c-3a59-4b7e-9f65-2bb1d1f1e0aa")


class Demo(base.Command):
    """Show types and the per-GPU inventory of a shipped fake host."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("--dir", help="Write the fake host here and keep it "
                                          "(default: a temporary directory, removed).")
        return parser

    def _run(self, conf_file, root, *args):
        argv = ["vgpu-manage", "--config-file", conf_file, "--sysfs-root", root,
                "--nodename", "demo-host", *args]
        self.app.stdout.write(f"\n$ {shlex.join(argv)}\n")
        self.app.stdout.flush()
        done = subprocess.run([sys.executable, "-m", "vgpu_driver.cmd.manage", *argv[1:]],
                              capture_output=True, text=True, check=False)
        self.app.stdout.write(done.stdout)
        if done.stderr:
            self.app.stdout.write(done.stderr)
        return done.returncode

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
                codes = [
                    self._run(str(conf_file), sys_root, "config", "check"),
                    self._run(str(conf_file), sys_root, "types", "--parent",
                              "0000:41:00.4", "-c", "type", "-c", "name", "-c",
                              "available_instances"),
                    self._run(str(conf_file), sys_root, "mdev", "list"),
                    self._run(str(conf_file), sys_root, "inventory", "-c", "provider",
                              "-c", "type", "-c", "total", "-c", "reserved", "-c",
                              "traits", "-c", "reason"),
                ]
        finally:
            if not parsed_args.dir:
                shutil.rmtree(root, ignore_errors=True)
        return max(codes)
