"""Listings of what the host has: types, mdevs and the provider inventory."""

from vgpu_driver import discovery
from vgpu_driver import host_probe
from vgpu_driver import libvirt_host
from vgpu_driver import names
from vgpu_driver import size_classes
from vgpu_driver.cmd import base
from vgpu_driver.cmd import columns
from vgpu_driver.cmd import host_view


class ListTypes(base.Lister):
    """List the mdev types every parent offers, with their free instances."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("--parent", help="Only this parent (PCI address or name).")
        return parser

    def take_action(self, parsed_args):
        host = self.app.open_host()
        cols = ("parent", "type", "name", "available_instances", "device_api", "description")
        rows = []
        for parent in host.list_parents():
            rows += [
                (parent.name, t.type_id, t.name, t.available_instances, t.device_api, t.description)
                for t in parent.types
            ]
        for vf in host.list_vendor_vfio():
            rows += [
                (str(vf.address), names.vendor_type_id(number), name, 1, "vfio-pci", None)
                for number, name in vf.creatable
            ]
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
            rows.append(
                (vgpu.id, vgpu.parent, gpu.address if gpu else None, vgpu.type_id, instance, state)
            )
        return cols, [columns.optional(r) for r in rows]


def _types_text(provider):
    """A provider's type; a mixed-size board's types, each with its MiB."""
    if not provider.mixed:
        return provider.type_id
    return ", ".join(f"{type_id} ({mib} MiB)" for type_id, mib in provider.sizes)


def _size_classes(provider):
    """The size classes of the inventory Placement gets for ``provider``,
    smallest first: none but on a mixed-size board."""
    found = [
        (rc, record)
        for rc, record in provider.inventory().items()
        if rc != provider.resource_class and size_classes.is_size_class(rc)
    ]
    return tuple(sorted(found, key=lambda item: size_classes.mib_of(item[0])))


class ShowInventory(base.Lister):
    """Show the provider each physical GPU gets, as it would be reported.

    A mixed-size board's provider has, beside its framebuffer class, one
    class per placement size (``size_classes``), as Placement lists them.
    """

    def take_action(self, parsed_args):
        tree, snapshot = host_view.desired_tree(self.app)
        unoffered = host_probe.unoffered_gpus(self.app.open_host(), snapshot)
        if unoffered:
            self.app.stderr.write(f"warning: {unoffered}\n")
        cols = (
            "provider",
            "parent_provider",
            "gpu",
            "type",
            "resource_class",
            "total",
            "reserved",
            "max_unit",
            "traits",
            "reason",
            "size_classes",
        )
        rows = [
            (
                p.name,
                p.parent_provider,
                p.gpu,
                _types_text(p),
                p.resource_class,
                p.total,
                p.reserved,
                p.max_unit,
                columns.ListColumn(p.traits),
                p.reason,
                columns.SizeClassesColumn(_size_classes(p)),
            )
            for p in tree.providers
        ]
        rows += [
            (
                None,
                tree.root_name,
                gpu,
                None,
                None,
                0,
                0,
                0,
                columns.ListColumn(()),
                f"no provider: {why}",
                columns.SizeClassesColumn(()),
            )
            for gpu, why in tree.unserved
        ]
        return cols, [columns.optional(r) for r in sorted(rows, key=lambda r: r[2])]
