"""Guests kept in memory, for tests and benchmarks: a domain source without libvirt.

Production reads libvirt's domains through
:class:`vgpu_driver.domain_index.DomainIndex`; this registry answers the
same :class:`~vgpu_driver.domains.DomainReferences` interface from what a
test defines, so the allocation path can run without a hypervisor.
"""

import threading
from types import MappingProxyType

from vgpu_driver.domains import DomainRef
from vgpu_driver.domains import DomainReferences


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
        self._index = MappingProxyType(
            {
                mdev: DomainRef(uuid, name)
                for uuid, (name, mdevs) in self._domains.items()
                for mdev in mdevs
            }
        )

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
