"""``fake-host``: write a tree that plays /sys, answered by the fake kernel."""


from vgpu_driver.cmd import base
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles


class ListProfiles(base.Lister):
    """List the host profiles a fake host can be made from."""

    def take_action(self, parsed_args):
        rows = []
        for name in profiles.names():
            profile = profiles.load(name)
            rows.append((name, len(profile["gpus"]), profile.get("description")))
        return ("name", "gpus", "description"), rows


class CreateFakeHost(base.Command):
    """Write a fake host into DIR; point --sysfs-root (or sysfs_root) at it."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("--profile", required=True, action="append",
                            help="Profile name (see 'fake-host profiles'); repeat to "
                                 "combine several on one host.")
        parser.add_argument("dir", help="Empty or new directory; it then plays /sys.")
        return parser

    def take_action(self, parsed_args):
        loaded = [profiles.load(name) for name in parsed_args.profile]
        profile = (loaded[0] if len(loaded) == 1 else
                   profiles.combine("+".join(parsed_args.profile), *loaded))
        kernel = fakekernel.FakeKernel.build(parsed_args.dir, profile)
        parents = kernel.list_parents()
        self.app.stdout.write(
            f"fake host {profile['name']!r} written to {kernel.paths.root}: "
            f"{len(profile['gpus'])} device(s), {len(parents)} mdev parent(s)\n")
        return 0
