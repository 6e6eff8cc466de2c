"""The mdev side of :class:`~vgpu_driver.sysfs.linux.LinuxSysfs`: parents,
their types and the mdevs on them.

A mixin rather than a module of functions so that ``LinuxSysfs`` stays the
one class callers use; it needs only ``self.paths``
(:class:`~vgpu_driver.sysfs.paths.SysfsPaths`), which ``LinuxSysfs`` sets.
The layout followed is the kernel's: parents are links under
``class/mdev_bus`` into ``devices/...``; mdevs are links under
``bus/mdev/devices`` to ``<parent device>/<uuid>``, whose ``mdev_type`` link
names the type.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Container
from collections.abc import Iterable
from collections.abc import Iterator
from typing import TYPE_CHECKING

from oslo_log import log as logging

from vgpu_driver import exception
from vgpu_driver import names
from vgpu_driver.sysfs import attrs
from vgpu_driver.sysfs import base

if TYPE_CHECKING:
    from vgpu_driver.names import PciAddress
    from vgpu_driver.sysfs.paths import SysfsPaths

LOG = logging.getLogger(__name__)

# Pure functions of a name, run for every parent and every listed type on
# each update: sysfs shows the same few hundred names each time, so a name
# already parsed or checked is not again.  A refusal is never kept (it
# raises each time, and is logged each time).
pci_address = functools.lru_cache(maxsize=4096)(names.parse_pci_address)


@functools.lru_cache(maxsize=4096)
def _valid_type_id(entry: str) -> bool:
    try:
        names.check_type_id(entry)
    except exception.InvalidSysfsName:
        return False
    return True


def _resolve_in(directory: str, link: str) -> str | None:
    """:func:`attrs.resolve_link` of ``link``, an entry of ``directory``,
    without taking the path apart again: these run once per parent and
    per mdev on every update."""
    try:
        target = os.readlink(link)
    except OSError:
        return None
    return os.path.normpath(target if target.startswith("/") else f"{directory}/{target}")


class MdevReads:
    """Reads of ``class/mdev_bus`` and ``bus/mdev/devices`` and what they link to."""

    paths: SysfsPaths

    def list_parents(self, wanted: Container[str] | None = None) -> list[base.ParentInfo]:
        parents = (self.read_parent(name, wanted) for name in self.parent_names())
        return [parent for parent in parents if parent is not None]

    def parent_names(self) -> list[str]:
        """The valid names under ``class/mdev_bus``, sorted (no link read)."""
        found = []
        for entry in attrs.sorted_entries(self.paths.parent_base()):
            try:
                found.append(names.check_parent_name(entry, "class/mdev_bus"))
            except exception.InvalidSysfsName as exc:
                LOG.warning("Skipping parent: %s", exc)
        return found

    def read_parent(
        self, name: str, wanted: Container[str] | None = None
    ) -> base.ParentInfo | None:
        """One parent's :class:`ParentInfo` (its types read now: with
        ``wanted``, only those type ids), or None when its link points to
        no device."""
        link = self.paths.parent(name)
        device_path = _resolve_in(self.paths.parent_base(), link) or link
        types, unread = self._read_types(device_path, wanted)
        if types is None:
            LOG.warning("Skipping parent %s: %s points to no device", name, link)
            return None
        address: PciAddress | None = None
        physfn: PciAddress | None = None
        if names.is_pci_address(name):
            address = pci_address(name)
            pf = attrs.link_name(f"{device_path}/physfn")
            if pf is not None:
                physfn = pci_address(pf, f"{name}/physfn")
        return base.ParentInfo(
            name=name,
            device_path=device_path,
            types=types,
            address=address,
            physfn=physfn,
            unread=unread,
        )

    def _read_types(
        self,
        device_path: str,
        wanted: Container[str] | None = None,
    ) -> tuple[tuple[base.MdevTypeInfo, ...] | None, tuple[str, ...]]:
        """``(types read, ids of types listed but not wanted)``, or
        ``(None, ())`` when ``device_path`` is no directory.

        Listing the types directory is the first read; only when it fails
        is the device itself looked at (one stat saved per parent).  Four
        attributes per type are most of a full read: a caller that looks
        at a few types (the inventory: the configured ones) reads those.
        """
        types_dir = device_path + "/mdev_supported_types"
        try:
            entries = sorted(os.listdir(types_dir))
        except (FileNotFoundError, NotADirectoryError):
            if not os.path.isdir(device_path):
                return None, ()
            entries = []
        type_ids = []
        for entry in entries:
            if _valid_type_id(entry):
                type_ids.append(entry)
                continue
            try:
                names.check_type_id(entry, types_dir)
            except exception.InvalidSysfsName as exc:
                LOG.warning("Skipping type: %s", exc)
        if wanted is None:
            return tuple(self._types_in(types_dir, type_ids)), ()
        return (
            tuple(self._types_in(types_dir, [t for t in type_ids if t in wanted])),
            tuple(t for t in type_ids if t not in wanted),
        )

    def _types_in(self, types_dir: str, type_ids: Iterable[str]) -> Iterator[base.MdevTypeInfo]:
        for type_id in type_ids:
            # Plain concatenation: this loop runs for every type of every parent.
            prefix = f"{types_dir}/{type_id}/"
            unreadable: list[str] = []
            available = attrs.read_parsed(
                prefix + "available_instances", attrs.parse_count, unreadable
            )
            yield base.MdevTypeInfo(
                type_id=type_id,
                available_instances=available or 0,
                device_api=attrs.read_parsed(
                    prefix + "device_api", attrs.parse_printable, unreadable
                )
                or "",
                name=attrs.read_parsed(prefix + "name", attrs.parse_printable, unreadable),
                description=attrs.read_parsed(prefix + "description", str, unreadable),
                unreadable=tuple(unreadable),
            )

    def list_mdevs(self) -> list[base.MdevInfo]:
        mdevs = (self.read_mdev(uuid) for uuid in self.mdev_uuids())
        return [mdev for mdev in mdevs if mdev is not None]

    def mdev_uuids(self) -> list[str]:
        """The valid names under ``bus/mdev/devices``, sorted (no link read)."""
        found = []
        for entry in attrs.sorted_entries(self.paths.mdev_base()):
            try:
                found.append(names.check_mdev_uuid(entry, "bus/mdev/devices"))
            except exception.InvalidSysfsName as exc:
                LOG.warning("Skipping mdev: %s", exc)
        return found

    def read_mdev(self, uuid: str) -> base.MdevInfo | None:
        """One mdev's :class:`MdevInfo`, or None once it is gone."""
        mdev_path = _resolve_in(self.paths.mdev_base(), self.paths.mdev(uuid))
        type_id = attrs.link_name(f"{mdev_path}/mdev_type") if mdev_path else None
        if mdev_path is None or type_id is None:
            # Removed while we looked: the kernel drops both links at once.
            return None
        parent = mdev_path.rsplit("/", 2)[-2]
        return base.MdevInfo(uuid=uuid, parent=parent, type_id=type_id)

    def parent_mdevs(self, parent: str) -> list[tuple[str, str]] | None:
        """``[(uuid, type_id)]`` of the mdevs on one parent; None if it is gone.

        Reads one directory, not the whole bus: allocations look at one GPU.
        """
        device_path = attrs.resolve_link(self.paths.parent(names.check_parent_name(parent)))
        try:
            entries = os.listdir(device_path) if device_path else None
        except FileNotFoundError:
            entries = None
        if entries is None:
            return None
        found = []
        for entry in sorted(entries):
            if names.is_mdev_uuid(entry):
                type_id = attrs.link_name(f"{device_path}/{entry}/mdev_type")
                if type_id:
                    found.append((entry, type_id))
        return found

    def parent_mdev_uuids(self, parent: str) -> list[str] | None:
        """The UUIDs of the mdevs on one parent, sorted (no link reads)."""
        device_path = self.paths.parent(names.check_parent_name(parent))
        try:
            return sorted(e for e in os.listdir(device_path) if names.is_mdev_uuid(e))
        except FileNotFoundError:
            return None

    def available_instances(self, parent: str, type_id: str) -> int:
        """One type's ``available_instances`` on one parent (0 if absent)."""
        path = os.path.join(
            self.paths.parent_type(names.check_parent_name(parent), names.check_type_id(type_id)),
            "available_instances",
        )
        return attrs.int_or_none(attrs.read_attr(path)) or 0

    def mdev_created_at(self, uuid: str) -> float | None:
        """When an mdev appeared (its sysfs entry's change time), or None."""
        try:
            return os.lstat(self.paths.mdev(names.check_mdev_uuid(uuid))).st_ctime
        except FileNotFoundError:
            return None
