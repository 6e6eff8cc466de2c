"""Compare the host's truth with Placement's, and list every difference.

* ``allocation-without-mdev``: Placement allocates vGPUs of a GPU to a
  consumer that holds fewer mdevs on that GPU here (a move's allocation
  counts as its instance's, see :func:`audit`);
* ``mdev-without-allocation``: a guest (domain or claim) holds mdevs of a GPU
  that Placement does not allocate to it;
* ``stale-provider``: a provider of this host whose GPU is gone;
* ``missing-provider``: a GPU that should have a provider and has none;
* ``inventory`` / ``traits``: a provider's inventory or managed traits differ
  from what the host computes;
* ``name-clash``: the provider named as this host's root, or as one of its
  GPU providers, is not vgpu-driver's (another provider's child, another
  tree's, or another owner's); ``sync`` refuses to write it, and it is left
  for an operator to sort out.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

from vgpu_driver import claims
from vgpu_driver import placement
from vgpu_driver import state_files

if TYPE_CHECKING:
    from vgpu_driver.domains import DomainRef
    from vgpu_driver.host_snapshot import HostSnapshot
    from vgpu_driver.inventory import GpuProvider
    from vgpu_driver.inventory import ProviderTree
    from vgpu_driver.placement.sync import ProviderSync

HELD_STATES = (claims.CLAIMED, claims.ATTACHED, claims.MIGRATING_IN)
KINDS = (
    "allocation-without-mdev",
    "mdev-without-allocation",
    "stale-provider",
    "missing-provider",
    "inventory",
    "traits",
    "name-clash",
)
# What the last audit found, in the state directory, for ``vgpu-manage metrics``.
RECORD_FILE = "audit.json"


@dataclasses.dataclass(frozen=True)
class Drift:
    kind: str
    provider: str
    gpu: str | None
    consumer: str | None
    detail: str


def host_usage(
    snapshot: HostSnapshot,
    claim_list: Iterable[claims.Claim],
    domain_users: Mapping[str, DomainRef],
    providers: Mapping[str, GpuProvider] | None = None,
) -> collections.Counter[tuple[str, str]]:
    """``{(gpu, consumer): units}`` from claims and guests' domains: what a
    vGPU counts for in its GPU's provider of ``providers`` (``{gpu:
    GpuProvider}``; one each without), framebuffer MiB on a mixed-size board.

    A vGPU is an mdev or a vendor-VFIO VF set to a type; a domain's other
    PCI hostdevs are no vGPU of any GPU here, and not counted.
    """
    gpu_of: dict[str, str] = {}
    type_of: dict[str, str] = {}
    for vgpu in snapshot.vgpus:
        gpu = snapshot.gpu_of_parent(vgpu.parent)
        if gpu is not None:
            gpu_of[vgpu.id], type_of[vgpu.id] = gpu.address, vgpu.type_id
    holders: dict[str, tuple[str, str]] = {}
    for claim in claim_list:
        if claim.state in HELD_STATES:
            holders[claim.mdev_uuid] = (claim.gpu, claim.instance_uuid)
            type_of[claim.mdev_uuid] = claim.type_id
    for mdev, ref in domain_users.items():
        if mdev not in holders and mdev in gpu_of:
            holders[mdev] = (gpu_of[mdev], ref.uuid)
    usage: collections.Counter[tuple[str, str]] = collections.Counter()
    for mdev, (address, consumer) in holders.items():
        provider = (providers or {}).get(address)
        usage[address, consumer] += provider.units_of(type_of.get(mdev)) if provider else 1
    return usage


def _inventory_detail(
    have: Mapping[str, Mapping[str, Any]], want: Mapping[str, Mapping[str, Any]]
) -> str:
    def short(inventories: Mapping[str, Mapping[str, Any]]) -> str:
        return (
            ", ".join(
                f"{rc} total={i['total']} reserved={i['reserved']}"
                for rc, i in sorted(inventories.items())
            )
            or "none"
        )

    return f"Placement has {short(have)}; the host computes {short(want)}"


def audit(
    sync: ProviderSync,
    tree: ProviderTree,
    snapshot: HostSnapshot,
    claim_list: Iterable[claims.Claim],
    domain_users: Mapping[str, DomainRef],
    moves: Callable[[], Mapping[str, str]] | None = None,
) -> list[Drift]:
    """Every difference between the host and Placement, as Drift rows.

    ``moves`` gives ``{migration uuid: instance uuid}`` of nova's moves
    under way on this host (:func:`vgpu_driver.compute_api.moves_on`); it
    is called once, and only when some allocation differs from what the
    host holds (asking nova costs a request, and needs its admin role).
    nova holds the source allocation of a resize or migration awaiting
    confirmation under the migration's UUID, while the guest keeps its
    vGPUs here under its own: those units count as the instance's.
    """
    sync.observe(tree)
    clashes = {c.name: c for c in sync.clashes(tree)}
    drifts = [
        Drift("name-clash", c.name, getattr(tree.provider(c.name), "gpu", None), None, c.detail())
        for c in clashes.values()
    ]
    if tree.root_name in clashes:
        return drifts  # no tree of this host to compare with
    desired = {p.name: p for p in tree.providers if p.name not in clashes}
    for name, held in sorted(sync.known.items()):
        if sync.root_uuid is not None and placement.is_vanished_gpu_provider(
            tree, name, held.parent_uuid, sync.root_uuid, held.inventories, held.traits
        ):
            drifts.append(
                Drift(
                    "stale-provider",
                    name,
                    None,
                    None,
                    "no GPU of this host has this provider's name any more",
                )
            )
    usage = host_usage(snapshot, claim_list, domain_users, {p.gpu: p for p in tree.providers})
    # (position in drifts, provider, its allocations)
    compared: list[tuple[int, GpuProvider, dict[str, dict[str, int]]]] = []
    for name, provider in sorted(desired.items()):
        known = sync.known.get(name)
        if known is None:
            drifts.append(
                Drift(
                    "missing-provider",
                    name,
                    provider.gpu,
                    None,
                    "Placement has no provider for this GPU",
                )
            )
            continue
        if known.inventories != provider.inventory():
            drifts.append(
                Drift(
                    "inventory",
                    name,
                    provider.gpu,
                    None,
                    _inventory_detail(known.inventories, provider.inventory()),
                )
            )
        managed = {t for t in known.traits if placement.is_managed_trait(t)}
        if managed != set(provider.traits):
            drifts.append(
                Drift(
                    "traits",
                    name,
                    provider.gpu,
                    None,
                    f"Placement has {sorted(managed)}; the host computes {sorted(provider.traits)}",
                )
            )
        compared.append((len(drifts), provider, sync.allocations(name)))
    return _with_allocation_drift(drifts, compared, usage, moves)


def _with_allocation_drift(
    drifts: list[Drift],
    compared: list[tuple[int, GpuProvider, dict[str, dict[str, int]]]],
    usage: Mapping[tuple[str, str], int],
    moves: Callable[[], Mapping[str, str]] | None,
) -> list[Drift]:
    """``drifts`` with each provider's allocation drift at its place; moves
    asked for only when there is some (Placement is read once either way)."""
    found = [_allocation_drift(p, allocations, usage, {}) for _, p, allocations in compared]
    if moves is not None and any(found):
        known_moves = moves()
        found = [
            _allocation_drift(p, allocations, usage, known_moves) for _, p, allocations in compared
        ]
    merged = list(drifts)
    for (position, _p, _a), rows in reversed(list(zip(compared, found, strict=True))):
        merged[position:position] = rows
    return merged


def _allocation_drift(
    provider: GpuProvider,
    allocations: Mapping[str, Mapping[str, int]],
    usage: Mapping[tuple[str, str], int],
    moves: Mapping[str, str],
) -> list[Drift]:
    drifts: list[Drift] = []
    name = provider.name
    allocated: collections.Counter[str] = collections.Counter()
    for consumer, resources in allocations.items():
        allocated[moves.get(consumer, consumer)] += resources.get(provider.resource_class, 0)
    here = {consumer: n for (gpu, consumer), n in usage.items() if gpu == provider.gpu}
    for consumer, units in sorted(allocated.items()):
        if here.get(consumer, 0) < units:
            drifts.append(
                Drift(
                    "allocation-without-mdev",
                    name,
                    provider.gpu,
                    consumer,
                    f"{units} {provider.resource_class} allocated, "
                    f"{_held(provider, here.get(consumer, 0))} held here",
                )
            )
    for consumer, count in sorted(here.items()):
        if allocated.get(consumer, 0) < count:
            drifts.append(
                Drift(
                    "mdev-without-allocation",
                    name,
                    provider.gpu,
                    consumer,
                    f"{_held(provider, count)} held here, "
                    f"{allocated.get(consumer, 0)} "
                    f"{provider.resource_class} allocated",
                )
            )
    return drifts


def _held(provider: GpuProvider, units: int) -> str:
    return f"{units} MiB of vGPUs" if provider.mixed else f"{units} mdev(s)"


def write_record(state_dir: str, drifts: Iterable[Drift], now: float) -> None:
    """Leave how much drift of each kind this audit found, and when, for
    ``vgpu-manage metrics`` to export (OSError if it cannot be written)."""
    found = collections.Counter(d.kind for d in drifts)
    state_files.write(
        os.path.join(state_dir, RECORD_FILE),
        {"at": now, "drift": {kind: found.get(kind, 0) for kind in KINDS}},
    )


def read_record(state_dir: str) -> Any:
    """What the last audit on this host found (None if none ran here)."""
    return state_files.read(os.path.join(state_dir, RECORD_FILE))
