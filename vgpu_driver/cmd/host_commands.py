"""Listings of what the host has: types, mdevs and the provider inventory."""


from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import host_probe
from vgpu_driver import inventory
from vgpu_driver import libvirt_host
from vgpu_driver import names
from vgpu_driver.cmd import base
from vgpu_driver.cmd import columns
from vgpu_driver.conf import mdev_types


class ListTypes(base.Lister):
    """List the mdev types every parent offers, with their free instances."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("--parent", help="Only this parent (PCI address or name).")
        return parser

    def take_action(self, parsed_args):
        host = self.app.open_host()
        cols = ("parent", "type", "name", "available_instances", "device_api",
                "description")
        rows = []
        for parent in host.list_parents():
            rows += [(parent.name, t.type_id, t.name, t.available_instances, t.device_api,
                      t.description) for t in parent.types]
        for vf in host.list_vendor_vfio():
            rows += [(str(vf.address), names.vendor_type_id(number), name, 1, "vfio-pci", None)
                     for number, name in vf.creatable]
        if parsed_args.parent:
            rows = [r for r in rows if r[0] == parsed_args.parent.lower()]
        return cols, [columns.optional(r) for r in sorted(rows, key=lambda r: (r[0], r[1]))]


class ListMdevs(base.Lister):
    """List existing vGPUs: parent, physical GPU, type, and who holds each.

    A vGPU is an mdev or, on NVIDIA's vendor-specific VFIO framework, a VF
    set to a type (its uuid is then the VF's address, as is its parent).
    ``state`` is the claim's (claimed, attached, migrating_in, releasing),
    ``in-use`` for a guest's vGPU nobody claimed, or ``free``.  Guests come
    from libvirt; when it cannot be reached, only claims are shown and an
    unclaimed vGPU is ``unknown``.
    """

    def take_action(self, parsed_args):
        snapshot = discovery.discover(self.app.open_host())
        journal = self.app.view_journal(snapshot)
        claimed = {c.mdev_uuid: c for c in journal.claims()} if journal else {}
        try:
            users = self.app.domains().mdev_users()
            unclaimed = "free"
        except libvirt_host.LibvirtUnavailable as exc:
            self.app.LOG.warning("%s", exc)
            users, unclaimed = {}, "unknown"
        cols = ("uuid", "parent", "gpu", "type", "instance", "state")
        rows = []
        for vgpu in snapshot.vgpus:
            gpu = snapshot.gpu_of_parent(vgpu.parent)
            claim, user = claimed.get(vgpu.id), users.get(vgpu.id)
            instance = user.uuid if user else claim.instance_uuid if claim else None
            state = claim.state if claim else "in-use" if user else unclaimed
            rows.append((vgpu.id, vgpu.parent, gpu.address if gpu else None,
                         vgpu.type_id, instance, state))
        return cols, [columns.optional(r) for r in rows]


def load_mdev_config(app):
    config, problems = mdev_types.load(app.conf)
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise exception.InvalidConfiguration(errors)
    for problem in problems:
        app.LOG.warning("%s", problem)
    return config


def in_use(app, snapshot, view=False):
    """vGPU ids (mdev UUIDs, VF addresses) guests or claims reference, or None
    when libvirt is unreachable.  ``view``: a read-only view, which works
    without a journal (see ``view_journal``)."""
    journal = app.view_journal(snapshot) if view else app.journal(snapshot)
    claimed = {c.mdev_uuid for c in journal.claims()} if journal else set()
    try:
        return claimed | set(app.domains().mdev_users())
    except libvirt_host.LibvirtUnavailable as exc:
        app.LOG.warning("%s", exc)
        return None


def desired_tree(app, sync=None):
    """``(ProviderTree, snapshot)``: the providers this host's GPUs should have.

    With ``sync`` (a ProviderSync), claims Placement does not count are
    reserved, as nova-compute reserves them.
    """
    config = load_mdev_config(app)
    host = app.open_host()
    snapshot = discovery.discover(host)
    boards = inventory.read_boards(host, snapshot, config)
    unallocated = _claims_placement_lacks(app, snapshot, sync, boards) if sync else None
    return (inventory.compute(snapshot, config, app.options.nodename,
                              in_use(app, snapshot, view=sync is None), unallocated, boards),
            snapshot)


def _claims_placement_lacks(app, snapshot, sync, boards):
    journal = app.journal(snapshot)
    claim_list = journal.claims() if journal else []
    if not claim_list:
        return {}
    nodename = app.options.nodename
    sync.observe(inventory.ProviderTree(root_name=nodename, providers=()))
    return inventory.claims_placement_lacks(
        claim_list, nodename,
        lambda name: sync.allocations(name) if name in sync.known else {},
        inventory.claim_units(boards))


def _types_text(provider):
    """A provider's type; a mixed-size board's types, each with its MiB."""
    if not provider.mixed:
        return provider.type_id
    return ", ".join(f"{type_id} ({mib} MiB)" for type_id, mib in provider.sizes)


class ShowInventory(base.Lister):
    """Show the provider each physical GPU gets, as it would be reported."""

    def take_action(self, parsed_args):
        tree, snapshot = desired_tree(self.app)
        unoffered = host_probe.unoffered_gpus(self.app.open_host(), snapshot)
        if unoffered:
            self.app.stderr.write(f"warning: {unoffered}\n")
        cols = ("provider", "parent_provider", "gpu", "type", "resource_class", "total",
                "reserved", "max_unit", "traits", "reason")
        rows = [(p.name, p.parent_provider, p.gpu, _types_text(p), p.resource_class, p.total,
                 p.reserved, p.max_unit, columns.ListColumn(p.traits), p.reason)
                for p in tree.providers]
        rows += [(None, tree.root_name, gpu, None, None, 0, 0, 0, columns.ListColumn(()),
                  f"no provider: {why}") for gpu, why in tree.unserved]
        return cols, [columns.optional(r) for r in sorted(rows, key=lambda r: r[2])]
