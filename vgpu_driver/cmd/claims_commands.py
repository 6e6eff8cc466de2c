"""``claims init|list|restore|drop``: the journal of which instance holds which vGPU.

Only ``claims init`` (and nova-compute's start-up) creates a journal; every
other command refuses a missing one, since an empty journal makes every
claimed mdev look free.
"""

import sqlite3
import time

from vgpu_driver import audit
from vgpu_driver import claims
from vgpu_driver import claims_journal
from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import names
from vgpu_driver import reconciler_state
from vgpu_driver import state_dir
from vgpu_driver.cmd import base
from vgpu_driver.cmd import columns
from vgpu_driver.cmd import host_view

COLUMNS = ("instance", "vgpu", "gpu", "type", "state", "age", "exists", "stuck_for")
DROP_COLUMNS = ("instance", "vgpu", "gpu", "type", "state", "age", "result", "reason")


def _instance_uuid(value):
    if not names.is_mdev_uuid(value):
        raise exception.InvalidOption(
            option="--instance",
            value=value,
            reason="not an instance UUID (lower-case, 8-4-4-4-12 hex digits)",
        )
    return value


def _vgpu_id(value):
    """The canonical id claims name a vGPU by (a VF's address in lower case)."""
    try:
        return names.check_vgpu_id(value)
    except exception.InvalidSysfsName:
        raise exception.InvalidOption(
            option="--vgpu",
            value=value,
            reason="not a vGPU id (an mdev UUID, lower-case, or a VF's PCI address dddd:bb:ss.f)",
        ) from None


def _state(value):
    if value not in claims.STATES:
        raise exception.InvalidOption(
            option="--claim-state",
            value=value,
            reason=f"not a claim state ({', '.join(claims.STATES)})",
        )
    return value


class InitClaims(base.Command):
    """Create the state directory and an empty claims journal (if missing).

    An existing directory that holds other files and no journal is refused:
    it is not the driver's state directory.  The journal's files are given
    to the state directory's owner and group (mode 0640), so nova-compute,
    which runs as that owner, writes claims in a journal root made; a link
    where they go is refused, never followed.
    """

    def take_action(self, parsed_args):
        state_dir.check_new(
            self.app.conf.vgpu.state_dir,
            claims_journal.Journal.FILENAME,
            also_ours=(reconciler_state.STATE_FILE, audit.RECORD_FILE),
        )
        journal = self.app.journal(create=True)
        count = len(journal.claims())
        self.app.stdout.write(
            f"claims journal {journal.path}: schema version "
            f"{journal.schema_version}, {count} claim(s)\n"
        )
        journal.close()  # sqlite's side files go with root's connection
        return base.EXIT_OK


class ListClaims(base.Lister):
    """List the claims: who holds which vGPU, and whether it still exists.

    ``exists`` is false for a claimed vGPU the host lost (after a reboot, say);
    ``claims restore`` creates it again.  ``stuck_for``: seconds the kernel
    has blocked the removal of a ``releasing`` vGPU (a guest still holds
    it), as nova-compute's host reconciler last wrote; blank otherwise.
    """

    def take_action(self, parsed_args):
        snapshot = discovery.discover(self.app.open_host())
        journal = self.app.journal()
        present = {v.id for v in snapshot.vgpus}
        now = time.time()
        stuck = reconciler_state.removals_in_flight(
            reconciler_state.read(self.app.conf.vgpu.state_dir), now
        )
        rows = [
            (
                c.instance_uuid,
                c.mdev_uuid,
                c.gpu,
                c.type_id,
                c.state,
                round(now - c.created_at, 1),
                c.mdev_uuid in present,
                round(stuck[c.mdev_uuid], 1) if c.mdev_uuid in stuck else None,
            )
            for c in journal.claims()
        ]
        return COLUMNS, [columns.optional(r) for r in rows]


class RestoreClaims(base.FailableLister):
    """Create again the claimed vGPUs this host lost; exit 1 if one fails."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("--instance", metavar="UUID", help="Only this instance's vGPUs.")
        return parser

    def take_action(self, parsed_args):
        if parsed_args.instance is not None:
            _instance_uuid(parsed_args.instance)
        _manager, reconciler = self.app.lifecycle(host_view.load_mdev_config(self.app))
        outcomes = reconciler.restore(instance_uuid=parsed_args.instance)
        # Here a parent not there yet is a failure: nobody retries it.
        self.failed = any(o.result in ("failed", "waiting") for o in outcomes)
        return ("vgpu", "result", "reason"), [(o.mdev_uuid, o.result, o.reason) for o in outcomes]


class DropClaims(base.FailableLister):
    """Drop claims known to be dead (a migration or boot nothing will settle).

    A dry run unless ``--yes``.  A claim whose vGPU a libvirt domain
    references is never dropped: its row is refused and the exit is 1.  The
    vGPU of a dropped claim stays, unreferenced (see ``orphans``).
    """

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument(
            "--instance",
            action="append",
            default=[],
            metavar="UUID",
            help="Claims of this instance; repeatable.",
        )
        parser.add_argument(
            "--vgpu",
            action="append",
            default=[],
            metavar="ID",
            help="The claim on this vGPU (mdev UUID, or a vendor-VFIO "
            "VF's PCI address); repeatable.",
        )
        # Not --state: the global parser would take it for --state-dir.
        parser.add_argument(
            "--claim-state",
            action="append",
            default=[],
            metavar="STATE",
            help=f"Claims in this state ({', '.join(claims.STATES)}); repeatable.",
        )
        parser.add_argument(
            "--yes",
            action="store_true",
            help="Drop them; without it, only list what would be dropped.",
        )
        return parser

    def take_action(self, parsed_args):
        selected = _selection(parsed_args)
        journal = self.app.journal()
        domains = self.app.domains()
        try:
            if parsed_args.yes:
                # Checked and dropped under the allocation lock: no claim
                # changes between the two.
                with journal.transaction() as txn:
                    drop, refused = _split(txn.claims(), selected, domains.mdev_users())
                    if drop:
                        txn.remove(mdev_uuids=[c.mdev_uuid for c in drop])
            else:
                drop, refused = _split(journal.claims(), selected, domains.mdev_users())
        except sqlite3.Error as exc:
            raise exception.JournalError(
                path=journal.path, reason=f"cannot drop claims: {exc}"
            ) from exc
        self.failed = bool(refused)
        self.app.stderr.write(_summary(len(drop), len(refused), parsed_args.yes) + "\n")
        return DROP_COLUMNS, _drop_rows(drop, refused, parsed_args.yes)


def _selection(parsed_args):
    """A predicate for the claims the options select; refuses none given,
    which would select every claim."""
    instances = {_instance_uuid(v) for v in parsed_args.instance}
    vgpus = {_vgpu_id(v) for v in parsed_args.vgpu}
    states = {_state(v) for v in parsed_args.claim_state}
    if not (instances or vgpus or states):
        raise exception.InvalidOption(
            option="claims drop",
            value="",
            reason="give --instance, --vgpu or --claim-state; it never drops every claim",
        )
    return lambda c: (
        (not instances or c.instance_uuid in instances)
        and (not vgpus or c.mdev_uuid in vgpus)
        and (not states or c.state in states)
    )


def _split(all_claims, selected, users):
    """``(claims to drop, {claim: domain name})``: a claim whose vGPU a
    domain references is the guest's, whatever its state says."""
    drop, refused = [], {}
    for claim in filter(selected, all_claims):
        if claim.mdev_uuid in users:
            refused[claim] = users[claim.mdev_uuid].name
        else:
            drop.append(claim)
    return drop, refused


def _summary(dropped, refused, done):
    if not dropped and not refused:
        return "no claim matches"
    text = (
        f"dropped {dropped} claim(s)"
        if done
        else f"would drop {dropped} claim(s)" + ("; run again with --yes" if dropped else "")
    )
    if refused:
        text += f"; refused {refused} claim(s) whose vGPU a libvirt domain uses"
    return text


def _drop_rows(drop, refused, done):
    now = time.time()
    outcomes = [(c, "dropped" if done else "would-drop", None) for c in drop]
    outcomes += [(c, "refused", f"domain {name} uses it") for c, name in refused.items()]
    rows = [
        (
            c.instance_uuid,
            c.mdev_uuid,
            c.gpu,
            c.type_id,
            c.state,
            round(now - c.created_at, 1),
            result,
            reason,
        )
        for c, result, reason in sorted(outcomes, key=lambda o: o[0].mdev_uuid)
    ]
    return [columns.optional(r) for r in rows]
