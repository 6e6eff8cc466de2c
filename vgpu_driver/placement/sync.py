"""The desired provider tree -> Placement, with the fewest requests.

:class:`ProviderSync` keeps the last known generation, inventory and traits
of each provider, so a sync that changes nothing costs one read and no
write.  Writes honour generations: a 409 re-reads that provider and tries
again (bounded, with backoff).  The first request of a sync is a read, so an
unreachable Placement is found before anything is written.  So is a provider
the sync would write that is not vgpu-driver's (:meth:`ProviderSync.clashes`):
the sync then writes nothing.
"""

import dataclasses
import time

from oslo_log import log as logging

from vgpu_driver import exception
from vgpu_driver.placement import client as placement_client
from vgpu_driver.placement import ownership

LOG = logging.getLogger(__name__)


@dataclasses.dataclass
class Known:
    uuid: str
    generation: int
    inventories: dict
    traits: frozenset
    parent_uuid: str | None = None


@dataclasses.dataclass
class SyncReport:
    reads: int = 0
    writes: int = 0
    planned: list = dataclasses.field(default_factory=list)   # (method, url, body)
    created: list = dataclasses.field(default_factory=list)
    updated: list = dataclasses.field(default_factory=list)
    deleted: list = dataclasses.field(default_factory=list)
    kept: list = dataclasses.field(default_factory=list)      # (name, consumers)


class ProviderSync:
    """Keeps one compute node's GPU providers in Placement as desired."""

    def __init__(self, client, conflict_attempts=5, sleep=time.sleep):
        self.client = client
        self.conflict_attempts = conflict_attempts
        self.sleep = sleep
        self.known = {}          # provider name -> Known
        self.root_uuid = None
        self._foreign_root = None  # the provider named as the root, when it has a parent
        self._traits = set()     # custom traits known to exist
        self._resource_classes = set()  # custom resource classes known to exist

    # -- reading ------------------------------------------------------------------------

    def _get(self, url, report):
        return self.client.request("GET", url, report=report)

    def _load(self, name, uuid, generation, parent_uuid, report):
        base = f"/resource_providers/{uuid}"
        inventories = self._get(f"{base}/inventories", report)["inventories"]
        traits = self._get(f"{base}/traits", report)["traits"]
        self.known[name] = Known(uuid, generation, inventories, frozenset(traits),
                                 parent_uuid)

    def observe(self, tree, report=None):
        """Bring ``known`` up to date with Placement (one read when nothing moved)."""
        return self._observe(tree, report if report is not None else SyncReport())

    def allocations(self, name, report=None):
        """``{consumer: {resource class: units}}`` on one known provider."""
        answer = self._get(f"/resource_providers/{self.known[name].uuid}/allocations",
                           report if report is not None else SyncReport())
        return {consumer: dict(data["resources"])
                for consumer, data in answer["allocations"].items()}

    def _find_by_name(self, name, report):
        """The provider named exactly ``name``, or None."""
        found = self._get(placement_client.query_url("/resource_providers", name=name),
                          report)["resource_providers"]
        return placement_client.exact_name_match(found, name)

    def _observe(self, tree, report):
        """One read of the tree; re-read only providers whose generation moved."""
        if self.root_uuid is None:
            root = self._find_by_name(tree.root_name, report)
            self._foreign_root = root if root and root["parent_provider_uuid"] else None
            if root is None or self._foreign_root is not None:
                return []
            self.root_uuid = root["uuid"]
        url = placement_client.query_url("/resource_providers", in_tree=self.root_uuid)
        listed = self._get(url, report)["resource_providers"]
        seen = {p["name"] for p in listed}
        for name in [n for n in self.known if n not in seen]:
            del self.known[name]
        for rp in listed:
            known = self.known.get(rp["name"])
            if known is None or known.generation != rp["generation"]:
                self._load(rp["name"], rp["uuid"], rp["generation"],
                           rp["parent_provider_uuid"], report)
        return listed

    # -- ownership ------------------------------------------------------------------------

    def clashes(self, tree, report=None):
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
            return [self._clash(tree.root_name, "it would be this host's root provider but "
                                "is another provider's child", self._foreign_root, None,
                                report)]
        found = []
        for provider in tree.providers:
            known = self.known.get(provider.name)
            if known is not None:
                if not ownership.is_ours(known.parent_uuid, self.root_uuid, known.inventories,
                                         known.traits, tree.mdev_classes):
                    rp = self._get(f"/resource_providers/{known.uuid}", report)
                    found.append(self._clash(provider.name, "it is not vgpu-driver's", rp,
                                             known.traits, report))
                continue
            rp = self._find_by_name(provider.name, report)
            if rp is not None:
                found.append(self._clash(
                    provider.name, "it is the root of another provider tree"
                    if rp["parent_provider_uuid"] is None else "it is in another provider tree",
                    rp, None, report))
        return found

    def _clash(self, name, reason, rp, traits, report):
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

    def _name_of(self, uuid, report):
        return self._get(f"/resource_providers/{uuid}", report)["name"]

    def _refuse(self, clash):
        raise exception.ProviderNotOurs(**clash.kwargs())

    # -- writing ------------------------------------------------------------------------

    def _write(self, report, dry_run, method, url, body=None):
        report.planned.append((method, url, body))
        if dry_run:
            return None
        return self.client.request(method, url, body, report=report)

    def _retrying(self, name, report, write):
        """Run ``write(known)``; on 409 re-read the provider and try again."""
        for attempt in range(1, self.conflict_attempts + 1):
            try:
                return write(self.known[name])
            except placement_client.Conflict:
                if attempt == self.conflict_attempts:
                    raise
                LOG.info("Generation conflict on %s; re-reading it (attempt %d)", name,
                         attempt)
                self.sleep(0.05 * 2 ** (attempt - 1))
                rp = self._get(f"/resource_providers/{self.known[name].uuid}", report)
                self._load(name, rp["uuid"], rp["generation"], rp["parent_provider_uuid"],
                           report)

    def _ensure_resource_classes(self, inventories, report, dry_run):
        for rc in sorted(rc for rc in inventories if rc.startswith("CUSTOM_")):
            if rc not in self._resource_classes:
                self._write(report, dry_run, "PUT", f"/resource_classes/{rc}")
                self._resource_classes.add(rc)

    def _set_inventories(self, name, inventories, report, dry_run):
        def write(known):
            if known.inventories == inventories:
                return
            self._ensure_resource_classes(inventories, report, dry_run)
            answer = self._write(report, dry_run, "PUT",
                                 f"/resource_providers/{known.uuid}/inventories",
                                 {"resource_provider_generation": known.generation,
                                  "inventories": inventories})
            if answer is not None:
                known.generation = answer["resource_provider_generation"]
                known.inventories = answer["inventories"]
        self._retrying(name, report, write)

    def _set_traits(self, name, wanted_managed, report, dry_run):
        def write(known):
            traits = ownership.with_managed_traits(known.traits, wanted_managed)
            if traits == known.traits:
                return
            for trait in sorted(t for t in traits - self._traits if t.startswith("CUSTOM_")):
                self._write(report, dry_run, "PUT", f"/traits/{trait}")
                self._traits.add(trait)
            answer = self._write(report, dry_run, "PUT",
                                 f"/resource_providers/{known.uuid}/traits",
                                 {"resource_provider_generation": known.generation,
                                  "traits": sorted(traits)})
            if answer is not None:
                known.generation = answer["resource_provider_generation"]
                known.traits = frozenset(answer["traits"])
        self._retrying(name, report, write)

    def _create(self, name, parent_uuid, report, dry_run):
        body = {"name": name}
        if parent_uuid:
            body["parent_provider_uuid"] = parent_uuid
        try:
            answer = self._write(report, dry_run, "POST", "/resource_providers", body)
        except placement_client.Conflict as exc:
            if "placement.duplicate_name" not in str(exc):
                raise
            # Created by an earlier attempt whose answer was lost: adopt it,
            # unless another took the name since it was looked up.
            answer = self._find_by_name(name, report)
            if answer is None:
                raise
            if answer["parent_provider_uuid"] != parent_uuid:
                self._refuse(self._clash(name, "it was created meanwhile, outside this "
                                         "host's tree", answer, None, report))
        uuid = answer["uuid"] if answer else f"<new {name}>"
        self.known[name] = Known(uuid, answer["generation"] if answer else 0, {},
                                 frozenset(), parent_uuid)
        report.created.append(name)
        return uuid

    # -- the sync --------------------------------------------------------------------------

    def sync(self, tree, dry_run=False):
        """Make Placement match ``tree``; returns a SyncReport."""
        report = SyncReport()
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
                    self.known[provider.name].inventories, self.known[provider.name].traits):
                report.updated.append(provider.name)
        self._prune(tree, report, dry_run)
        return report

    def _prune(self, tree, report, dry_run):
        """Providers of GPUs that vanished: deleted when unused, else reserved."""
        for name, known in list(self.known.items()):
            if not ownership.is_vanished_gpu_provider(
                    tree, name, known.parent_uuid, self.root_uuid, known.inventories,
                    known.traits):
                continue
            consumers = sorted(self.allocations(name, report))
            why = ownership.why_unwanted(tree, name)
            if not consumers:
                self._delete(name, report, dry_run, why)
                continue
            LOG.warning("Provider %s: %s but %s still hold allocations on it; %s it fully "
                        "reserved", name, why, ", ".join(consumers),
                        "would keep" if dry_run else "keeping")
            self._set_inventories(name, ownership.fully_reserved(known.inventories), report,
                                  dry_run)
            report.kept.append((name, consumers))

    def _delete(self, name, report, dry_run, why):
        def write(known):
            try:
                self._write(report, dry_run, "DELETE", f"/resource_providers/{known.uuid}")
            except placement_client.PlacementError as exc:
                if exc.kwargs.get("status") != 404:
                    raise
                # Gone already: an earlier attempt's answer was lost.
        self._retrying(name, report, write)
        if not dry_run:
            del self.known[name]
        report.deleted.append(name)
        LOG.info("%s provider %s: %s and nothing is allocated on it",
                 "Would delete" if dry_run else "Deleted", name, why)

    def provider_uuids(self, tree):
        """``{rp uuid: GpuProvider}`` for the tree's providers known here."""
        return {self.known[p.name].uuid: p for p in tree.providers if p.name in self.known}
