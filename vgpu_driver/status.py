"""One view of a host's GPUs, assembled from what was already read (no I/O).

Operators want one screen that says, per physical GPU, what it serves, how
full it is, why some of it is held back, who uses it and what is on its way
in or out.  Each source is read once by the caller (a discovery snapshot,
the provider tree :func:`vgpu_driver.inventory.compute` made of it, the
journal's claims, libvirt's ``{vgpu id: DomainRef}``); this module only puts
them side by side, so the view cannot disagree with ``inventory``,
``claims list`` or ``mdev list``.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Collection
from collections.abc import Iterable
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

from vgpu_driver import claims
from vgpu_driver import reconciler_state
from vgpu_driver import size_classes
from vgpu_driver import sriov
from vgpu_driver.framebuffer import SLOT_MIB

if TYPE_CHECKING:
    from vgpu_driver.discovery import HostSnapshot
    from vgpu_driver.domains import DomainRef
    from vgpu_driver.framebuffer import BoardMap
    from vgpu_driver.inventory import GpuProvider
    from vgpu_driver.inventory import ProviderTree

BAR_WIDTH = 10
MIB = "MiB"


@dataclasses.dataclass(frozen=True)
class Guest:
    """A guest holding one of the GPU's vGPUs (the domain's UUID is nova's
    instance UUID)."""

    vgpu: str
    instance: str
    domain: str


@dataclasses.dataclass(frozen=True)
class ClaimInFlight:
    """A journal claim not yet (or no longer) attached to its guest."""

    vgpu: str
    instance: str
    state: str
    # Seconds the kernel has blocked this vGPU's removal (None: not stuck).
    stuck_for: float | None = None


@dataclasses.dataclass(frozen=True)
class SriovState:
    state: str  # off, enabled, partial (see vgpu_driver.sriov)
    numvfs: int
    totalvfs: int


@dataclasses.dataclass(frozen=True)
class TypeCount:
    """One type's vGPUs on one GPU, counted in vGPUs whatever unit the GPU's
    provider counts in, so that counts of every GPU and type add up."""

    type_id: str
    capacity: int  # vGPUs of the type the GPU offers (alone, on a mixed-size board)
    used: int  # vGPUs of the type that guests or claims hold there
    reserved: int  # vGPUs of the type held back (see the GPU's reserved_for)

    @property
    def free(self) -> int:
        """vGPUs of the type Placement may still hand out on the GPU."""
        return max(self.capacity - self.reserved - self.used, 0)


@dataclasses.dataclass(frozen=True)
class GpuStatus:
    gpu: str
    provider: str | None
    type_id: str | None
    type_name: str | None
    used: int
    total: int
    reserved: int
    reason: str | None
    sriov: SriovState | None
    # None when libvirt could not be asked: who uses the GPU is unknown.
    guests: tuple[Guest, ...] | None
    claims: tuple[ClaimInFlight, ...]
    # What used, total and reserved count: vGPUs, or on a mixed-size board
    # framebuffer MiB (its inventory's unit).
    unit: str = "vGPUs"
    # A mixed-size board's framebuffer.BoardMap: where its vGPUs sit.
    board_map: BoardMap | None = None
    # Per type, in vGPUs: the provider's type(s) or, with no provider, those
    # nova.conf gives the GPU, then any other type of a vGPU held there.
    types: tuple[TypeCount, ...] = ()
    # ``((kind, units), ...)``: what the reserved units are held back for
    # (:data:`vgpu_driver.inventory.RESERVED_FOR`), in ``unit``.
    reserved_for: tuple[tuple[str, int], ...] = ()

    @property
    def bar(self) -> str:
        return bar(self.used, self.total)

    @property
    def mixed(self) -> bool:
        return self.unit == MIB


@dataclasses.dataclass(frozen=True)
class HostStatus:
    nodename: str
    gpus: tuple[GpuStatus, ...]
    reconciler: str | None = None  # one line about the host reconciler

    @property
    def guests_known(self) -> bool:
        return all(g.guests is not None for g in self.gpus)

    def summary(self) -> str:
        """One line about the whole host."""
        served = [g for g in self.gpus if g.provider]
        counted = [g for g in self.gpus if not g.mixed]
        used = sum(g.used for g in counted)
        total = sum(g.total for g in served if not g.mixed)
        reserved = sum(g.reserved for g in served if not g.mixed)
        in_flight = sum(len(g.claims) for g in self.gpus)
        if self.guests_known:
            instances = {guest.instance for g in self.gpus for guest in g.guests}  # type: ignore[union-attr]  # all known
            guests = f"{len(instances)} guest(s)"
        else:
            guests = "guests unknown (libvirt unreachable)"
        line = (
            f"{self.nodename}: {len(self.gpus)} GPU(s), {len(served)} with a provider; "
            f"vGPUs {bar(used, total)} used, {reserved} reserved; {guests}; "
            f"{in_flight} claim(s) in flight"
        )
        mixed = [g for g in served if g.mixed]
        if mixed:
            framebuffer = bar(sum(g.used for g in mixed), sum(g.total for g in mixed))
            line += (
                f"; mixed-size framebuffer {framebuffer} {MIB} used, "
                f"{sum(g.reserved for g in mixed)} {MIB} reserved"
            )
        sriov = [g.sriov for g in self.gpus if g.sriov]
        if sriov:
            enabled = sum(1 for s in sriov if s.state != "off")
            line += f"; SR-IOV on {enabled} of {len(sriov)} board(s)"
        if self.reconciler:
            line += "\n" + self.reconciler
        return line


def bar(used: int, total: int, width: int = BAR_WIDTH) -> str:
    """``[#####.....] 5/10``: one ``#`` per used tenth, at least one when any
    is used and at least one ``.`` while any is free; full when over."""
    if total <= 0:
        filled = width if used else 0
    else:
        filled = round(width * min(used, total) / total)
        if used and not filled:
            filled = 1
        elif used < total and filled == width:
            filled = width - 1
    return f"[{'#' * filled}{'.' * (width - filled)}] {used}/{total}"


def in_use(claim_list: Iterable[claims.Claim], users: Collection[str] | None) -> set[str] | None:
    """vGPU ids claims or guests reference, as ``inventory`` tells a draining
    GPU from a blocked one; None when the guests are unknown."""
    if users is None:
        return None
    return {c.mdev_uuid for c in claim_list} | set(users)


def _vgpus_by_gpu(
    snapshot: HostSnapshot, claim_list: Iterable[claims.Claim]
) -> dict[str, set[str]]:
    """``{gpu address: vgpu ids}``: those that exist there, and those a claim
    places there (a claim may come before its mdev)."""
    found: dict[str, set[str]] = {gpu.address: set() for gpu in snapshot.gpus}
    for vgpu in snapshot.vgpus:
        gpu = snapshot.gpu_of_parent(vgpu.parent)
        if gpu is not None:
            found[gpu.address].add(vgpu.id)
    for claim in claim_list:
        found.setdefault(claim.gpu, set()).add(claim.mdev_uuid)
    return found


def type_counts(
    provider: GpuProvider | None, configured: Iterable[str], held: Iterable[str]
) -> tuple[TypeCount, ...]:
    """The :class:`TypeCount` of each type of one GPU.

    ``held`` is the type of each vGPU guests or claims hold on it.  A vGPU
    counts under its own type, so a GPU draining from one type to another counts the old type's
    vGPUs as used of the old type (which it no longer offers).  On a
    mixed-size board a type's counts are its size class's
    (:func:`_mixed_size_room`), the rest reserved.
    """
    counted = collections.Counter(held)
    if provider is None:
        offered = list(configured)
    elif provider.mixed:
        offered = [type_id for type_id, _mib in provider.sizes]
    else:
        offered = [provider.type_id]
    found: dict[str, TypeCount] = {}
    for type_id in offered:
        mine = counted.get(type_id, 0)
        if provider is None:
            capacity = reserved = 0
        elif provider.mixed:
            capacity, free = _mixed_size_room(provider, type_id)
            reserved = max(capacity - mine - free, 0)
        else:
            capacity, reserved = provider.total, provider.reserved
        found[type_id] = TypeCount(type_id, capacity, mine, reserved)
    for type_id, mine in sorted(counted.items()):
        if type_id not in found:
            found[type_id] = TypeCount(type_id, 0, mine, 0)
    return tuple(found.values())


def _mixed_size_room(provider: GpuProvider, type_id: str) -> tuple[int, int]:
    """``(capacity, free)`` of a type on a mixed-size board, from the
    inventory of its size class (:mod:`vgpu_driver.size_classes`): the most
    vGPUs of its size the board holds, and what Placement grants of them
    now (disjoint creatable placements, at most one per free VF), so that
    the views say what the scheduler does, not what the free MiB would
    hold if they did not fragment."""
    mib = provider.units_of(type_id)
    found = dict(provider.size_inventories).get(size_classes.class_name(mib // SLOT_MIB))
    if found is None:
        return provider.total // mib, 0
    return found.total, found.available


def _sriov_state(function: sriov.PhysicalFunction | None) -> SriovState | None:
    if function is None:
        return None
    return SriovState(function.state, function.numvfs, function.totalvfs)


def assemble(
    nodename: str,
    snapshot: HostSnapshot,
    tree: ProviderTree,
    claim_list: Collection[claims.Claim],
    users: Mapping[str, DomainRef] | None,
    functions: Iterable[sriov.PhysicalFunction] = (),
    stuck: Mapping[str, float] | None = None,
    reconciler: str | None = None,
    maps: Mapping[str, BoardMap] | None = None,
    configured: Mapping[str, tuple[str, ...]] | None = None,
) -> HostStatus:
    """The :class:`HostStatus` of one host.

    ``tree`` is the :class:`~vgpu_driver.inventory.ProviderTree` computed
    from ``snapshot``; ``users`` is ``{vgpu id: DomainRef}`` or None when
    libvirt could not be reached (then ``used`` counts claims only);
    ``functions`` are :func:`vgpu_driver.sriov.functions_in` of the snapshot;
    ``stuck`` is ``{vgpu id: seconds}`` of removals the kernel blocks,
    ``reconciler`` a line about the host reconciler
    (:mod:`vgpu_driver.host_reconciler`), and ``maps`` is the
    :class:`~vgpu_driver.framebuffer.BoardMap` of each mixed-size board;
    ``configured`` is ``{gpu address: (type id, ...)}`` nova.conf gives
    (:func:`vgpu_driver.inventory.configured_types`): a GPU with no
    provider still shows the type it is configured for.
    """
    stuck = stuck or {}
    configured = configured or {}
    maps = maps or {}
    unserved = dict(tree.unserved)
    sriov = {f.address: f for f in functions}
    vgpus = _vgpus_by_gpu(snapshot, claim_list)
    claimed = {c.mdev_uuid for c in claim_list}
    type_of = {v.id: v.type_id for v in snapshot.vgpus} | {
        c.mdev_uuid: c.type_id for c in claim_list
    }
    rows: list[GpuStatus] = []
    for gpu in snapshot.gpus:
        ids = sorted(vgpus[gpu.address])
        provider = tree.by_gpu(gpu.address)
        guests: tuple[Guest, ...] | None = None
        if users is not None:
            guests = tuple(Guest(i, users[i].uuid, users[i].name) for i in ids if i in users)
        in_flight = tuple(
            sorted(
                (
                    ClaimInFlight(c.mdev_uuid, c.instance_uuid, c.state, stuck.get(c.mdev_uuid))
                    for c in claim_list
                    if c.gpu == gpu.address and c.state != claims.ATTACHED
                ),
                key=lambda c: (c.instance, c.vgpu),
            )
        )
        held = [i for i in ids if i in claimed or (users is not None and i in users)]
        used = sum(provider.units_of(type_of.get(i)) if provider else 1 for i in held)
        rows.append(
            GpuStatus(
                gpu=gpu.address,
                provider=provider.name if provider else None,
                type_id=(
                    provider.type_id
                    if provider
                    else ",".join(configured.get(gpu.address, ())) or None
                ),
                type_name=(
                    f"mixed sizes, in {MIB}"
                    if provider and provider.mixed
                    else provider.type_name
                    if provider
                    else None
                ),
                used=used,
                total=provider.total if provider else 0,
                reserved=provider.reserved if provider else 0,
                reason=(
                    provider.reason
                    if provider
                    else f"no provider: {unserved.get(gpu.address, 'unknown')}"
                ),
                sriov=_sriov_state(sriov.get(gpu.address)),
                guests=guests,
                claims=in_flight,
                unit=MIB if provider and provider.mixed else "vGPUs",
                board_map=maps.get(gpu.address),
                types=type_counts(
                    provider,
                    configured.get(gpu.address, ()),
                    [type_of[i] for i in held if type_of.get(i)],
                ),
                reserved_for=provider.reserved_for if provider else (),
            )
        )
    return HostStatus(nodename=nodename, gpus=tuple(rows), reconciler=reconciler)


def of_host(
    nodename: str,
    snapshot: HostSnapshot,
    tree: ProviderTree,
    claim_list: Collection[claims.Claim],
    users: Mapping[str, DomainRef] | None,
    reconciler: Any,
    now: float,
    maps: Mapping[str, BoardMap] | None = None,
    configured: Mapping[str, tuple[str, ...]] | None = None,
) -> HostStatus:
    """:func:`assemble` with the SR-IOV functions of ``snapshot`` and what
    the host reconciler's ``reconciler`` state (as it writes it) says at
    ``now``: ``status`` and the metrics build the same view this way (``maps``
    and ``configured``: see :func:`assemble`)."""
    return assemble(
        nodename,
        snapshot,
        tree,
        claim_list,
        users,
        sriov.functions_in(snapshot),
        stuck=reconciler_state.removals_in_flight(reconciler, now),
        reconciler=reconciler_state.describe(reconciler, now),
        maps=maps,
        configured=configured,
    )
