"""``vgpu-manage``: the operator's view of a host's virtual GPUs.

Global options say where to read nova.conf and sysfs from; each command is a
cliff command declared in ``setup.cfg`` (namespace ``vgpu_driver.manage``),
so every listing takes ``-f table|json|yaml|value|csv``.
"""

import socket
import sys

from cliff import app
from cliff import commandmanager
from oslo_config import cfg

import vgpu_driver
from vgpu_driver import claims
from vgpu_driver import conf as vgpu_conf
from vgpu_driver import driver
from vgpu_driver import exception
from vgpu_driver import libvirt_host
from vgpu_driver import privsep
from vgpu_driver import sysfs


class ManageApp(app.App):
    def __init__(self):
        super().__init__(
            description="Inspect and manage virtual GPUs (VFIO mdevs) on a compute host.",
            version=vgpu_driver.__version__,
            command_manager=commandmanager.CommandManager("vgpu_driver.manage"),
            deferred_help=True)
        self._conf = None

    def build_option_parser(self, description, version, argparse_kwargs=None):
        parser = super().build_option_parser(description, version, argparse_kwargs)
        parser.add_argument(
            "--config-file", action="append", default=[], metavar="FILE",
            help="nova.conf (or snippet) to read; repeatable. Default: nova's "
                 "usual locations (/etc/nova/nova.conf ...).")
        parser.add_argument(
            "--sysfs-root", metavar="DIR",
            help="Directory that plays /sys (overrides [vgpu] sysfs_root).")
        parser.add_argument(
            "--nodename", default=socket.gethostname(),
            help="Compute node name; providers are named after it (default: this host's name).")
        parser.add_argument(
            "--libvirt-uri", metavar="URI",
            help="libvirt connection telling which guest uses which mdev (overrides "
                 "[vgpu] libvirt_uri).")
        parser.add_argument(
            "--state-dir", metavar="DIR",
            help="Directory of the driver's state (overrides [vgpu] state_dir).")
        return parser

    @property
    def conf(self):
        """The parsed configuration, loaded on first use."""
        if self._conf is None:
            conf = cfg.ConfigOpts()
            vgpu_conf.register_opts(conf)
            files = self.options.config_file or cfg.find_config_files(project="nova")
            conf([], project="nova", default_config_files=files)
            if self.options.sysfs_root:
                conf.set_override("sysfs_root", self.options.sysfs_root, group="vgpu")
            for option in ("state_dir", "libvirt_uri"):
                value = getattr(self.options, option)
                if value:
                    conf.set_override(option, value, group="vgpu")
            privsep.run_in_process_when_root(conf)
            self._conf = conf
        return self._conf

    # What plays the kernel; the demo and tests put a fake kernel here.
    host_factory = staticmethod(sysfs.open_host)

    def open_host(self):
        return self.host_factory(self.conf.vgpu.sysfs_root)

    def journal(self, snapshot=None, create=False):
        """The claims journal, checked on open; only ``create`` makes one.

        A missing journal raises JournalMissing, unless ``snapshot`` shows a
        host without any vGPU: nothing there can be claimed, and None is
        returned.  A journal that is there but unusable always raises.
        """
        try:
            return claims.Journal(self.conf.vgpu.state_dir, create=create)
        except exception.JournalMissing:
            if snapshot is not None and not snapshot.vgpus:
                return None
            raise

    def domains(self):
        return libvirt_host.LibvirtHost(self.conf.vgpu.libvirt_uri, use_events=False)

    def lifecycle(self, mdev_config):
        """A manager and reconciler over this host, its journal and libvirt."""
        vgpu = driver.VGPUDriver(self.conf, self.domains(), host=self.open_host(),
                                 mdev_config=mdev_config, journal=self.journal())
        return vgpu.manager, vgpu.reconciler


def main(argv=None):
    return ManageApp().run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
