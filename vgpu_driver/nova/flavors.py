"""Whether the vGPUs of an allocation are those the instance's flavor asks for.

nova keeps an instance's flavor and its Placement allocation in step, but
for two cases.  A resize whose finish fails on the destination gives the
instance its old flavor back and leaves it there, holding the *new* flavor's
allocation (so that a hard reboot can recover it there).  A revert that
fails after nova's API has put the old flavor back in the instance's request
spec leaves the instance on the new flavor, and its next unshelve is
scheduled, and allocated, for the old one.  Defining the guest from such an
allocation would give it vGPUs its flavor does not ask for; the driver
refuses instead, whichever operation defines it.

The first case is nova's recovery, not a mistake: nova tells the operator
to hard reboot the guest, which it left in ERROR on the destination, and
the allocation there is the resize's, made for its new flavor.  Such a
guest is judged by either flavor (:func:`judge`): a new flavor asking for
no type accepts the vGPUs of any.

Only what names a vGPU is compared: the units of each mdev resource class,
and the traits that name a vGPU type, the automatic ones every GPU provider
carries (``CUSTOM_VGPU_<name>``, ``CUSTOM_MDEV_<type>``; see
:func:`vgpu_driver.inventory.type_traits`).
"""

import re

from nova.compute import vm_states

# nova's request group keys in flavor extra specs: resources[<suffix>]:<class>
# and trait[<suffix>]:<name> (nova.scheduler.utils.ResourceRequest.XS_KEYPAT).
_GROUP_KEY = re.compile(r"^(resources|trait)([a-zA-Z0-9_-]{1,64})?:(.+)$")
TYPE_TRAIT_PREFIXES = ("CUSTOM_VGPU_", "CUSTOM_MDEV_")


def vgpu_groups(extra_specs, classes):
    """The flavor's request groups asking for vGPUs, each as ``(units by
    class, required type traits, forbidden type traits)``."""
    groups = {}
    for key, value in extra_specs.items():
        match = _GROUP_KEY.match(key)
        if match is None:
            continue
        kind, suffix, name = match.groups()
        units, required, forbidden = groups.setdefault(suffix, ({}, set(), set()))
        if kind == "resources" and name in classes:
            units[name] = int(value)
        elif kind == "trait" and name.startswith(TYPE_TRAIT_PREFIXES):
            if value == "required":
                required.add(name)
            elif value == "forbidden":
                forbidden.add(name)
    return [group for group in groups.values() if any(group[0].values())]


def required_type_traits(extra_specs):
    """The type traits the flavor requires, in any request group."""
    found = set()
    for key, value in extra_specs.items():
        match = _GROUP_KEY.match(key)
        if (
            match
            and match[1] == "trait"
            and match[3].startswith(TYPE_TRAIT_PREFIXES)
            and value == "required"
        ):
            found.add(match[3])
    return frozenset(found)


def mismatch(extra_specs, allocations, providers, classes):
    """Why the vGPUs ``allocations`` holds are not the flavor's; None if they are.

    ``allocations`` is Placement's ``{rp uuid: {"resources": {class: n}}}``;
    ``providers`` maps this host's GPU providers' rp UUIDs to their
    ``GpuProvider``; ``classes`` are the mdev resource classes.
    """
    groups = vgpu_groups(extra_specs, classes)
    held = [
        (providers.get(rp), rc, n)
        for rp, allocation in sorted(allocations.items())
        for rc, n in allocation.get("resources", {}).items()
        if rc in classes and n
    ]
    for rc in sorted(classes):
        wanted = sum(units.get(rc, 0) for units, _req, _forb in groups)
        got = sum(n for _p, held_rc, n in held if held_rc == rc)
        if wanted != got:
            return f"the flavor asks for {wanted} {rc}, the allocation holds {got}"
    for provider, rc, _n in held:
        if provider is None:
            continue  # not one of ours: the allocation itself is refused
        traits = set(provider.traits)
        if not any(
            rc in units and required <= traits and not forbidden & traits
            for units, required, forbidden in groups
        ):
            return (
                f"the allocation holds {provider.type_name or provider.type_id} vGPUs "
                f"on {provider.name}, a type the flavor does not ask for"
            )
    return None


def judged_flavors(instance):
    """The flavors an allocation of the instance may be for: its own and,
    for a guest in ERROR with a resize's new flavor still set (a finish
    that failed, nova's flavor put back), that new flavor."""
    found = [instance.flavor]
    new = instance.new_flavor if instance.vm_state == vm_states.ERROR else None
    if new is not None and new.flavorid != instance.flavor.flavorid:
        found.append(new)
    return found


def judge(instance, allocations, providers, classes):
    """``(extra specs, None)`` of the first flavor of the instance's
    (:func:`judged_flavors`) whose vGPUs ``allocations`` holds, else
    ``(None, why)`` for its own flavor (see :func:`mismatch`)."""
    whys = []
    for flavor in judged_flavors(instance):
        why = mismatch(flavor.extra_specs, allocations, providers, classes)
        if why is None:
            return flavor.extra_specs, None
        whys.append(why)
    return None, whys[0]
