"""``orphans list`` and ``orphans reclaim``: mdevs nobody uses.

An orphan is an mdev no libvirt domain (active or inactive) and no claim
references.  Both commands need libvirt: without it a guest's mdev cannot be
told from an orphan, and nothing is removed.
"""

from vgpu_driver import discovery
from vgpu_driver import reconcile
from vgpu_driver.cmd import base
from vgpu_driver.cmd import columns
from vgpu_driver.cmd import host_view

COLUMNS = ("uuid", "parent", "gpu", "type", "kind", "age")


def _reconciler(app):
    """The host's reconciler; None on a host with neither a vGPU nor a
    journal, where there is nothing to look at.  A missing journal on a host
    with vGPUs is refused: every claimed mdev would look like an orphan."""
    if app.journal(discovery.discover(app.open_host())) is None:
        app.domains().mdev_users()  # still refuse to run blind
        return None
    return app.lifecycle(host_view.load_mdev_config(app))[1]


def _add_grace(parser):
    parser.add_argument(
        "--grace",
        type=base.seconds,
        default=0.0,
        metavar="SECONDS",
        help="Leave out mdevs younger than this (default: 0).",
    )


class ListOrphans(base.Lister):
    """List mdevs no guest and no claim references.

    kind: free (of the type its GPU serves, reusable), stale-type (of a type
    its GPU no longer serves), unmanaged (on a GPU vgpu-driver does not serve).
    """

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        _add_grace(parser)
        return parser

    def take_action(self, parsed_args):
        reconciler = _reconciler(self.app)
        if reconciler is None:
            return COLUMNS, []
        rows = [
            (
                o.mdev_uuid,
                o.parent,
                o.gpu,
                o.type_id,
                o.kind,
                None if o.age is None else round(o.age, 1),
            )
            for o in reconciler.orphans(parsed_args.grace)
        ]
        return COLUMNS, [columns.optional(r) for r in rows]


class ReclaimOrphans(base.FailableLister):
    """Remove orphan mdevs (free and stale-type; unmanaged ones on request)."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        _add_grace(parser)
        parser.add_argument(
            "--dry-run", action="store_true", help="Only say what would be removed."
        )
        parser.add_argument(
            "--include-unmanaged",
            action="store_true",
            help="Also remove orphans on GPUs vgpu-driver does not serve.",
        )
        return parser

    def take_action(self, parsed_args):
        reconciler = _reconciler(self.app)
        if reconciler is None:
            return ("uuid", "result", "reason"), []
        orphans = [
            o
            for o in reconciler.orphans(parsed_args.grace)
            if parsed_args.include_unmanaged or o.kind != reconcile.UNMANAGED
        ]
        outcomes = reconciler.reclaim(orphans, dry_run=parsed_args.dry_run)
        self.failed = any(o.result == "failed" for o in outcomes)
        return ("uuid", "result", "reason"), [(o.mdev_uuid, o.result, o.reason) for o in outcomes]
