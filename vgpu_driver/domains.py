"""Who references which vGPU: the guests' side of "is this vGPU free?".

A guest references an mdev by an mdev hostdev (its UUID), and a vGPU of
NVIDIA's vendor-specific VFIO framework by a PCI hostdev of its VF (the VF's
address): both kinds of id are keys of one index, as they are of the claims.
The source is an interface so the lifecycle can be driven by libvirt on a
host and by a plain in-process registry in tests and tools.
"""

import abc
import dataclasses
import threading
from types import MappingProxyType


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
    def mdev_users(self):
        """``{vgpu id: DomainRef}`` over every defined domain (read-only).

        Keys are mdev UUIDs and, where :attr:`sees_pci_hostdevs`, the PCI
        addresses of PCI hostdevs.
        """


class InProcessDomains(DomainReferences):
    """A registry of domains and their vGPUs, kept in memory (thread-safe).

    A domain is defined with the ids of its vGPUs (mdev UUIDs, VF addresses).
    The index is rebuilt on each change and handed out read-only, so a
    lookup costs nothing however many domains there are.
    """

    sees_pci_hostdevs = True

    def __init__(self):
        self._lock = threading.Lock()
        self._domains = {}
        self._index = MappingProxyType({})

    def _reindex(self):
        self._index = MappingProxyType({
            mdev: DomainRef(uuid, name)
            for uuid, (name, mdevs) in self._domains.items() for mdev in mdevs})

    def define(self, uuid, mdev_uuids, name=None):
        with self._lock:
            self._domains[uuid] = (name or f"instance-{uuid[:8]}", tuple(mdev_uuids))
            self._reindex()

    def undefine(self, uuid):
        with self._lock:
            self._domains.pop(uuid, None)
            self._reindex()

    def mdev_users(self):
        return self._index
