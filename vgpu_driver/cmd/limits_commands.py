"""``limits check`` and ``limits apply``: Keystone's registered limits for
the resource classes this host's vGPU types are allocated in.

Keystone is reached with nova.conf's ``[oslo_limit]`` (keystoneauth options
and ``endpoint_id``), as nova's unified limits driver reaches it.
"""

import argparse
import logging

from vgpu_driver import limits
from vgpu_driver.cmd import base
from vgpu_driver.cmd import columns
from vgpu_driver.cmd import host_view
from vgpu_driver.conf import limits as limits_conf

COLUMNS = ("resource_name", "default_limit", "status")


def _registered_limits(app):
    if not app.options.debug:
        # It warns before raising the error that the one error: line reports.
        logging.getLogger("keystoneauth.identity.generic.base").setLevel(logging.ERROR)
    connection, endpoint_id = limits_conf.connection(app.conf)
    return limits.RegisteredLimits(connection, endpoint_id)


def _names(app):
    return limits.resource_names(host_view.load_mdev_config(app))


def _listing(rows):
    return COLUMNS, [columns.optional((r.resource_name, r.default_limit, r.status)) for r in rows]


class CheckLimits(base.Lister):
    """List the class:<RC> registered limits this host needs; exit 1 if any is missing."""

    def take_action(self, parsed_args):
        rows = _registered_limits(self.app).check(_names(self.app))
        self.missing = [r.resource_name for r in rows if r.status == limits.MISSING]
        return _listing(rows)

    def run(self, parsed_args):
        self.missing = []
        code = super().run(parsed_args)
        if not code and self.missing:
            self.app.stderr.write(
                f"missing in Keystone: {', '.join(self.missing)}; nova refuses servers "
                f"asking for them (create them with 'vgpu-manage limits apply')\n"
            )
            return base.EXIT_PROBLEMS
        return code


class ApplyLimits(base.Lister):
    """Create the missing class:<RC> registered limits; never change existing ones."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument(
            "--default-limit",
            type=_non_negative,
            required=True,
            metavar="N",
            help="Default limit of each limit created (per project).",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="List the limits that would be created, without creating them.",
        )
        return parser

    def take_action(self, parsed_args):
        registered = _registered_limits(self.app)
        rows = registered.apply(
            _names(self.app), parsed_args.default_limit, dry_run=parsed_args.dry_run
        )
        verb = "would create" if parsed_args.dry_run else "created"
        self.app.stderr.write(
            f"{verb} {len(rows)} registered limit(s) for service {registered.service_id} "
            f"in region {registered.region_id}\n"
        )
        return _listing(rows)


def _non_negative(text):
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"not a non-negative integer: {text!r}")
    return value
