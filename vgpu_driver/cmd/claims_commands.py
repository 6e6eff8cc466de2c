"""``claims init|list|restore``: the journal of which instance holds which vGPU.

Only ``claims init`` (and nova-compute's start-up) creates a journal; every
other command refuses a missing one, since an empty journal makes every
claimed mdev look free.
"""

import time

from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import names
from vgpu_driver.cmd import base
from vgpu_driver.cmd import columns
from vgpu_driver.cmd import host_commands

COLUMNS = ("instance", "vgpu", "gpu", "type", "state", "age", "exists")


class InitClaims(base.Command):
    """Create the state directory and an empty claims journal (if missing)."""

    def take_action(self, parsed_args):
        journal = self.app.journal(create=True)
        count = len(journal.claims())
        self.app.stdout.write(f"claims journal {journal.path}: schema version "
                              f"{journal.schema_version}, {count} claim(s)\n")
        return base.EXIT_OK


class ListClaims(base.Lister):
    """List the claims: who holds which vGPU, and whether it still exists.

    ``exists`` is false for a claimed vGPU the host lost (after a reboot, say);
    ``claims restore`` creates it again.
    """

    def take_action(self, parsed_args):
        snapshot = discovery.discover(self.app.open_host())
        journal = self.app.journal()
        present = {v.id for v in snapshot.vgpus}
        now = time.time()
        rows = [(c.instance_uuid, c.mdev_uuid, c.gpu, c.type_id, c.state,
                 round(now - c.created_at, 1), c.mdev_uuid in present)
                for c in journal.claims()]
        return COLUMNS, [columns.optional(r) for r in rows]


class RestoreClaims(base.FailableLister):
    """Create again the claimed vGPUs this host lost; exit 1 if one fails."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("--instance", metavar="UUID",
                            help="Only this instance's vGPUs.")
        return parser

    def take_action(self, parsed_args):
        instance = parsed_args.instance
        if instance is not None and not names.is_mdev_uuid(instance):
            raise exception.InvalidOption(option="--instance", value=instance,
                                          reason="not an instance UUID (lower-case, "
                                                 "8-4-4-4-12 hex digits)")
        _manager, reconciler = self.app.lifecycle(host_commands.load_mdev_config(self.app))
        outcomes = reconciler.restore(wait=0, instance_uuid=parsed_args.instance)
        self.failed = any(o.result == "failed" for o in outcomes)
        return ("vgpu", "result", "reason"), [(o.mdev_uuid, o.result, o.reason)
                                              for o in outcomes]
