"""``config check``: is nova.conf's mdev configuration sound on this host?"""


from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver.cmd import base
from vgpu_driver.conf import devices
from vgpu_driver.conf import fleet
from vgpu_driver.conf import mdev_types


def host_problems(config, snapshot):
    """What the config asks for that this host does not have (warnings)."""
    problems = []
    for type_config in config.types:
        option = f"[{devices.group_name(type_config.type_id)}] device_addresses"
        for address in type_config.device_addresses:
            gpu = snapshot.gpu(address)
            if gpu is None:
                problems.append(exception.ConfigProblem(
                    option, address, "no mdev-capable device at this address on this host",
                    "warning"))
            elif not gpu.offers(type_config.type_id):
                offered = sorted({t.type_id for p in gpu.parents for t in p.types})
                problems.append(exception.ConfigProblem(
                    option, address, f"does not offer {type_config.type_id} "
                    f"(offers: {', '.join(offered) or 'nothing'})", "warning"))
    offered = {t.type_id for g in snapshot.gpus for p in g.parents for t in p.types}
    for type_id in config.enabled:
        if snapshot.gpus and type_id not in offered:
            problems.append(exception.ConfigProblem(
                "[devices] enabled_mdev_types", type_id,
                "no device on this host offers this type", "warning"))
    return problems


class CheckConfig(base.Command):
    """Validate [devices] and [mdev_*]; exit 1 and list each problem if unsound."""

    def take_action(self, parsed_args):
        config, problems = mdev_types.load(self.app.conf)
        snapshot = discovery.discover(self.app.open_host())
        problems += host_problems(config, snapshot)
        for problem in problems:
            self.app.stdout.write(f"{problem}\n")
        if any(p.severity == "error" for p in problems):
            return base.EXIT_PROBLEMS
        self._write_gpu_map(config, snapshot)
        self.app.stdout.write(
            f"ok: {len(config.types)} enabled type(s), "
            f"{len(snapshot.gpus)} mdev-capable device(s) on this host\n")
        return base.EXIT_OK

    def _write_gpu_map(self, config, snapshot):
        """When types select GPUs by model, show which GPU got which type."""
        if not any(t.device_ids for t in config.types):
            return
        for gpu, device_id, type_id, how in fleet.gpu_map(config.for_host(snapshot),
                                                          snapshot):
            self.app.stdout.write(
                f"{gpu} ({device_id or 'virtual'}) -> {type_id or 'none'}: {how}\n")
