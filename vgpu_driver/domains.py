"""Who references which mdev: the guests' side of "is this mdev free?".

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
    @abc.abstractmethod
    def mdev_users(self):
        """``{mdev_uuid: DomainRef}`` over every defined domain (read-only)."""


class InProcessDomains(DomainReferences):
    """A registry of domains and their mdevs, kept in memory (thread-safe).

    The index is rebuilt on each change and handed out read-only, so a
    lookup costs nothing however many domains there are.
    """

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
