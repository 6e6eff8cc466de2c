"""The flavor extra specs that ask for vGPUs of a type this host serves."""

from vgpu_driver import exception
from vgpu_driver import framebuffer
from vgpu_driver import inventory
from vgpu_driver import size_classes
from vgpu_driver.cmd import base
from vgpu_driver.cmd import host_view


def flavor_spec(tree, type_id, count):
    """``{extra spec: value}`` of a flavor asking ``count`` vGPUs of
    ``type_id``, as this host's providers (``tree``) serve it: on a
    mixed-size board its MiB, its size class and its trait; elsewhere the
    type's class and trait.  None when no GPU of the host serves it."""
    trait = inventory.type_traits(type_id, None)[0]
    for provider in tree.providers:
        mib = dict(provider.sizes).get(type_id)
        if mib:
            return size_classes.flavor_spec(
                trait, mib // framebuffer.SLOT_MIB, mib, count, provider.resource_class
            )
        if not provider.mixed and provider.type_id == type_id:
            return size_classes.flavor_spec(trait, None, 1, count, provider.resource_class)
    return None


class FlavorSpec(base.Lister):
    """Print the extra specs of a flavor asking COUNT vGPUs of TYPE.

    One type per flavor: on a mixed-size board, its framebuffer MiB, as
    many units of its placement size's class as vGPUs, and its trait
    (``openstack flavor set FLAVOR --property KEY=VALUE`` for each row).
    """

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("type_id", metavar="TYPE", help="A type this host serves.")
        parser.add_argument(
            "count",
            metavar="COUNT",
            type=int,
            nargs="?",
            default=1,
            help="vGPUs per guest (default 1).",
        )
        return parser

    def take_action(self, parsed_args):
        if parsed_args.count < 1:
            raise exception.InvalidOption(
                option="COUNT", value=parsed_args.count, reason="a flavor asks at least one vGPU"
            )
        tree, _snapshot = host_view.desired_tree(self.app)
        specs = flavor_spec(tree, parsed_args.type_id, parsed_args.count)
        if specs is None:
            served = sorted(
                {t for p in tree.providers for t in (dict(p.sizes) if p.mixed else (p.type_id,))}
            )
            raise exception.InvalidOption(
                option="TYPE",
                value=parsed_args.type_id,
                reason=f"no GPU of this host serves it (served: {', '.join(served) or 'none'})",
            )
        return ("property", "value"), sorted(specs.items())
