"""Who references which mdev: the guests' side of "is this mdev free?".

The source is an interface so the lifecycle can be driven by libvirt on a
host and by a plain in-process registry in tests and tools.
"""

import abc
import dataclasses
import threading


@dataclasses.dataclass(frozen=True)
class DomainRef:
    """A guest (libvirt domain, active or inactive) using an mdev."""

    uuid: str
    name: str


class DomainReferences(abc.ABC):
    @abc.abstractmethod
    def mdev_users(self):
        """``{mdev_uuid: DomainRef}`` over every defined domain."""


class InProcessDomains(DomainReferences):
    """A registry of domains and their mdevs, kept in memory (thread-safe)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._domains = {}

    def define(self, uuid, mdev_uuids, name=None):
        with self._lock:
            self._domains[uuid] = (name or f"instance-{uuid[:8]}", tuple(mdev_uuids))

    def undefine(self, uuid):
        with self._lock:
            self._domains.pop(uuid, None)

    def mdev_users(self):
        with self._lock:
            return {mdev: DomainRef(uuid, name)
                    for uuid, (name, mdevs) in self._domains.items() for mdev in mdevs}
