"""``vgpu-manage``: the operator's view of a host's virtual GPUs.

Global options say where to read nova.conf and sysfs from; each command is a
cliff command declared in ``setup.cfg`` (namespace ``vgpu_driver.manage``),
so every listing takes ``-f table|json|yaml|value|csv``.
"""

import contextlib
import io
import logging
import os
import socket
import sys

from cliff import app
from cliff import commandmanager
from oslo_config import cfg

import vgpu_driver
from vgpu_driver import claims_journal
from vgpu_driver import conf as vgpu_conf
from vgpu_driver import driver
from vgpu_driver import exception
from vgpu_driver import hosts
from vgpu_driver import libvirt_host
from vgpu_driver import privsep
from vgpu_driver import sysfs
from vgpu_driver.cmd import base


class ManageApp(app.App):
    def __init__(self):
        super().__init__(
            description="Inspect and manage virtual GPUs (VFIO mdevs) on a compute host.",
            version=vgpu_driver.__version__,
            command_manager=commandmanager.CommandManager("vgpu_driver.manage"),
            deferred_help=True,
        )
        self._conf = None

    def build_option_parser(self, description, version, argparse_kwargs=None):
        # No abbreviations of the global options: a command's own option
        # (claims drop --claim-state) must never be taken for one of them.
        argparse_kwargs = {**(argparse_kwargs or {}), "allow_abbrev": False}
        parser = super().build_option_parser(description, version, argparse_kwargs)
        parser.add_argument(
            "--config-file",
            action="append",
            default=[],
            metavar="FILE",
            help="nova.conf (or snippet) to read; repeatable. Default: nova's "
            "usual locations (/etc/nova/nova.conf ...).",
        )
        parser.add_argument(
            "--sysfs-root",
            metavar="DIR",
            help="Directory that plays /sys (overrides [vgpu] sysfs_root).",
        )
        parser.add_argument(
            "--nodename",
            default=socket.gethostname(),
            help="Compute node name; providers are named after it (default: this host's name).",
        )
        parser.add_argument(
            "--libvirt-uri",
            metavar="URI",
            help="libvirt connection telling which guest uses which mdev (overrides "
            "[vgpu] libvirt_uri).",
        )
        parser.add_argument(
            "--state-dir",
            metavar="DIR",
            help="Directory of the driver's state (overrides [vgpu] state_dir).",
        )
        return base.usage_errors_on_one_line(parser)

    def configure_logging(self):
        """cliff's console, with one prefix style (``warning: ...``) and no
        library's chatter unless ``--debug``."""
        super().configure_logging()
        for handler in logging.getLogger().handlers:
            if getattr(handler, "stream", None) is self.stderr:
                handler.setFormatter(_ConsoleFormatter(self.CONSOLE_MESSAGE_FORMAT))
        if not self.options.debug:
            for name in _QUIET_UNLESS_DEBUG:
                logging.getLogger(name).setLevel(logging.WARNING)

    def run_subcommand(self, argv):
        """An unknown command is one ``error:`` line, with the near misses."""
        try:
            self.command_manager.find_command(argv)
        except ValueError:
            self.stderr.write(
                f"error: {_unknown_command(argv, self.get_fuzzy_matches)}; "
                "see 'vgpu-manage --help'\n"
            )
            return base.EXIT_ERROR
        return super().run_subcommand(argv)

    @property
    def conf(self):
        """The parsed configuration, loaded on first use."""
        if self._conf is None:
            conf = cfg.ConfigOpts()
            vgpu_conf.register_opts(conf)
            files = self.options.config_file or cfg.find_config_files(project="nova")
            for path in files:
                _check_utf8(path)
            conf([], project="nova", default_config_files=files)
            for option in ("sysfs_root", "state_dir", "libvirt_uri"):
                value = getattr(self.options, option)
                if value is not None and not value.strip():
                    raise exception.InvalidOption(
                        option="--" + option.replace("_", "-"),
                        value=value,
                        reason=f"empty; give a value, or leave the option out for [vgpu] {option}",
                    )
                if value is not None:
                    conf.set_override(option, value, group="vgpu")
            privsep.run_in_process_when_root(conf)
            self._conf = conf
        return self._conf

    # What plays the kernel; the demo and tests put a fake kernel here.
    host_factory = staticmethod(sysfs.open_host)

    def open_host(self):
        if self.host_factory is sysfs.open_host:
            return hosts.open_host(self.conf)
        return self.host_factory(self.conf.vgpu.sysfs_root)

    def journal(self, snapshot=None, create=False):
        """The claims journal, checked on open; only ``create`` makes one.

        A missing journal raises JournalMissing, unless ``snapshot`` shows a
        host without any vGPU: nothing there can be claimed, and None is
        returned.  A journal that is there but unusable always raises.
        """
        try:
            return claims_journal.Journal(self.conf.vgpu.state_dir, create=create)
        except exception.JournalMissing:
            if snapshot is not None and not snapshot.vgpus:
                return None
            raise

    def view_journal(self, snapshot):
        """The journal for a read-only view: as :meth:`journal`, except that a
        journal nova-compute never made (no state directory, or no file in
        it) gives None and one warning, so a host can be looked at before
        nova-compute first runs there.  Writers use :meth:`journal`."""
        try:
            return self.journal(snapshot)
        except exception.JournalMissing as exc:
            state_dir = self.conf.vgpu.state_dir
            if os.path.exists(state_dir) and not os.path.isdir(state_dir):
                raise
            self.LOG.warning(
                "No claims journal at %s (%s): claims are not counted in this view",
                exc.kwargs["path"],
                exc.kwargs["reason"],
            )
            return None

    def domains(self):
        return libvirt_host.LibvirtHost(self.conf.vgpu.libvirt_uri)

    def lifecycle(self, mdev_config):
        """A manager and reconciler over this host, its journal and libvirt."""
        vgpu = driver.VGPUDriver(
            self.conf,
            self.domains(),
            host=self.open_host(),
            mdev_config=mdev_config,
            journal=self.journal(),
        )
        return vgpu.manager, vgpu.reconciler


# Loggers whose INFO lines say nothing an operator of this command needs:
# libraries', and how this command process learns of GPU changes.
_QUIET_UNLESS_DEBUG = (
    "keystoneauth",
    "openstack",
    "stevedore",
    "urllib3",
    "oslo_privsep",
    "vgpu_driver.sysfs.udev",
)


class _ConsoleFormatter(logging.Formatter):
    """Warnings and errors on the console start as the error lines do."""

    def format(self, record):
        text = super().format(record)
        prefix = f"{record.levelname.lower()}: "
        if record.levelno >= logging.WARNING and not text.startswith(prefix):
            return prefix + text
        return text


def _unknown_command(argv, near_misses):
    if argv[0].startswith("-"):
        return (
            f"unknown option {argv[0]!r} (a command's own options, such as -f, go "
            "after the command)"
        )
    near = near_misses(argv[0])
    hint = f" (did you mean {' or '.join(repr(m) for m in near)}?)" if near else ""
    return f"{' '.join(argv)!r} is not a vgpu-manage command{hint}"


def _check_utf8(path):
    """oslo.config's decode error names no file; this one does."""
    try:
        with open(path, "rb") as f:
            f.read().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise cfg.ConfigFileParseError(
            path, f"not UTF-8 text (byte {exc.start}: {exc.object[exc.start : exc.start + 1]!r})"
        ) from None
    except OSError:
        pass  # oslo.config says what is wrong with a file it cannot open


# What cliff returns when the reader stopped reading (``... | head``), as a
# shell reports a command SIGPIPE ended.
SIGPIPE_EXIT = 141


def _quiet_stdout():
    """Nothing left for the interpreter to flush into a closed pipe at exit."""
    with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def main(argv=None):
    try:
        code = ManageApp().run(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # argparse's exit: a usage error, --help, --version
        return exc.code if isinstance(exc.code, int) else base.EXIT_ERROR
    except BrokenPipeError:
        code = SIGPIPE_EXIT
    if code == SIGPIPE_EXIT:
        _quiet_stdout()
    return code


if __name__ == "__main__":
    sys.exit(main())
