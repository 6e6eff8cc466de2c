"""``status``: one screen per host, each source read once.

It reads what ``inventory``, ``mdev list`` and ``claims list`` read (one
discovery snapshot, one inventory computation, one journal read, one
libvirt listing) and shows it per physical GPU; the table ends with one
summary line about the host.  Without libvirt it still shows the GPUs and
the claims, with guests unknown, says why in one ``warning:`` line on
stderr, and exits 0: that is when an operator most needs the rest.
"""

import dataclasses
import time

from cliff import columns as cliff_columns

from vgpu_driver import discovery
from vgpu_driver import framebuffer
from vgpu_driver import host_probe
from vgpu_driver import host_snapshot
from vgpu_driver import inventory
from vgpu_driver import libvirt_host
from vgpu_driver import reconciler_state
from vgpu_driver import status
from vgpu_driver import status_assembly
from vgpu_driver.cmd import base
from vgpu_driver.cmd import columns
from vgpu_driver.cmd import host_view
from vgpu_driver.cmd import status_screen

COLUMNS = (
    "provider",
    "gpu",
    "type",
    "name",
    "used",
    "total",
    "bar",
    "reserved",
    "reason",
    "vgpus",
    "reserved_for",
    "sriov",
    "guests",
    "claims",
    "framebuffer",
)


class GuestsColumn(cliff_columns.FormattableColumn):
    """``instance (domain)`` lines in tables, one per guest by domain name
    (``x2`` when it holds two of the GPU's vGPUs); one object per vGPU, or
    null when libvirt could not say, in JSON/YAML."""

    def human_readable(self):
        if self._value is None:
            return "unknown"
        return "\n".join(status_screen.guest_lines(self._value))

    def machine_readable(self):
        if self._value is None:
            return None
        return [{"vgpu": g.vgpu, "instance": g.instance, "domain": g.domain} for g in self._value]


class ClaimsColumn(cliff_columns.FormattableColumn):
    """``instance: state`` lines in tables; objects in JSON/YAML."""

    def human_readable(self):
        return "\n".join(status_screen.claim_lines(self._value))

    def machine_readable(self):
        return [
            {"vgpu": c.vgpu, "instance": c.instance, "state": c.state, "stuck_for": c.stuck_for}
            for c in self._value
        ]


class TypesColumn(cliff_columns.FormattableColumn):
    """Each type's vGPUs (capacity, used, reserved, free), a line per type in
    tables, objects in JSON/YAML: counted in vGPUs on every GPU, so they
    add up where ``used``/``total`` (a mixed-size board's MiB) do not."""

    def human_readable(self):
        return "\n".join(status_screen.type_lines(self._value))

    def machine_readable(self):
        return [
            {
                "type": t.type_id,
                "capacity": t.capacity,
                "used": t.used,
                "reserved": t.reserved,
                "free": t.free,
            }
            for t in self._value
        ]


class ReservedForColumn(cliff_columns.FormattableColumn):
    """What the reserved units are held back for: ``kind: units`` lines in
    tables, ``{kind: units}`` (every kind, 0 when none) in JSON/YAML; units
    are the GPU's (``total``'s)."""

    def human_readable(self):
        kinds, unit = self._value
        return "\n".join(status_screen.reserved_lines(kinds, unit))

    def machine_readable(self):
        kinds, _unit = self._value
        held = dict(kinds)
        return {kind: held.get(kind, 0) for kind in inventory.RESERVED_FOR}


class SriovColumn(cliff_columns.FormattableColumn):
    """``enabled 16/16`` in tables, an object in JSON/YAML; blank and null
    on a GPU without SR-IOV."""

    def human_readable(self):
        if self._value is None:
            return ""
        return f"{self._value.state} {self._value.numvfs}/{self._value.totalvfs}"

    def machine_readable(self):
        if self._value is None:
            return None
        return {
            "state": self._value.state,
            "numvfs": self._value.numvfs,
            "totalvfs": self._value.totalvfs,
        }


class FramebufferColumn(cliff_columns.FormattableColumn):
    """A mixed-size board's map in tables (a character per slot, then which
    vGPU is where); an object in JSON/YAML; blank and null elsewhere."""

    def human_readable(self):
        return "\n".join(status_screen.map_lines(self._value))

    def machine_readable(self):
        found = self._value
        if found is None:
            return None
        if found.error:
            return {"error": found.error}
        return {
            "slots": found.slots,
            "slot_mib": framebuffer.SLOT_MIB,
            "unlocated": found.unlocated,
            "vgpus": [
                {
                    "mark": v.mark,
                    "type": v.type_id,
                    "placement": v.placement,
                    "mib": v.size * framebuffer.SLOT_MIB,
                }
                for v in found.vgpus
            ],
        }


def libvirt_users(app):
    """``({vgpu id: DomainRef}, None)``, or ``(None, why)`` without libvirt."""
    try:
        connected = app.domains()
    except libvirt_host.LibvirtUnavailable as exc:
        return None, str(exc)
    try:
        return dict(connected.mdev_users()), None
    finally:
        connected.disconnect()


@dataclasses.dataclass(frozen=True)
class Sources:
    """What ``status`` reads, each once, and the view it makes of them
    (``metrics`` shows the same reads)."""

    view: status.HostStatus
    warning: str | None  # why libvirt could not be asked, if it could not
    config: object  # the resolved MdevConfig
    snapshot: host_snapshot.HostSnapshot
    claims: list
    users: dict | None
    tree: inventory.ProviderTree
    reconciler: dict | None  # what the host reconciler last wrote
    now: float


def read_sources(app):
    """:class:`Sources`: every source read exactly once."""
    config = host_view.load_mdev_config(app)
    host = app.open_host()
    snapshot = discovery.discover(host)
    inventory.check_nodename(app.options.nodename, snapshot)  # before the journal opens
    journal = app.view_journal(snapshot)
    claim_list = journal.claims() if journal else []
    if journal:
        journal.close()
    users, warning = libvirt_users(app)
    boards = inventory.read_boards(host, snapshot, config)
    tree = inventory.compute(
        snapshot,
        config,
        app.options.nodename,
        status_assembly.in_use(claim_list, users),
        boards=boards,
        rooms=inventory.read_rooms(host, snapshot, config),
    )
    worker = reconciler_state.read(app.conf.vgpu.state_dir) if journal else None
    now = time.time()
    view = status_assembly.of_host(
        app.options.nodename,
        snapshot,
        tree,
        claim_list,
        users,
        worker,
        now,
        maps=framebuffer.map_boards(host, snapshot, tree, boards),
        configured=inventory.configured_types(snapshot, config),
    )
    return Sources(view, warning, config, snapshot, claim_list, users, tree, worker, now)


def row(gpu):
    return columns.optional(
        (
            gpu.provider,
            gpu.gpu,
            gpu.type_id,
            gpu.type_name,
            gpu.used,
            gpu.total,
            gpu.bar,
            gpu.reserved,
            gpu.reason,
            TypesColumn(gpu.types),
            ReservedForColumn((gpu.reserved_for, gpu.unit)),
            SriovColumn(gpu.sriov),
            GuestsColumn(gpu.guests),
            ClaimsColumn(gpu.claims),
            FramebufferColumn(gpu.board_map),
        )
    )


class ShowStatus(base.Lister):
    """One screen per host: each physical GPU, its use, guests and claims.

    Per GPU: its provider and type (the one nova.conf gives it, provider or
    not), used/total as a bar, reserved units and why (as ``inventory``
    says), each type's vGPUs (capacity, used, reserved, free: counted in
    vGPUs on every board, mixed-size ones too), the guests on it (instance and libvirt
    domain), claims in flight (any state but attached), on SR-IOV boards
    the VF state, and on a board serving mixed sizes the map of where its
    vGPUs sit on its framebuffer.  The table ends with one line about the
    host.
    On a screen narrower than the table (or with --max-width), each GPU is
    a block of lines instead, wrapped between words.
    Without libvirt, guests are unknown, ``used`` counts claims only, one
    ``warning:`` line on stderr says why, and the exit code is still 0.
    """

    def take_action(self, parsed_args):
        sources = read_sources(self.app)
        if sources.warning:
            self.app.stderr.write(f"warning: {sources.warning} Guests are shown as unknown.\n")
        unoffered = host_probe.unoffered_gpus(self.app.open_host(), sources.snapshot)
        if unoffered:
            self.app.stderr.write(f"warning: {unoffered}\n")
        self._view = sources.view
        return COLUMNS, [row(gpu) for gpu in sources.view.gpus]

    def produce_output(self, parsed_args, column_names, data):
        if parsed_args.formatter != "table":
            return super().produce_output(parsed_args, column_names, data)
        data = list(data)
        self.check_columns(parsed_args, column_names)
        selected = parsed_args.columns or column_names
        width = status_screen.screen_width(parsed_args, self.app.stdout)
        shown = [i for i, name in enumerate(column_names) if name in selected]
        table = ([column_names[i] for i in shown], [[r[i] for i in shown] for r in data])
        if width and data and status_screen.table_width(*table) > width:
            lines = status_screen.render(self._view.gpus, selected, width)
            self.app.stdout.write("".join(line + "\n" for line in lines))
            code = base.EXIT_OK
        else:
            code = super().produce_output(parsed_args, column_names, data)
        lines = status_screen.wrap_summary(self._view.summary(), width)
        self.app.stdout.write("".join(line + "\n" for line in lines))
        return code
