"""The desired provider tree -> Placement, with the fewest requests.

:class:`ProviderSync` writes on what it last read of each provider
(:class:`~vgpu_driver.placement.observed.ObservedTree`), so a sync that
changes nothing costs one read and no write.  Writes honour generations: a 409
re-reads that provider and tries again (bounded, with backoff).  The first
request of a sync is a read, so an unreachable Placement is found before
anything is written.  So is a provider the sync would write that is not
vgpu-driver's (found by the reads of :mod:`~vgpu_driver.placement.observed`):
the sync then writes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from collections.abc import Iterable
from typing import TYPE_CHECKING
from typing import Any
from typing import NoReturn

from oslo_log import log as logging

from vgpu_driver import exception
from vgpu_driver.placement import observed
from vgpu_driver.placement import ownership

if TYPE_CHECKING:
    from vgpu_driver.inventory import GpuProvider
    from vgpu_driver.inventory import ProviderTree
    from vgpu_driver.placement.client import Client

LOG = logging.getLogger(__name__)


class ProviderSync(observed.ObservedTree):
    """Keeps one compute node's GPU providers in Placement as desired."""

    def __init__(
        self,
        client: Client,
        conflict_attempts: int = 5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(client)
        self.conflict_attempts = conflict_attempts
        self.sleep = sleep
        self._traits: set[str] = set()  # custom traits known to exist
        # Custom resource classes known to exist.
        self._resource_classes: set[str] = set()

    def _refuse(self, clash: ownership.Clash) -> NoReturn:
        raise exception.ProviderNotOurs(**clash.kwargs())

    # -- writing ------------------------------------------------------------------------

    def _write(
        self, report: observed.SyncReport, dry_run: bool, method: str, url: str, body: Any = None
    ) -> Any:
        report.planned.append((method, url, body))
        if dry_run:
            return None
        return self.client.request(method, url, body, report=report)

    def _retrying(
        self, name: str, report: observed.SyncReport, write: Callable[[observed.Known], None]
    ) -> None:
        """Run ``write(known)``; on 409 re-read the provider and try again."""
        for attempt in range(1, self.conflict_attempts + 1):
            try:
                return write(self.known[name])
            except exception.Conflict:
                if attempt == self.conflict_attempts:
                    raise
                LOG.info("Generation conflict on %s; re-reading it (attempt %d)", name, attempt)
                self.sleep(0.05 * 2 ** (attempt - 1))
                rp = self._get(f"/resource_providers/{self.known[name].uuid}", report)
                self._load(name, rp["uuid"], rp["generation"], rp["parent_provider_uuid"], report)

    def _ensure_resource_classes(
        self, inventories: Iterable[str], report: observed.SyncReport, dry_run: bool
    ) -> None:
        for rc in sorted(rc for rc in inventories if rc.startswith("CUSTOM_")):
            if rc not in self._resource_classes:
                self._write(report, dry_run, "PUT", f"/resource_classes/{rc}")
                self._resource_classes.add(rc)

    def _set_inventories(
        self,
        name: str,
        inventories: dict[str, dict[str, Any]],
        report: observed.SyncReport,
        dry_run: bool,
    ) -> None:
        def write(known: observed.Known) -> None:
            if known.inventories == inventories:
                return
            self._ensure_resource_classes(inventories, report, dry_run)
            answer = self._write(
                report,
                dry_run,
                "PUT",
                f"/resource_providers/{known.uuid}/inventories",
                {"resource_provider_generation": known.generation, "inventories": inventories},
            )
            if answer is not None:
                known.generation = answer["resource_provider_generation"]
                known.inventories = answer["inventories"]

        self._retrying(name, report, write)

    def _set_traits(
        self, name: str, wanted_managed: Iterable[str], report: observed.SyncReport, dry_run: bool
    ) -> None:
        def write(known: observed.Known) -> None:
            traits = ownership.with_managed_traits(known.traits, wanted_managed)
            if traits == known.traits:
                return
            for trait in sorted(t for t in traits - self._traits if t.startswith("CUSTOM_")):
                self._write(report, dry_run, "PUT", f"/traits/{trait}")
                self._traits.add(trait)
            answer = self._write(
                report,
                dry_run,
                "PUT",
                f"/resource_providers/{known.uuid}/traits",
                {"resource_provider_generation": known.generation, "traits": sorted(traits)},
            )
            if answer is not None:
                known.generation = answer["resource_provider_generation"]
                known.traits = frozenset(answer["traits"])

        self._retrying(name, report, write)

    def _create(
        self, name: str, parent_uuid: str | None, report: observed.SyncReport, dry_run: bool
    ) -> str:
        body = {"name": name}
        if parent_uuid:
            body["parent_provider_uuid"] = parent_uuid
        try:
            answer = self._write(report, dry_run, "POST", "/resource_providers", body)
        except exception.Conflict as exc:
            if "placement.duplicate_name" not in str(exc):
                raise
            # Created by an earlier attempt whose answer was lost: adopt it,
            # unless another took the name since it was looked up.
            answer = self._find_by_name(name, report)
            if answer is None:
                raise
            if answer["parent_provider_uuid"] != parent_uuid:
                self._refuse(
                    self._clash(
                        name,
                        "it was created meanwhile, outside this host's tree",
                        answer,
                        None,
                        report,
                    )
                )
        uuid = answer["uuid"] if answer else f"<new {name}>"
        self.known[name] = observed.Known(
            uuid, answer["generation"] if answer else 0, {}, frozenset(), parent_uuid
        )
        report.created.append(name)
        return uuid

    # -- the sync --------------------------------------------------------------------------

    def sync(self, tree: ProviderTree, dry_run: bool = False) -> observed.SyncReport:
        """Make Placement match ``tree``; returns a SyncReport."""
        report = observed.SyncReport()
        self._observe(tree, report)
        for clash in self.clashes(tree, report):
            self._refuse(clash)
        if self.root_uuid is None:
            self.root_uuid = self._create(tree.root_name, None, report, dry_run)
        before = {n: (k.inventories, k.traits) for n, k in self.known.items()}
        for provider in tree.providers:
            if provider.name not in self.known:
                self._create(provider.name, self.root_uuid, report, dry_run)
            self._set_inventories(provider.name, provider.inventory(), report, dry_run)
            self._set_traits(provider.name, provider.traits, report, dry_run)
            if provider.name in before and before[provider.name] != (
                self.known[provider.name].inventories,
                self.known[provider.name].traits,
            ):
                report.updated.append(provider.name)
        self._prune(tree, self.root_uuid, report, dry_run)
        return report

    def _prune(
        self, tree: ProviderTree, root_uuid: str, report: observed.SyncReport, dry_run: bool
    ) -> None:
        """Providers of GPUs that vanished: deleted when unused, else reserved."""
        for name, known in list(self.known.items()):
            if not ownership.is_vanished_gpu_provider(
                tree, name, known.parent_uuid, root_uuid, known.inventories, known.traits
            ):
                continue
            consumers = sorted(self.allocations(name, report))
            why = ownership.why_unwanted(tree, name)
            if not consumers:
                self._delete(name, report, dry_run, why)
                continue
            LOG.warning(
                "Provider %s: %s but %s still hold allocations on it; %s it fully reserved",
                name,
                why,
                ", ".join(consumers),
                "would keep" if dry_run else "keeping",
            )
            self._set_inventories(
                name, ownership.fully_reserved(known.inventories), report, dry_run
            )
            report.kept.append((name, consumers))

    def _delete(self, name: str, report: observed.SyncReport, dry_run: bool, why: str) -> None:
        def write(known: observed.Known) -> None:
            try:
                self._write(report, dry_run, "DELETE", f"/resource_providers/{known.uuid}")
            except exception.PlacementError as exc:
                if exc.kwargs.get("status") != 404:
                    raise
                # Gone already: an earlier attempt's answer was lost.

        self._retrying(name, report, write)
        if not dry_run:
            del self.known[name]
        report.deleted.append(name)
        LOG.info(
            "%s provider %s: %s and nothing is allocated on it",
            "Would delete" if dry_run else "Deleted",
            name,
            why,
        )

    def provider_uuids(self, tree: ProviderTree) -> dict[str, GpuProvider]:
        """``{rp uuid: GpuProvider}`` for the tree's providers known here."""
        return {self.known[p.name].uuid: p for p in tree.providers if p.name in self.known}
