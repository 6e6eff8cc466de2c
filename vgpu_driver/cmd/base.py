"""Base classes of vgpu-manage's commands: one exit-code contract for all.

0: done (or sound); 1: the command found problems (``config check``);
2: the command could not do its job, with one ``error:`` line that says why.
"""

from cliff import command
from cliff import lister
from oslo_config import cfg

from vgpu_driver import exception

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_ERROR = 2


class _ErrorsAsExitCodes:
    def run(self, parsed_args):
        try:
            return super().run(parsed_args)
        except (exception.VgpuDriverError, cfg.Error) as exc:
            self.app.LOG.debug("%s failed", self.cmd_name, exc_info=exc)
            self.app.stderr.write(f"error: {exc}\n")
            return EXIT_ERROR


class Command(_ErrorsAsExitCodes, command.Command):
    pass


class Lister(_ErrorsAsExitCodes, lister.Lister):
    pass
