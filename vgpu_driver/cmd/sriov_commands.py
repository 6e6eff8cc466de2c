"""``sriov status|enable|disable``: the VFs of NVIDIA SR-IOV GPUs.

``enable --configured`` is what the boot unit runs
(``etc/systemd/vgpu-driver-sriov.service``): the GPUs nova.conf gives a type
get their VFs from NVIDIA's ``sriov-manage`` (``[vgpu] sriov_manage_path``,
once per GPU), the command waits until every VF offers its mdev types, and
switches the boards configured for several sizes to mixed-size mode.
"""

import contextlib

from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import inventory
from vgpu_driver import sriov_apply
from vgpu_driver import sriov_functions
from vgpu_driver import sriov_manage
from vgpu_driver import sriov_plan
from vgpu_driver import sriov_wait
from vgpu_driver.cmd import base
from vgpu_driver.cmd import columns
from vgpu_driver.cmd import host_view
from vgpu_driver.cmd.sizes_commands import vgpu_sizes
from vgpu_driver.sysfs import udev

DEFAULT_WAIT = 60.0


class Status(base.Lister):
    """List NVIDIA SR-IOV GPUs: their VFs, the types those offer, and state.

    The state is off, enabled, or partial (VFs not all registered by the
    vendor driver yet).  vgpu_sizes is a vendor-VFIO board's mode: equal
    (every vGPU of one framebuffer size, NVIDIA's default) or mixed.
    """

    def take_action(self, parsed_args):
        cols = (
            "physical_function",
            "vendor",
            "device",
            "totalvfs",
            "numvfs",
            "vfs",
            "mdev_types",
            "state",
            "vgpu_sizes",
        )
        host = self.app.open_host()
        snapshot = discovery.discover(host)

        def warn(text):
            self.app.stderr.write(f"warning: {text}\n")

        rows = [
            (
                pf.address,
                pf.vendor,
                pf.device,
                pf.totalvfs,
                pf.numvfs,
                columns.PciRangesColumn([vf.address for vf in pf.vfs]),
                columns.ListColumn(pf.mdev_types),
                pf.state,
                vgpu_sizes(host, snapshot, pf.address, warn),
            )
            for pf in sriov_functions.functions_in(snapshot)
        ]
        return cols, [columns.optional(r) for r in rows]


def _configured(app, host):
    """SR-IOV GPUs the config gives a type (device_addresses, device_ids)."""
    snapshot = discovery.discover(host)
    served = inventory.configured_types(snapshot, host_view.load_mdev_config(app))
    return [
        gpu.address
        for gpu in snapshot.gpus
        if discovery.is_sriov_gpu(gpu.pci) and gpu.address in served
    ]


def _script(app):
    return sriov_manage.SriovManage(app.conf.vgpu.sriov_manage_path)


class Enable(base.Command):
    """Enable the VFs of NVIDIA SR-IOV GPUs, then wait for their mdev types.

    All of a GPU's VFs are enabled (sriov_totalvfs) by NVIDIA's sriov-manage
    ([vgpu] sriov_manage_path), one GPU at a time; GPUs that have VFs
    already are left alone.
    """

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        which = parser.add_mutually_exclusive_group()
        which.add_argument(
            "--all", action="store_true", help="Every NVIDIA SR-IOV GPU of the host."
        )
        which.add_argument(
            "--configured",
            action="store_true",
            help="The SR-IOV GPUs nova.conf gives a type ([mdev_<type>] "
            "device_addresses, device_ids).",
        )
        parser.add_argument(
            "addresses",
            nargs="*",
            metavar="ADDRESS",
            help="Physical function PCI address (dddd:bb:ss.f).",
        )
        parser.add_argument(
            "--wait",
            type=base.seconds,
            default=DEFAULT_WAIT,
            metavar="SECONDS",
            help="At most this long for the VFs to offer their types (default: %(default)s).",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Check and say what would be written; write nothing.",
        )
        return parser

    def _addresses(self, parsed_args, host):
        chosen = bool(parsed_args.addresses) + parsed_args.all + parsed_args.configured
        if chosen != 1:
            raise exception.InvalidOption(
                option="sriov enable",
                value=" ".join(parsed_args.addresses),
                reason="give ADDRESS..., --all or --configured (one of them)",
            )
        if parsed_args.all:
            return [pf.address for pf in sriov_functions.list_functions(host)]
        if parsed_args.configured:
            return _configured(self.app, host)
        return parsed_args.addresses

    def take_action(self, parsed_args):
        host = self.app.open_host()
        addresses = self._addresses(parsed_args, host)
        out = self.app.stdout
        if not addresses:
            out.write("no SR-IOV GPU to enable\n")
            return base.EXIT_OK
        steps = sriov_plan.plan_enable(host, addresses)
        script = _script(self.app)
        if parsed_args.dry_run:
            for step in steps:
                if step.action == "enable":
                    out.write(
                        f"{step.address}: would enable VFs: {step.detail} "
                        f"({script.command('-e', step.address)})\n"
                    )
                else:
                    out.write(f"{step.address}: would leave: {step.detail}\n")
            self._mixed_sizes(host, [step.address for step in steps], dry_run=True)
            return base.EXIT_OK

        def progress(text):
            out.write(f"{text}\n")
            out.flush()

        changes = udev.start(host, self.app.conf.vgpu.hotplug_events)
        try:
            sriov_apply.enable(
                host,
                steps,
                parsed_args.wait,
                script,
                wake=sriov_wait.waker(changes),
                progress=progress,
            )
        finally:
            changes.stop()
        self._mixed_sizes(host, [step.address for step in steps])
        return base.EXIT_OK

    def _mixed_sizes(self, host, addresses, dry_run=False):
        """Once the VFs are there: the boards the configuration lists under
        several types go to mixed-size mode, which NVIDIA's driver forgets
        at every enablement (and cannot take before the VFs come).  Type
        pools stay in equal-size mode."""
        config = host_view.load_mdev_config(self.app)
        if config.pools:
            return
        served = inventory.configured_types(discovery.discover(host), config)
        for address in addresses:
            types = served.get(address, ())
            if len(types) < 2:
                continue
            why = f"configured for {', '.join(types)}"
            if dry_run:
                self.app.stdout.write(f"{address}: would switch to mixed sizes ({why})\n")
            elif host.mixed_sizes(address):
                self.app.stdout.write(f"{address}: already mixed sizes ({why})\n")
            else:
                host.set_mixed_sizes(address, True)
                self.app.stdout.write(f"{address}: switched to mixed sizes ({why})\n")


class Disable(base.Command):
    """Disable the VFs of one NVIDIA SR-IOV GPU, if nothing uses them.

    Refused while any VF holds a vGPU or the claims journal holds a claim
    on it; done by NVIDIA's sriov-manage ([vgpu] sriov_manage_path).
    """

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument(
            "address", metavar="ADDRESS", help="Physical function PCI address (dddd:bb:ss.f)."
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Check and say what would be written; write nothing.",
        )
        return parser

    def take_action(self, parsed_args):
        host = self.app.open_host()
        # What VFs hold is checked first: its refusal is the more useful one,
        # and a host without vGPUs may have no journal.
        sriov_plan.plan_disable(host, parsed_args.address)
        journal = self.app.journal(discovery.discover(host))
        script = _script(self.app)
        if parsed_args.dry_run:
            step = sriov_plan.plan_disable(
                host, parsed_args.address, journal.claims if journal else None
            )
            if step.action == "disable":
                self.app.stdout.write(
                    f"{step.address}: would disable VFs: {step.detail} "
                    f"({script.command('-d', step.address)})\n"
                )
            else:
                self.app.stdout.write(f"{step.address}: would leave: {step.detail}\n")
            return base.EXIT_OK
        if sriov_plan.plan_disable(host, parsed_args.address).action == "disable":
            script.check("-d", parsed_args.address)
        # Checked again and written under the journal's allocation lock, so
        # no vGPU is claimed on these VFs between the check and the write.
        with journal.transaction() if journal else contextlib.nullcontext() as txn:
            step = sriov_plan.plan_disable(host, parsed_args.address, txn.claims if txn else None)
            sriov_apply.disable(host, step, script)
        self.app.stdout.write(
            f"{step.address}: "
            f"{'disabled VFs' if step.action == 'disable' else 'left'}: "
            f"{step.detail}\n"
        )
        return base.EXIT_OK
