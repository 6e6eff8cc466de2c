"""``fake-host``: write a tree that plays /sys, or serve one with FUSE."""

import contextlib
import os
import shutil
import tempfile

from vgpu_driver import exception
from vgpu_driver.cmd import base
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles


def combined_profile(names):
    loaded = [profiles.load(name) for name in names]
    return loaded[0] if len(loaded) == 1 else profiles.combine("+".join(names), *loaded)


def add_profile_argument(parser):
    parser.add_argument(
        "--profile",
        required=True,
        action="append",
        help="Profile name (see 'fake-host profiles'); repeat to combine several on one host.",
    )


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
        add_profile_argument(parser)
        parser.add_argument("dir", help="Empty or new directory; it then plays /sys.")
        return parser

    def take_action(self, parsed_args):
        profile = combined_profile(parsed_args.profile)
        kernel = fakekernel.FakeKernel(_build_whole(parsed_args.dir, profile))
        parents = kernel.list_parents()
        self.app.stdout.write(
            f"fake host {profile['name']!r} written to {kernel.paths.root}: "
            f"{len(profile['gpus'])} device(s), {len(parents)} mdev parent(s)\n"
        )
        return 0


def _build_whole(target, profile):
    """Build the host beside ``target`` and rename it into place: a failure
    leaves no half-written host, and ``target`` is never written into."""
    target = os.path.abspath(target)
    if os.path.lexists(target) and not (os.path.isdir(target) and not os.listdir(target)):
        raise exception.FakeHostExists(path=target)
    parent = os.path.dirname(target)
    try:
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.", dir=parent)
    except OSError as exc:
        # The error names the staging directory, which the operator never gave.
        raise exception.FakeHostNotWritten(path=target, reason=exc.strerror) from exc
    try:
        os.chmod(staging, 0o755)  # noqa: S103 - a fake /sys, readable like the real one
        fakekernel.FakeKernel.build(staging, profile)
        os.rename(staging, target)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(exc, OSError):
            raise exception.FakeHostNotWritten(path=target, reason=_within(exc, staging)) from exc
        raise
    return target


def _within(exc, staging):
    """The OS error with its file named inside the host being built."""
    name = exc.filename
    if isinstance(name, str) and name.startswith(staging + os.sep):
        return f"{exc.strerror}: {os.path.relpath(name, staging)}"
    return exc.strerror


class ServeFakeHost(base.Command):
    """Serve a fake host at MOUNTPOINT with FUSE, in the foreground.

    Every process then reads and writes it as sysfs: mdevctl, a privsep
    daemon, ``echo UUID > .../create``.  SIGTERM or SIGINT unmounts it.
    """

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        add_profile_argument(parser)
        parser.add_argument(
            "--tree",
            metavar="DIR",
            help="Empty or new directory for the fake kernel's own tree (kept "
            "afterwards); by default a temporary one, removed on exit.",
        )
        parser.add_argument("mountpoint", help="Empty directory, or a new one.")
        return parser

    def take_action(self, parsed_args):
        from vgpu_driver.fake import served

        served.check_mount_point(parsed_args.mountpoint)
        profile = combined_profile(parsed_args.profile)
        with _tree_dir(parsed_args.tree) as tree:
            kernel = fakekernel.FakeKernel.build(tree, profile)
            self.app.stdout.write(
                f"serving fake host {profile['name']!r} at {parsed_args.mountpoint} "
                f"(tree in {tree}); SIGTERM or SIGINT unmounts\n"
            )
            self.app.stdout.flush()
            served.serve(kernel, parsed_args.mountpoint)
        return 0


@contextlib.contextmanager
def _tree_dir(wanted):
    if wanted:
        yield wanted
        return
    tree = tempfile.mkdtemp(prefix="vgpu-fake-host-")
    try:
        yield tree
    finally:
        shutil.rmtree(tree, ignore_errors=True)
