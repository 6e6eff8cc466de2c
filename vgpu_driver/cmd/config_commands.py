"""``config check``: is nova.conf's mdev configuration sound on this host?"""

from vgpu_driver import config_check
from vgpu_driver import discovery
from vgpu_driver import host_probe
from vgpu_driver import inventory
from vgpu_driver import vgpu_scheduler
from vgpu_driver.cmd import base
from vgpu_driver.conf import fleet
from vgpu_driver.conf import mdev_types


class CheckConfig(base.Command):
    """Validate [devices] and [mdev_*] against this host; exit 1 if unsound.

    Each problem is one line (with --strict, warnings count as problems).
    """

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument(
            "--strict", action="store_true", help="Count warnings as problems (exit 1)."
        )
        return parser

    def take_action(self, parsed_args):
        config, problems = mdev_types.load(self.app.conf)
        host = self.app.open_host()
        snapshot = discovery.discover(host)
        boards = (
            inventory.read_boards(host, snapshot, config)
            if not any(p.severity == "error" for p in problems)
            else None
        )
        schedulers = {
            gpu.address: vgpu_scheduler.policy(host.paths, gpu.address)
            for gpu in snapshot.gpus
            if gpu.pci is not None
        }
        problems += config_check.check(
            self.app.conf,
            config,
            snapshot,
            boards,
            host_probe.configured_functions(host.paths, config),
            schedulers,
        )
        for problem in problems:
            self.app.stdout.write(f"{problem}\n")
        failing = ("error", "warning") if parsed_args.strict else ("error",)
        if any(p.severity in failing for p in problems):
            return base.EXIT_PROBLEMS
        self._write_gpu_map(config, snapshot)
        self.app.stdout.write(
            f"ok: {len(config.types)} enabled type(s), "
            f"{len(snapshot.gpus)} mdev-capable device(s) on this host\n"
        )
        return base.EXIT_OK

    def _write_gpu_map(self, config, snapshot):
        """When types select GPUs by model, show which GPU got which type."""
        if not any(t.device_ids for t in config.types):
            return
        for gpu, device_id, types, how in fleet.gpu_map(config.for_host(snapshot), snapshot):
            self.app.stdout.write(
                f"{gpu} ({device_id or 'virtual'}) -> {','.join(types) or 'none'}: {how}\n"
            )
