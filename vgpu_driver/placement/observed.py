"""What Placement holds of one compute node's provider tree, read with the
fewest requests, and which of its providers are not vgpu-driver's.

:class:`ObservedTree` keeps the last known generation, inventory and traits
of each provider (:class:`Known`): a read of the tree re-reads only the
providers whose generation moved.  It only reads;
:class:`~vgpu_driver.placement.sync.ProviderSync` writes on top of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

from vgpu_driver.placement import client as placement_client
from vgpu_driver.placement import ownership

if TYPE_CHECKING:
    from vgpu_driver.inventory import ProviderTree


@dataclasses.dataclass
class Known:
    uuid: str
    generation: int
    inventories: dict[str, dict[str, Any]]
    traits: frozenset[str]
    parent_uuid: str | None = None


@dataclasses.dataclass
class SyncReport:
    """The requests of one sync (or read), and what it changed."""

    reads: int = 0
    writes: int = 0
    planned: list[tuple[str, str, Any]] = dataclasses.field(default_factory=list)
    created: list[str] = dataclasses.field(default_factory=list)
    updated: list[str] = dataclasses.field(default_factory=list)
    deleted: list[str] = dataclasses.field(default_factory=list)
    kept: list[tuple[str, list[str]]] = dataclasses.field(default_factory=list)


class ObservedTree:
    """One compute node's providers as Placement last answered."""

    def __init__(self, client: placement_client.Client) -> None:
        self.client = client
        self.known: dict[str, Known] = {}  # provider name -> Known
        self.root_uuid: str | None = None
        # The provider named as the root, when it has a parent.
        self._foreign_root: dict[str, Any] | None = None

    # -- reading ------------------------------------------------------------------------

    def _get(self, url: str, report: SyncReport) -> Any:
        return self.client.request("GET", url, report=report)

    def _load(
        self, name: str, uuid: str, generation: int, parent_uuid: str | None, report: SyncReport
    ) -> None:
        base = f"/resource_providers/{uuid}"
        inventories = self._get(f"{base}/inventories", report)["inventories"]
        traits = self._get(f"{base}/traits", report)["traits"]
        self.known[name] = Known(uuid, generation, inventories, frozenset(traits), parent_uuid)

    def observe(self, tree: ProviderTree, report: SyncReport | None = None) -> list[dict[str, Any]]:
        """Bring ``known`` up to date with Placement (one read when nothing moved)."""
        return self._observe(tree, report if report is not None else SyncReport())

    def allocations(self, name: str, report: SyncReport | None = None) -> dict[str, dict[str, int]]:
        """``{consumer: {resource class: units}}`` on one known provider."""
        answer = self._get(
            f"/resource_providers/{self.known[name].uuid}/allocations",
            report if report is not None else SyncReport(),
        )
        return {
            consumer: dict(data["resources"]) for consumer, data in answer["allocations"].items()
        }

    def _find_by_name(self, name: str, report: SyncReport) -> dict[str, Any] | None:
        """The provider named exactly ``name``, or None."""
        found = self._get(placement_client.query_url("/resource_providers", name=name), report)[
            "resource_providers"
        ]
        return placement_client.exact_name_match(found, name)

    def _observe(self, tree: ProviderTree, report: SyncReport) -> list[dict[str, Any]]:
        """One read of the tree; re-read only providers whose generation moved."""
        if self.root_uuid is None:
            root = self._find_by_name(tree.root_name, report)
            self._foreign_root = root if root and root["parent_provider_uuid"] else None
            if root is None or self._foreign_root is not None:
                return []
            self.root_uuid = root["uuid"]
        url = placement_client.query_url("/resource_providers", in_tree=self.root_uuid)
        listed: list[dict[str, Any]] = self._get(url, report)["resource_providers"]
        seen = {p["name"] for p in listed}
        for name in [n for n in self.known if n not in seen]:
            del self.known[name]
        for rp in listed:
            known = self.known.get(rp["name"])
            if known is None or known.generation != rp["generation"]:
                self._load(
                    rp["name"], rp["uuid"], rp["generation"], rp["parent_provider_uuid"], report
                )
        return listed

    # -- ownership ------------------------------------------------------------------------

    def clashes(
        self, tree: ProviderTree, report: SyncReport | None = None
    ) -> list[ownership.Clash]:
        """The providers a sync of ``tree`` would write that are not ours, as
        :class:`~vgpu_driver.placement.ownership.Clash` rows (reads only;
        after :meth:`observe`).

        The root must be a root; each GPU provider's name, when Placement has
        it, must be on a provider of this host's tree that is ours
        (:func:`~vgpu_driver.placement.ownership.is_ours`), never on another
        tree's provider.  Names missing from the tree are looked up, so a
        host's first sync reads once per GPU.
        """
        report = report if report is not None else SyncReport()
        if self._foreign_root is not None:
            return [
                self._clash(
                    tree.root_name,
                    "it would be this host's root provider but is another provider's child",
                    self._foreign_root,
                    None,
                    report,
                )
            ]
        found = []
        for provider in tree.providers:
            known = self.known.get(provider.name)
            if known is not None:
                # Providers are known only under a root that was found.
                if self.root_uuid is None or not ownership.is_ours(
                    known.parent_uuid,
                    self.root_uuid,
                    known.inventories,
                    known.traits,
                    tree.mdev_classes,
                ):
                    rp = self._get(f"/resource_providers/{known.uuid}", report)
                    found.append(
                        self._clash(
                            provider.name, "it is not vgpu-driver's", rp, known.traits, report
                        )
                    )
                continue
            rp = self._find_by_name(provider.name, report)
            if rp is not None:
                found.append(
                    self._clash(
                        provider.name,
                        "it is the root of another provider tree"
                        if rp["parent_provider_uuid"] is None
                        else "it is in another provider tree",
                        rp,
                        None,
                        report,
                    )
                )
        return found

    def _clash(
        self,
        name: str,
        reason: str,
        rp: Mapping[str, Any],
        traits: Iterable[str] | None,
        report: SyncReport,
    ) -> ownership.Clash:
        if traits is None:
            traits = self._get(f"/resource_providers/{rp['uuid']}/traits", report)["traits"]
        if rp["parent_provider_uuid"] is None:
            where = "a root provider"
        else:
            parent = self._name_of(rp["parent_provider_uuid"], report)
            where = f"parent {parent}"
            if rp["root_provider_uuid"] != rp["parent_provider_uuid"]:
                where += f", root {self._name_of(rp['root_provider_uuid'], report)}"
        return ownership.Clash(name, reason, where, tuple(sorted(traits)))

    def _name_of(self, uuid: str, report: SyncReport) -> str:
        name: str = self._get(f"/resource_providers/{uuid}", report)["name"]
        return name
