"""The desired provider tree -> Placement, through openstacksdk.

:class:`ProviderSync` keeps the last known generation, inventory and traits
of each provider, so a sync that changes nothing costs one read and no
write.  Writes honour generations: a 409 re-reads that provider and tries
again (bounded, with backoff).  Server errors, timeouts and refused
connections are retried, then reported as PlacementUnavailable; the first
request of a sync is a read, so an unreachable Placement is found before
anything is written, and so is a provider the sync would write that is not
vgpu-driver's: then nothing is written.  Traits vgpu-driver manages (its
``CUSTOM_OWNER_VGPU_DRIVER``, ``CUSTOM_MDEV_*``, ``CUSTOM_VGPU_*``,
``CUSTOM_NVIDIA_VGPU_MANAGER_*``) are set and removed as the GPU's type or
the host's vGPU manager changes; any other trait on a provider (an
operator's) is kept.

The package's parts: :mod:`~vgpu_driver.placement.client` (requests,
retries, microversion), :mod:`~vgpu_driver.placement.observed` (the tree
as Placement holds it, read by generation), :mod:`~vgpu_driver.placement.sync`
(minimal writes) and :mod:`~vgpu_driver.placement.ownership` (whose
providers and traits these are).
"""

from vgpu_driver.exception import Conflict
from vgpu_driver.exception import PlacementAuthRefused
from vgpu_driver.exception import PlacementAuthUnavailable
from vgpu_driver.exception import PlacementError
from vgpu_driver.exception import PlacementUnavailable
from vgpu_driver.placement.client import MICROVERSION
from vgpu_driver.placement.client import Client
from vgpu_driver.placement.client import exact_name_match
from vgpu_driver.placement.client import query_url
from vgpu_driver.placement.observed import Known
from vgpu_driver.placement.observed import SyncReport
from vgpu_driver.placement.ownership import FOREIGN_OWNER_TRAITS
from vgpu_driver.placement.ownership import MANAGED_TRAIT_PREFIXES
from vgpu_driver.placement.ownership import OWNER_TRAIT
from vgpu_driver.placement.ownership import Clash
from vgpu_driver.placement.ownership import fully_reserved
from vgpu_driver.placement.ownership import is_managed_trait
from vgpu_driver.placement.ownership import is_ours
from vgpu_driver.placement.ownership import is_vanished_gpu_provider
from vgpu_driver.placement.ownership import why_unwanted
from vgpu_driver.placement.ownership import with_managed_traits
from vgpu_driver.placement.sync import ProviderSync

__all__ = [
    "Clash",
    "Client",
    "Conflict",
    "FOREIGN_OWNER_TRAITS",
    "Known",
    "MANAGED_TRAIT_PREFIXES",
    "MICROVERSION",
    "OWNER_TRAIT",
    "PlacementAuthRefused",
    "PlacementAuthUnavailable",
    "PlacementError",
    "PlacementUnavailable",
    "ProviderSync",
    "SyncReport",
    "exact_name_match",
    "fully_reserved",
    "is_managed_trait",
    "is_ours",
    "is_vanished_gpu_provider",
    "query_url",
    "why_unwanted",
    "with_managed_traits",
]
