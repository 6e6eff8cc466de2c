"""What the inventory produces: one provider per physical GPU, and their tree.

A provider is named ``<nodename>_pci_dddd_bb_ss_f`` after its GPU's
physical function and carries traits naming its type, saying it is ours
and, on an NVIDIA GPU, naming the host's vGPU manager version.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING
from typing import Any

from vgpu_driver import discovery
from vgpu_driver import framebuffer
from vgpu_driver import names
from vgpu_driver import size_classes
from vgpu_driver.placement import ownership

if TYPE_CHECKING:
    from vgpu_driver.host_snapshot import HostSnapshot
    from vgpu_driver.host_snapshot import PhysicalGPU

TRAIT_MAX_LENGTH = 255
TYPE_ID_TRAIT_PREFIX = "CUSTOM_MDEV_"

# What a GPU's reserved units are held back for (GpuProvider.reserved_for).
NO_CAPACITY = "no_capacity"  # the GPU offers no more of its type, for no reason seen
BLOCKED = "blocked"  # unused vGPUs of another type are in the way
DRAINING = "draining"  # guests' vGPUs of another type are in the way
MAX_INSTANCES = "max_instances"  # the type's host-wide max_instances is used elsewhere
UNREADABLE = "unreadable"  # a sysfs value the vendor driver wrote is garbage
CLAIMS = "claims"  # claimed vGPUs no Placement allocation covers
FRAGMENTED = "fragmented"  # a shared board's framebuffer no configured type can take now
RESERVED_FOR = (NO_CAPACITY, BLOCKED, DRAINING, MAX_INSTANCES, UNREADABLE, CLAIMS, FRAGMENTED)


@dataclasses.dataclass(frozen=True)
class GpuProvider:
    """The desired state of one GPU's resource provider."""

    name: str
    parent_provider: str
    gpu: str
    type_id: str
    type_name: str | None
    resource_class: str
    total: int
    reserved: int = 0
    max_unit: int = 0
    traits: tuple[str, ...] = ()
    reason: str | None = None
    # ``((kind, units), ...)``: what the reserved units are held back for
    # (one of RESERVED_FOR); their units add up to ``reserved``.
    reserved_for: tuple[tuple[str, int], ...] = ()
    min_unit: int = 1
    step_size: int = 1
    allocation_ratio: float = 1.0
    # A mixed-size board: ``((type id, MiB), ...)`` of the types it serves,
    # its inventory in framebuffer MiB; ``type_id`` then lists them.
    sizes: tuple[tuple[str, int], ...] = ()
    # A mixed-size board: ``((size class, SizeInventory), ...)``, the vGPUs
    # of each placement size it can take (:mod:`vgpu_driver.size_classes`).
    size_inventories: tuple[tuple[str, size_classes.SizeInventory], ...] = ()
    # Served as a type pool: one size at a time (vgpu_driver.inventory.pool).
    pool: bool = False

    @property
    def mixed(self) -> bool:
        return bool(self.sizes)

    def units_of(self, type_id: str | None) -> int:
        """What one vGPU of ``type_id`` counts for in the inventory: one,
        or on a mixed-size board its framebuffer MiB (0: not its type)."""
        return dict(self.sizes).get(type_id or "", 0) if self.sizes else 1

    def inventory(self) -> dict[str, dict[str, Any]]:
        """The Placement inventory records of this provider's classes."""
        records: dict[str, dict[str, Any]] = {
            self.resource_class: {
                "total": self.total,
                "reserved": self.reserved,
                "min_unit": self.min_unit,
                "max_unit": self.max_unit,
                "step_size": self.step_size,
                "allocation_ratio": self.allocation_ratio,
            }
        }
        records.update((rc, found.as_placement()) for rc, found in self.size_inventories)
        return records

    def size_class_of(self, type_id: str) -> str | None:
        """The size class of ``type_id`` on a mixed-size board (None: not one)."""
        mib = dict(self.sizes).get(type_id)
        return size_classes.class_name(mib // framebuffer.SLOT_MIB) if mib else None


@dataclasses.dataclass(frozen=True)
class ProviderTree:
    root_name: str
    providers: tuple[GpuProvider, ...]
    # GPUs that get no provider, and why: (gpu address, reason).
    unserved: tuple[tuple[str, str], ...] = ()
    # Resource classes a GPU provider of this host may carry: VGPU and every
    # configured mdev class.  A provider with any other class is not ours.
    mdev_classes: frozenset[str] = frozenset({"VGPU"})
    # Configured SR-IOV GPUs in ``unserved`` because their VFs are not there.
    vfs_pending: frozenset[str] = frozenset()

    def provider(self, name: str) -> GpuProvider | None:
        for provider in self.providers:
            if provider.name == name:
                return provider
        return None

    def by_gpu(self, address: str) -> GpuProvider | None:
        for provider in self.providers:
            if provider.gpu == address:
                return provider
        return None


def provider_name(nodename: str, gpu: PhysicalGPU) -> str:
    return provider_name_for(nodename, gpu.address)


def provider_name_for(nodename: str, gpu_address: str) -> str:
    """The provider name of a GPU by its address (a PCI address, or a
    virtual device's ``<class>_<device>`` name)."""
    if names.is_pci_address(gpu_address):
        return f"{nodename}_{names.parse_pci_address(gpu_address).provider_suffix}"
    return f"{nodename}_{gpu_address}"


def type_traits(type_id: str, type_name: str | None) -> tuple[str, ...]:
    """Traits that let flavors ask for a type by id or by its vendor name."""
    traits = [f"{TYPE_ID_TRAIT_PREFIX}{names.trait_fragment(type_id)}"]
    if type_name:
        traits.append(f"CUSTOM_VGPU_{names.trait_fragment(type_name)}")
    return tuple(sorted({t[:TRAIT_MAX_LENGTH] for t in traits}))


def manager_trait(version: str) -> str:
    """The trait naming an NVIDIA vGPU manager version (``550.127.06`` ->
    ``CUSTOM_NVIDIA_VGPU_MANAGER_550_127_06``): a live migration of
    vendor-VFIO vGPUs reads the source's from Placement."""
    return f"{ownership.MANAGER_TRAIT_PREFIX}{names.trait_fragment(version)}"


def manager_version_of(trait: str) -> str:
    """The version a :func:`manager_trait` names, dotted again."""
    return trait[len(ownership.MANAGER_TRAIT_PREFIX) :].replace("_", ".")


def provider_traits(
    type_id: str, type_name: str | None, manager_version: str | None = None
) -> tuple[str, ...]:
    """A GPU provider's traits: its type's, the one saying it is ours, and
    on an NVIDIA GPU the one naming the host's vGPU manager version."""
    traits = {*type_traits(type_id, type_name), ownership.OWNER_TRAIT}
    if manager_version:
        traits.add(manager_trait(manager_version))
    return tuple(sorted(traits))


def gpu_manager_version(snapshot: HostSnapshot, gpu: PhysicalGPU) -> str | None:
    """The host's vGPU manager version on an NVIDIA GPU, else None."""
    nvidia = gpu.pci is not None and gpu.pci.vendor == discovery.NVIDIA_VENDOR
    return snapshot.vgpu_manager_version if nvidia else None


def shared_board_traits(
    snapshot: HostSnapshot, gpu: PhysicalGPU, type_ids: Iterable[str]
) -> tuple[str, ...]:
    """The traits of a board serving ``type_ids`` in one framebuffer
    inventory (mixed sizes, a type pool): each type's id trait, none of
    their names (a type's name is listed only while it is creatable)."""
    version = gpu_manager_version(snapshot, gpu)
    return tuple(
        sorted({t for type_id in type_ids for t in provider_traits(type_id, None, version)})
    )


def shared_board_reserved(fragmented: int, claims: int) -> tuple[tuple[str, int], ...]:
    """``reserved_for`` of such a board: MiB no configured type can take
    now, and MiB of claims Placement does not count."""
    return (((FRAGMENTED, fragmented),) if fragmented else ()) + (
        ((CLAIMS, claims),) if claims else ()
    )
