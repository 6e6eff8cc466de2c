"""Who references which vGPU: the guests' side of "is this vGPU free?".

A guest references an mdev by an mdev hostdev (its UUID), and a vGPU of
NVIDIA's vendor-specific VFIO framework by a PCI hostdev of its VF (the VF's
address): both kinds of id are keys of one index, as they are of the claims.
The source is an interface: on a host it is libvirt's
(:class:`vgpu_driver.domain_index.DomainIndex`); tests and benchmarks use
the in-process registry :class:`vgpu_driver.fake.domains.InProcessDomains`.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class DomainRef:
    """A guest (libvirt domain, active or inactive) using an mdev."""

    uuid: str
    name: str


class DomainReferences(abc.ABC):
    #: Whether :meth:`mdev_users` also names every PCI hostdev by address.  A
    #: source that does not cannot tell a guest's vendor-VFIO VF from a free
    #: one: then no VF is handed out, and a VF set to a type that no claim
    #: holds always counts as used (never reused nor reclaimed).
    sees_pci_hostdevs = False

    @abc.abstractmethod
    def mdev_users(self) -> Mapping[str, DomainRef]:
        """``{vgpu id: DomainRef}`` over every defined domain (read-only).

        Keys are mdev UUIDs and, where :attr:`sees_pci_hostdevs`, the PCI
        addresses of PCI hostdevs.
        """
