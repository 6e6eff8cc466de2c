"""``sync`` and ``audit``: this host's GPU providers in Placement.

Placement is reached with ``[placement]`` (keystoneauth options, as nova
reads them) or, without ``auth_type`` there, the usual ``OS_*`` variables or
``clouds.yaml``.
"""

import json
import time

from vgpu_driver import audit as audit_mod
from vgpu_driver import compute_api
from vgpu_driver import exception
from vgpu_driver import placement
from vgpu_driver.cmd import base
from vgpu_driver.cmd import columns
from vgpu_driver.cmd import host_view
from vgpu_driver.conf import placement as placement_conf


def _sync(app, connection=None):
    connection = connection or placement_conf.connection(app.conf)
    return placement.ProviderSync(placement.Client(connection))


class Sync(base.Lister):
    """Push this host's GPU providers to Placement (once); list the requests."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="Read Placement and list the writes a sync would make, without making them.",
        )
        return parser

    def take_action(self, parsed_args):
        sync = _sync(self.app)
        tree, _snapshot = host_view.desired_tree(self.app, sync)
        report = sync.sync(tree, dry_run=parsed_args.dry_run)
        verb = "would make" if parsed_args.dry_run else "made"
        self.app.stderr.write(
            f"{len(tree.providers)} GPU provider(s): {len(report.created)} created, "
            f"{len(report.updated)} updated, {len(report.deleted)} deleted, "
            f"{len(report.kept)} kept reserved; {verb} {len(report.planned)} write(s) "
            f"after {report.reads} read(s)\n"
        )
        rows = [
            (method, url, json.dumps(body, sort_keys=True) if body else None)
            for method, url, body in report.planned
        ]
        return ("method", "url", "body"), [columns.optional(r) for r in rows]


class Audit(base.Lister):
    """Compare the host with Placement; exit 1 if they drifted apart.

    How much drift of each kind was found is left in the state directory
    (``audit.json``) for ``vgpu-manage metrics``.
    """

    def take_action(self, parsed_args):
        connection = placement_conf.connection(self.app.conf)
        sync = _sync(self.app, connection)
        tree, snapshot = host_view.desired_tree(self.app, sync)
        journal = self.app.journal(snapshot)
        claim_list = journal.claims() if journal else []
        users = self.app.domains().mdev_users()
        drifts = audit_mod.audit(
            sync,
            tree,
            snapshot,
            claim_list,
            users,
            moves=lambda: self._moves(connection, tree.root_name),
        )
        self.drifted = bool(drifts)
        if journal is not None:
            self._record(drifts)
        rows = [(d.kind, d.provider, d.gpu, d.consumer, d.detail) for d in drifts]
        return (
            ("kind", "provider", "gpu", "consumer", "detail"),
            [columns.optional(r) for r in rows],
        )

    def _record(self, drifts):
        """What was found, for ``vgpu-manage metrics``; an audit run by a user
        who cannot write the state directory still reports."""
        try:
            audit_mod.write_record(self.app.conf.vgpu.state_dir, drifts, time.time())
        except OSError as exc:
            self.app.stderr.write(
                f"warning: the audit's result was not recorded for "
                f"vgpu-manage metrics: {base.one_line(exc)}\n"
            )

    def _moves(self, connection, host):
        """nova's moves under way on the host; none (with a warning) when
        nova cannot say."""
        try:
            return compute_api.moves_on(connection, host)
        except exception.ComputeApiUnavailable as exc:
            self.app.stderr.write(
                f"warning: {exc}; an allocation a resize awaiting "
                f"confirmation holds shows as drift.\n"
            )
            return {}

    def run(self, parsed_args):
        self.drifted = None
        code = super().run(parsed_args)
        if self.drifted is False:
            # A script reads the empty listing on stdout; a person sees the words.
            tty = self.app.stdout.isatty()
            (self.app.stdout if tty else self.app.stderr).write("no drift\n")
        return code or (base.EXIT_PROBLEMS if self.drifted else base.EXIT_OK)
