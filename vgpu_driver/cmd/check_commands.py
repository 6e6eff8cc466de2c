"""``host check``: why this host offers no vGPU, one line per check.

Read-only: it reads sysfs, NVML, the configuration, the installed sudo rule
and the helper's file it names, and the state directory, and asks libvirt
and Placement once; it writes nothing.  Exit 0 when no check found an
error, 1 when one did, 2 when it could not run (one ``error:`` line).
"""

from vgpu_driver import host_check
from vgpu_driver import host_files
from vgpu_driver import host_probe
from vgpu_driver.cmd import base

COLUMNS = ("check", "level", "message", "fix")


class HostCheck(base.FailableLister):
    """Check what this host needs to offer vGPUs; exit 1 if anything is wrong.

    Each line names a check, ok/warning/error, what was found and what to
    do (the option or command that fixes it).
    """

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument(
            "--user", default="nova", help="The user nova-compute runs as (default: nova)."
        )
        parser.add_argument(
            "--bin-dir",
            default=None,
            help="Where vgpu-privsep-helper is, as install-units takes it "
            "(default: the directory of this vgpu-manage).",
        )
        parser.add_argument(
            "--tmpdir",
            default="/tmp",
            help="nova-compute's temporary directory, as install-units takes it (default: /tmp).",
        )
        parser.add_argument(
            "--root",
            default="/",
            help="Look for the installed sudo rule and helper file under "
            "this directory instead of / (an image being built).",
        )
        return parser

    def take_action(self, parsed_args):
        conf = self.app.conf
        settings = host_files.settings_for(
            conf, parsed_args.user, parsed_args.bin_dir, parsed_args.tmpdir
        )
        facts = host_probe.read(conf, self.app.open_host(), settings, parsed_args.root)
        findings = host_check.check(facts)
        self.failed = any(f.level == host_check.ERROR for f in findings)
        return COLUMNS, [(f.check, f.level, f.message, f.fix) for f in findings]
