"""Taking over a host another driver managed: its providers and its mdevs.

nova's own libvirt driver reports one provider per mdev *parent*: on an
SR-IOV board (an A100) that is one provider per VF, ``<nodename>_pci_0000_41_00_4``
and so on, each of total 1.  vgpu-driver reports one provider per physical
GPU.  Switching a running host from one to the other must not lose the
guests that already hold vGPUs, so:

* :func:`plan` says which existing providers stand for a GPU vgpu-driver now
  serves, and which of its providers takes their place (their allocations
  are then moved, atomically, by Placement's reshaper; see
  :mod:`vgpu_driver.nova.reshape`);
* :func:`adopt` records the mdevs the guests already use as ``attached``
  claims, so they are restored after a reboot, released with their guest,
  and never taken for an orphan or handed to another guest.

Nothing here talks to nova or Placement.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

from oslo_log import log as logging

from vgpu_driver import claims
from vgpu_driver import exception
from vgpu_driver import names

if TYPE_CHECKING:
    from vgpu_driver.host_snapshot import HostSnapshot
    from vgpu_driver.inventory import GpuProvider
    from vgpu_driver.inventory import ProviderTree
    from vgpu_driver.mdevs import MdevManager

LOG = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ExistingProvider:
    """A child provider already in Placement under this host's root."""

    name: str
    uuid: str
    resource_classes: frozenset[str]


@dataclasses.dataclass(frozen=True)
class Move:
    """An existing provider whose inventory and allocations go to ``target``."""

    source: ExistingProvider
    target: GpuProvider
    address: str  # the device the source provider was named after


@dataclasses.dataclass(frozen=True)
class Plan:
    moves: tuple[Move, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.moves)

    def by_source_uuid(self) -> dict[str, Move]:
        return {m.source.uuid: m for m in self.moves}

    @property
    def targets(self) -> tuple[GpuProvider, ...]:
        """The GPU providers that receive something, each once, by name."""
        return tuple({m.target.name: m.target for m in self.moves}.values())


def device_address(nodename: str, provider_name: str) -> str | None:
    """The device a ``<nodename>_<device>`` provider was named after.

    ``cn1_pci_0000_41_00_4`` -> ``0000:41:00.4``; a virtual parent keeps its
    ``<class>_<device>`` name (``cn1_mtty_mtty`` -> ``mtty_mtty``); anything
    else (another host's, or not named after a device) -> None.
    """
    prefix = f"{nodename}_"
    if not provider_name.startswith(prefix):
        return None
    suffix = provider_name[len(prefix) :]
    parts = suffix.split("_")
    if len(parts) == 5 and parts[0] == "pci":
        text = f"{parts[1]}:{parts[2]}:{parts[3]}.{parts[4]}"
        return str(names.parse_pci_address(text)) if names.is_pci_address(text) else None
    try:
        return names.parse_device_address(suffix)
    except exception.InvalidSysfsName:
        return None


def _target(
    nodename: str,
    provider: ExistingProvider,
    desired: Mapping[str, GpuProvider],
    snapshot: HostSnapshot,
    mdev_classes: frozenset[str],
) -> tuple[GpuProvider, str] | None:
    """``(GpuProvider, address)`` that takes ``provider``'s place, or None."""
    if provider.name in desired or not provider.resource_classes:
        return None
    # Only providers of mdev inventory: PCI-in-Placement providers (and any
    # other nova or operators make under the root) are never touched.
    if not provider.resource_classes <= mdev_classes:
        return None
    address = device_address(nodename, provider.name)
    gpu = snapshot.gpu(address) if address else None
    if gpu is None or address is None:  # (no address, no GPU: for the checker)
        return None
    target = next((p for p in desired.values() if p.gpu == gpu.address), None)
    return (target, address) if target is not None else None


def plan(
    nodename: str,
    desired_tree: ProviderTree,
    snapshot: HostSnapshot,
    existing: Iterable[ExistingProvider],
) -> Plan:
    """Which ``existing`` providers a provider of ``desired_tree`` replaces.

    A provider named after a parent of a GPU we serve (nova's per-VF
    providers on SR-IOV boards) maps to that GPU's provider.  A provider
    with the name we would give it is already ours: nova names time-sliced
    GPUs after their physical function, as we do, and those are simply
    updated in place.
    """
    desired = {p.name: p for p in desired_tree.providers}
    moves: list[Move] = []
    for provider in sorted(existing, key=lambda p: p.name):
        found = _target(nodename, provider, desired, snapshot, desired_tree.mdev_classes)
        if found is not None:
            moves.append(Move(provider, *found))
    return Plan(tuple(moves))


def move_allocations(
    allocations: dict[str, dict[str, Any]], plan: Plan, target_uuids: Mapping[str, str]
) -> dict[str, dict[str, int]]:
    """Move every consumer's units from replaced providers to their GPU's.

    ``allocations`` is Placement's ``{consumer: {"allocations": {rp_uuid:
    {"resources": {rc: n}}}, ...}}`` and is edited in place, as a reshape
    wants it; ``target_uuids`` maps the GPU providers' names to their UUIDs.
    Units keep their number and are counted in the class the GPU provider
    serves.  Returns ``{consumer: {gpu address: units}}``.
    """
    by_source = plan.by_source_uuid()
    moved: dict[str, dict[str, int]] = {}
    for consumer, record in allocations.items():
        allocs = record.get("allocations", {})
        for rp_uuid in [u for u in allocs if u in by_source]:
            move = by_source[rp_uuid]
            units = sum(allocs.pop(rp_uuid).get("resources", {}).values())
            if not units:
                continue
            target = allocs.setdefault(target_uuids[move.target.name], {})
            resources = target.setdefault("resources", {})
            rc = move.target.resource_class
            resources[rc] = resources.get(rc, 0) + units
            per_gpu = moved.setdefault(consumer, {})
            per_gpu[move.target.gpu] = per_gpu.get(move.target.gpu, 0) + units
    return moved


def mismatches(
    moved: Mapping[str, Mapping[str, int]], held: Mapping[str, Mapping[str, int]]
) -> list[tuple[str, str, int, int]]:
    """Consumers whose moved units differ from the mdevs they hold per GPU.

    ``held`` is ``{consumer: {gpu address: mdevs}}`` (from the claims).
    Returns ``[(consumer, gpu, units, mdevs)]``; a migration's consumer, or a
    guest whose domain is gone, shows up here.
    """
    found: list[tuple[str, str, int, int]] = []
    for consumer, per_gpu in sorted(moved.items()):
        for gpu, units in sorted(per_gpu.items()):
            mdevs = held.get(consumer, {}).get(gpu, 0)
            if mdevs != units:
                found.append((consumer, gpu, units, mdevs))
    return found


def held_per_gpu(claim_list: Iterable[claims.Claim]) -> dict[str, dict[str, int]]:
    """``{instance: {gpu address: mdevs}}`` from claims (not those going away)."""
    held: dict[str, dict[str, int]] = {}
    for claim in claim_list:
        if claim.state == claims.RELEASING:
            continue
        per_gpu = held.setdefault(claim.instance_uuid, {})
        per_gpu[claim.gpu] = per_gpu.get(claim.gpu, 0) + 1
    return held


def adopt(manager: MdevManager) -> list[claims.Claim]:
    """Claim, ``attached``, the vGPUs guests use that no claim records.

    Another driver made them (nova's, before the switch; for a vendor-VFIO
    VF, an operator set its type and nova passed it through), or the journal
    was lost.  Each is claimed for the guest whose domain references it (the
    domain's UUID is the instance's).  Returns the new claims.
    """
    snapshot = manager.snapshot(refresh=True)
    adopted: list[str] = []
    with manager.journal.transaction() as txn:
        claimed = txn.by_mdev()
        users = manager.domains.mdev_users()
        for vgpu in snapshot.vgpus:
            user = users.get(vgpu.id)
            if user is None or vgpu.id in claimed:
                continue
            gpu = snapshot.gpu_of_parent(vgpu.parent)
            if gpu is None:
                continue
            txn.add(user.uuid, vgpu.id, gpu.address, vgpu.parent, vgpu.type_id, claims.ATTACHED)
            adopted.append(vgpu.id)
        found = [c for c in txn.claims() if c.mdev_uuid in adopted]
    for claim in found:
        LOG.info(
            "Adopted vGPU %s (%s on %s) that domain %s uses: claimed for instance %s",
            claim.mdev_uuid,
            claim.type_id,
            claim.parent,
            users[claim.mdev_uuid].name,
            claim.instance_uuid,
        )
    return found
