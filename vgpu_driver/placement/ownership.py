"""Which providers and traits are vgpu-driver's, and what it does with
those whose GPU is gone.

Every GPU provider vgpu-driver creates or manages carries
:data:`OWNER_TRAIT`; one with a GPU provider's name that lacks it is written
only when it is one an older vgpu-driver created (:func:`is_ours`).  Traits
vgpu-driver manages (:data:`OWNER_TRAIT`, ``CUSTOM_MDEV_*``,
``CUSTOM_VGPU_*``, ``CUSTOM_NVIDIA_VGPU_MANAGER_*``) are set and removed as
the GPU's type or the host's vGPU manager changes; any other
trait on a provider (an operator's) is kept.  A provider under the compute
node that looks like one of ours but has no GPU any more is pruned, unless
another service's trait says it is theirs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from collections.abc import Iterable
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

from vgpu_driver import names

if TYPE_CHECKING:
    from vgpu_driver.inventory import ProviderTree

# On NVIDIA GPUs' providers: the host's vGPU manager version.
MANAGER_TRAIT_PREFIX = "CUSTOM_NVIDIA_VGPU_MANAGER_"
MANAGED_TRAIT_PREFIXES = ("CUSTOM_MDEV_", "CUSTOM_VGPU_", MANAGER_TRAIT_PREFIX)
# Standard traits that mark a provider as another service's: nova's PCI
# devices in Placement, and Cyborg's accelerators.
FOREIGN_OWNER_TRAITS = frozenset({"COMPUTE_MANAGED_PCI_DEVICE", "OWNER_CYBORG"})
# Ours, on every GPU provider vgpu-driver creates or manages: named after the
# standard OWNER_* traits (OWNER_CYBORG, OWNER_NOVA), outside the type
# traits' prefixes so that no GPU type's name can produce it.
OWNER_TRAIT = "CUSTOM_OWNER_VGPU_DRIVER"


def is_managed_trait(trait: str) -> bool:
    """A trait vgpu-driver sets (an operator's is not): its owner trait, the
    GPU type's traits and the vGPU manager's."""
    return trait == OWNER_TRAIT or trait.startswith(MANAGED_TRAIT_PREFIXES)


def is_ours(
    parent_uuid: str | None,
    root_uuid: str,
    inventories: Iterable[str],
    traits: Collection[str],
    mdev_classes: Iterable[str],
) -> bool:
    """Whether a provider of the host's tree named as one of its GPU
    providers is vgpu-driver's to write.

    It is when it carries :data:`OWNER_TRAIT`, or when an older vgpu-driver
    created it, before providers were marked: a direct child of the root
    with nothing but mdev classes.  Never with another owner's trait.
    """
    if set(traits) & FOREIGN_OWNER_TRAITS:
        return False
    return OWNER_TRAIT in traits or (
        parent_uuid == root_uuid and set(inventories) <= set(mdev_classes)
    )


@dataclasses.dataclass(frozen=True)
class Clash:
    """A provider a sync would write but must not: it holds the name of
    this host's root or of one of its GPU providers, and is not ours."""

    name: str
    reason: str
    where: str  # "parent X, root Y", or "a root provider"
    traits: tuple[str, ...]

    def kwargs(self) -> dict[str, str]:
        return {
            "name": self.name,
            "reason": self.reason,
            "where": self.where,
            "traits": ", ".join(self.traits) or "none",
        }

    def detail(self) -> str:
        return (
            f"{self.reason} ({self.where}, traits {', '.join(self.traits) or 'none'}); "
            "sync refuses to write it"
        )


def with_managed_traits(traits: Iterable[str], managed: Iterable[str]) -> set[str]:
    """``traits`` with the managed ones replaced by ``managed``; any other
    trait (an operator's) is kept."""
    return {t for t in traits if not is_managed_trait(t)} | set(managed)


def is_vanished_gpu_provider(
    tree: ProviderTree,
    name: str,
    parent_uuid: str | None,
    root_uuid: str,
    inventories: Iterable[str],
    traits: Iterable[str],
) -> bool:
    """Whether a provider stands for a GPU of ``tree``'s host that is gone: a
    child of the root, named ``<root>_...``, that ``tree`` no longer has.

    Others share the root and the name prefix (nova names its PCI device
    providers ``<root>_<address>``).  A provider is taken for ours when it
    has only mdev classes, or a type trait we set (a class no longer
    configured); never with another owner's trait.
    """
    ours = set(inventories) <= tree.mdev_classes or any(is_managed_trait(t) for t in traits)
    return (
        parent_uuid == root_uuid
        and name.startswith(f"{tree.root_name}_")
        and tree.provider(name) is None
        and ours
        and not set(traits) & FOREIGN_OWNER_TRAITS
    )


def why_unwanted(tree: ProviderTree, name: str) -> str:
    """Why a provider of ours is no longer wanted: its GPU is gone, or it is
    there but no longer configured (listed in ``tree.unserved``)."""
    prefix = f"{tree.root_name}_"
    for address, reason in tree.unserved:
        if name in (f"{prefix}{address}", f"{prefix}{_provider_suffix(address)}"):
            if address in tree.vfs_pending:
                return f"its GPU {address} has no VFs now ({reason})"
            return f"its GPU {address} is no longer configured ({reason})"
    return "its GPU is gone"


def _provider_suffix(address: str) -> str:
    return (
        names.parse_pci_address(address).provider_suffix
        if names.is_pci_address(address)
        else address
    )


def fully_reserved(
    inventories: Mapping[str, Mapping[str, Any]],
) -> dict[str, dict[str, Any]]:
    """The same inventories with everything reserved: a vanished GPU's
    provider that guests still hold takes no new allocation."""
    return {rc: {**inv, "reserved": inv["total"]} for rc, inv in inventories.items()}
