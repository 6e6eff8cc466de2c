"""The view of ``vgpu-manage status``, assembled from what was already read
(no I/O).

Each source is read once by the caller (a discovery snapshot, the provider
tree :func:`vgpu_driver.inventory.compute` made of it, the journal's claims,
libvirt's ``{vgpu id: DomainRef}``); this module only puts them side by
side as a :class:`~vgpu_driver.status.HostStatus`, so the view cannot
disagree with ``inventory``, ``claims list`` or ``mdev list``.
"""

from __future__ import annotations

from collections.abc import Collection
from collections.abc import Iterable
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

from vgpu_driver import claims
from vgpu_driver import reconciler_state
from vgpu_driver import sriov_functions
from vgpu_driver.status import MIB
from vgpu_driver.status import ClaimInFlight
from vgpu_driver.status import GpuStatus
from vgpu_driver.status import Guest
from vgpu_driver.status import HostStatus
from vgpu_driver.status import SriovState
from vgpu_driver.status_type_counts import type_counts

if TYPE_CHECKING:
    from vgpu_driver.domains import DomainRef
    from vgpu_driver.framebuffer import BoardMap
    from vgpu_driver.host_snapshot import HostSnapshot
    from vgpu_driver.inventory import ProviderTree


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


def _sriov_state(function: sriov_functions.PhysicalFunction | None) -> SriovState | None:
    if function is None:
        return None
    return SriovState(function.state, function.numvfs, function.totalvfs)


def assemble(
    nodename: str,
    snapshot: HostSnapshot,
    tree: ProviderTree,
    claim_list: Collection[claims.Claim],
    users: Mapping[str, DomainRef] | None,
    functions: Iterable[sriov_functions.PhysicalFunction] = (),
    stuck: Mapping[str, float] | None = None,
    reconciler: str | None = None,
    maps: Mapping[str, BoardMap] | None = None,
    configured: Mapping[str, tuple[str, ...]] | None = None,
) -> HostStatus:
    """The :class:`HostStatus` of one host.

    ``tree`` is the :class:`~vgpu_driver.inventory.ProviderTree` computed
    from ``snapshot``; ``users`` is ``{vgpu id: DomainRef}`` or None when
    libvirt could not be reached (then ``used`` counts claims only);
    ``functions`` are :func:`vgpu_driver.sriov_functions.functions_in` of the snapshot;
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
                    f"type pool, in {MIB}"
                    if provider and provider.pool
                    else f"mixed sizes, in {MIB}"
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
        sriov_functions.functions_in(snapshot),
        stuck=reconciler_state.removals_in_flight(reconciler, now),
        reconciler=reconciler_state.describe(reconciler, now),
        maps=maps,
        configured=configured,
    )
