"""Which vGPUs an allocation gets: a decision over plain data, no I/O.

Given what one GPU holds now (:class:`GpuState`, read by a strategy), the
claims already held on it, the vGPUs domains use and how many units of which
type are asked for, :func:`plan_gpu` says which vGPUs to hand out: first the
instance's own claims (a retry gets the same vGPUs back), then free vGPUs of
the type, then new ones on parents with room, or it refuses with the typed
error and its counts.  The claims transaction and the writes that follow are
the manager's (:mod:`vgpu_driver.mdevs.manager`); keeping the decision apart
lets it be checked with data alone.

Choices are deterministic: free vGPUs and parents in the order the state
lists them (name order), the plan sorted by vGPU id.
"""

from __future__ import annotations

import collections.abc
import dataclasses
from collections.abc import Collection
from collections.abc import Container
from collections.abc import Iterable
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any
from typing import NoReturn

from vgpu_driver import claims
from vgpu_driver import exception
from vgpu_driver import inventory

if TYPE_CHECKING:
    from vgpu_driver.inventory import GpuProvider


@dataclasses.dataclass(frozen=True)
class Planned:
    """One vGPU an allocation hands out: reused, or to be created.

    For a vendor-VFIO VF, ``mdev_uuid`` and ``parent`` are both its address,
    and to create is to set its type.
    """

    mdev_uuid: str
    gpu: str
    parent: str
    type_id: str
    create: bool


@dataclasses.dataclass(frozen=True)
class ParentState:
    """One parent as read now: its vGPUs and its room for the type asked for."""

    name: str
    vgpus: tuple[tuple[str, str], ...]  # (vgpu id, type id); a typed VF: itself
    available: int


@dataclasses.dataclass(frozen=True)
class GpuState:
    """All the planning of one GPU needs, read and resolved beforehand.

    ``limit`` is the most vGPUs of the type the GPU can host (None: unknown),
    ``kind`` how its vGPUs of a type are named in a refusal, and
    ``new_vgpu_id(parent)`` the id a vGPU created on ``parent`` gets.
    """

    address: str
    parents: tuple[ParentState, ...]
    limit: int | None
    kind: str
    new_vgpu_id: collections.abc.Callable[[str], str]
    # A mixed-size board: vGPUs of other types share it, never in the way.
    mixes_types: bool = False


@dataclasses.dataclass(frozen=True)
class Request:
    """``units`` vGPUs of ``type_id`` on the GPU at ``gpu``."""

    gpu: str
    type_id: str
    units: int


def requests_of(
    instance: str,
    allocations: Mapping[str, Mapping[str, Any]],
    providers: Mapping[str, GpuProvider],
    mdev_classes: Collection[str],
    type_traits: Iterable[str] | None = None,
) -> list[Request]:
    """The :class:`Request` list of the vGPU classes in a Placement allocation.

    ``allocations`` is Placement's ``{rp_uuid: {"resources": {rc: n}}}``;
    ``providers`` maps rp UUIDs to this host's ``GpuProvider``.  An
    allocation of an mdev class on a provider that is not one of ours is
    refused, not ignored.  ``type_traits``: the type traits the instance's
    flavor requires, which name the type on a mixed-size board.
    """
    requests: list[Request] = []
    for rp_uuid, allocation in sorted(allocations.items()):
        resources = allocation.get("resources", {})
        units = sum(n for rc, n in resources.items() if rc in mdev_classes)
        if not units:
            continue
        provider = providers.get(rp_uuid)
        if provider is None:
            raise exception.UnknownProvider(instance=instance, provider=rp_uuid)
        units = resources.get(provider.resource_class, 0)
        if units and provider.mixed:
            request = mixed_size_request(instance, provider, units, type_traits)
            _check_size_class(instance, provider, request, resources)
            requests.append(request)
        elif units:
            requests.append(Request(provider.gpu, provider.type_id, units))
    return requests


def mixed_size_request(
    instance: str, provider: GpuProvider, mib: int, type_traits: Iterable[str] | None = None
) -> Request:
    """The :class:`Request` of ``mib`` framebuffer MiB on a mixed-size board.

    The type is the one of the board's that ``type_traits`` name; without
    them, the one type whose vGPU is exactly ``mib``.  Refused when no
    single type is named, or ``mib`` is not a whole number of its vGPUs.
    """
    sizes = dict(provider.sizes)
    wanted = set(type_traits or ())
    if any(trait.startswith(inventory.TYPE_ID_TRAIT_PREFIX) for trait in wanted):
        candidates = [t for t in sizes if wanted & set(inventory.type_traits(t, None))]
    else:
        candidates = [t for t, size in sizes.items() if size == mib]
    if len(candidates) != 1:
        raise exception.MixedSizeTypeUnknown(
            instance=instance,
            gpu=provider.gpu,
            mib=mib,
            types=", ".join(sizes),
            reason="the flavor requires several of its types"
            if candidates
            else "the flavor's required traits name none of its types, and none is of that size",
        )
    type_id = candidates[0]
    if mib % sizes[type_id]:
        raise exception.MixedSizeTypeUnknown(
            instance=instance,
            gpu=provider.gpu,
            mib=mib,
            types=", ".join(sizes),
            reason=f"it is not a whole number of {type_id} vGPUs ({sizes[type_id]} MiB)",
        )
    return Request(provider.gpu, type_id, mib // sizes[type_id])


def _check_size_class(
    instance: str, provider: GpuProvider, request: Request, resources: Mapping[str, int]
) -> None:
    """Refuse an allocation whose vGPUs of the type's size class are not
    the vGPUs its MiB make: the board's inventories would no longer add up.
    An allocation with none (a flavor made before the size classes) is
    taken; the inventory reserves what it does not count."""
    size_class = provider.size_class_of(request.type_id)
    count = resources.get(size_class, 0) if size_class else 0
    if count and count != request.units:
        raise exception.MixedSizeTypeUnknown(
            instance=instance,
            gpu=provider.gpu,
            mib=resources[provider.resource_class],
            types=", ".join(dict(provider.sizes)),
            reason=f"it asks {count} {size_class} for {request.units} {request.type_id} vGPUs",
        )


class _Referenced:
    """``uuid in referenced``: by a domain or a claim, without merging both."""

    def __init__(self, users: Container[str], claimed: Container[str]) -> None:
        self._users, self._claimed = users, claimed

    def __contains__(self, uuid: object) -> bool:
        return uuid in self._users or uuid in self._claimed


def plan_gpu(
    instance: str,
    request: Request,
    state: GpuState,
    claimed: Mapping[str, claims.Claim],
    users: Container[str],
) -> list[Planned]:
    """The vGPUs ``instance`` gets on one GPU, sorted by id.

    ``claimed`` is ``{vgpu id: Claim}`` holding at least every claim on the
    GPU and every claim of the instance; ``users`` the vGPU ids domains use
    (anything supporting ``in``).  Raises :class:`~exception.WrongTypePresent`
    or :class:`~exception.NoGpuCapacity` when the units cannot all be met.
    """
    type_id, units = request.type_id, request.units
    used = _Referenced(users, claimed)
    existing = {uuid for s in state.parents for uuid, _ in s.vgpus}
    # The instance's own claims, but not those going away: a vGPU whose
    # removal is in flight (the guest left this host and came back) is gone
    # as soon as the kernel lets go of it.
    mine = [
        c
        for c in claimed.values()
        if c.instance_uuid == instance and c.gpu == state.address and c.state != claims.RELEASING
    ]
    plan = [
        Planned(c.mdev_uuid, state.address, c.parent, c.type_id, create=c.mdev_uuid not in existing)
        for c in mine[:units]
    ]
    wanted = units - len(plan)
    free = [
        (s.name, uuid)
        for s in state.parents
        for uuid, t in s.vgpus
        if t == type_id and uuid not in used
    ]
    for parent, uuid in free[:wanted]:
        plan.append(Planned(uuid, state.address, parent, type_id, create=False))
    wanted -= min(wanted, len(free))
    if wanted:
        slots = creatable(state, type_id, claimed, existing)
        if len(slots) < wanted:
            _refuse(instance, state, type_id, units, len(free), len(slots), claimed, used)
        plan += [
            Planned(state.new_vgpu_id(parent), state.address, parent, type_id, create=True)
            for parent in slots[:wanted]
        ]
    # The same order on a retry, whatever was reused or created first time.
    return sorted(plan, key=lambda item: item.mdev_uuid)


def creatable(
    state: GpuState, type_id: str, claimed: Mapping[str, claims.Claim], existing: Container[str]
) -> list[str]:
    """Parents to create on, one entry per vGPU that still fits, in order.

    Claims whose vGPU is not created yet hold their place: the kernel's
    counts do not know about them.
    """
    pending: dict[str, int] = {}
    for claim in claimed.values():
        if claim.gpu == state.address and claim.mdev_uuid not in existing:
            pending[claim.parent] = pending.get(claim.parent, 0) + 1
    slots: list[str] = []
    for parent in state.parents:
        room = parent.available - pending.get(parent.name, 0)
        slots += [parent.name] * max(room, 0)
    if state.limit is not None:
        of_type = sum(1 for p in state.parents for _, t in p.vgpus if t == type_id)
        slots = slots[: max(state.limit - of_type - sum(pending.values()), 0)]
    return slots


def new_claims(
    plan: Iterable[Planned], claimed: Mapping[str, claims.Claim], instance: str
) -> list[Planned]:
    """The planned vGPUs ``instance`` does not hold a claim on yet: the
    claims an allocation adds, and the only ones its failure takes back."""
    held = {u for u, c in claimed.items() if c.instance_uuid == instance}
    return [item for item in plan if item.mdev_uuid not in held]


def _refuse(
    instance: str,
    state: GpuState,
    type_id: str,
    units: int,
    free: int,
    creatable: int,
    claimed: Mapping[str, claims.Claim],
    used: Container[str],
) -> NoReturn:
    """Raise the refusal that says why: other types in use, or no room."""
    others: dict[str, list[str]] = {}
    for parent in state.parents:
        for uuid, t in parent.vgpus:
            if t != type_id:
                others.setdefault(t, []).append(uuid)
    in_use = {t: [u for u in uuids if u in used] for t, uuids in others.items()}
    if not free and not creatable and any(in_use.values()) and not state.mixes_types:
        present = ", ".join(f"{len(u)} {state.kind} {t}" for t, u in sorted(in_use.items()) if u)
        raise exception.WrongTypePresent(
            instance=instance, gpu=state.address, type_id=type_id, present=present
        )
    pending = sum(1 for c in claimed.values() if c.gpu == state.address)
    raise exception.NoGpuCapacity(
        instance=instance,
        gpu=state.address,
        type_id=type_id,
        wanted=units,
        free=free,
        creatable=creatable,
        claimed=pending,
    )
