"""The desired provider tree -> Placement, through openstacksdk.

:class:`ProviderSync` keeps the last known generation, inventory and traits
of each provider, so a sync that changes nothing costs one read and no
write.  Writes honour generations: a 409 re-reads that provider and tries
again (bounded, with backoff).  Server errors, timeouts and refused
connections are retried, then reported as PlacementUnavailable; the first
request of a sync is a read, so an unreachable Placement is found before
anything is written.  Traits vgpu-driver manages (``CUSTOM_MDEV_*``,
``CUSTOM_VGPU_*``) are set and removed as the GPU's type changes; any other
trait on a provider (an operator's) is kept.
"""

import dataclasses
import time
from urllib import parse

from keystoneauth1 import adapter as ks_adapter
from keystoneauth1 import exceptions as ks_exceptions
from oslo_log import log as logging

from vgpu_driver import exception
from vgpu_driver import names

LOG = logging.getLogger(__name__)

MICROVERSION = "1.39"
MANAGED_TRAIT_PREFIXES = ("CUSTOM_MDEV_", "CUSTOM_VGPU_")
# Standard traits that mark a provider as another service's: nova's PCI
# devices in Placement, and Cyborg's accelerators.
FOREIGN_OWNER_TRAITS = frozenset({"COMPUTE_MANAGED_PCI_DEVICE", "OWNER_CYBORG"})


class PlacementError(exception.VgpuDriverError):
    msg_fmt = "Placement refused %(method)s %(url)s: HTTP %(status)s %(detail)s"


class PlacementUnavailable(exception.VgpuDriverError):
    msg_fmt = ("Placement did not answer %(method)s %(url)s after %(attempts)d attempts "
               "(%(reason)s); nothing more was written. Check the [placement] options "
               "and that Placement is up.")


class Conflict(exception.VgpuDriverError):
    """HTTP 409: a generation moved under us (retried), or a name is taken."""

    msg_fmt = "Placement refused %(method)s %(url)s: HTTP 409 %(detail)s"


class KeystoneUnavailable(exception.VgpuDriverError):
    msg_fmt = ("Keystone did not answer at %(auth_url)s (%(reason)s); nothing was sent to "
               "Placement. Check [placement] auth_url and that Keystone is up.")


class KeystoneRefused(exception.VgpuDriverError):
    msg_fmt = ("Keystone refused the credentials for Placement at %(auth_url)s (%(reason)s); "
               "check the [placement] auth options (username, password, project).")


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


class Client:
    """Placement's REST API with retries, over an openstacksdk Connection.

    The Connection provides the session (auth, TLS, catalog); requests go
    through a plain keystoneauth adapter for the ``placement`` service, as
    nova's own client does.  (The SDK's proxy would discover API versions on
    first use, outside the retries, so a Placement that is down would fail
    there with an unhelpful error.)
    """

    def __init__(self, connection, attempts=4, backoff=0.2, sleep=time.sleep):
        config = connection.config
        self.proxy = ks_adapter.Adapter(
            session=connection.session, service_type="placement",
            interface=config.get_interface("placement"),
            region_name=config.get_region_name("placement"),
            endpoint_override=config.get_endpoint("placement"))
        self.attempts = attempts
        self.backoff = backoff
        self.sleep = sleep
        self._authenticated = False

    def _authenticate(self):
        """Get a token first, so a Keystone fault is named as Keystone's and
        not taken for Placement's."""
        if self._authenticated:
            return
        auth_url = getattr(self.proxy.session.auth, "auth_url", None) or "(no auth_url)"
        try:
            self.proxy.get_token()
        except ks_exceptions.ConnectionError as exc:
            raise KeystoneUnavailable(auth_url=auth_url,
                                      reason=f"{type(exc).__name__}: {exc}") from exc
        except ks_exceptions.ClientException as exc:
            raise KeystoneRefused(auth_url=auth_url,
                                  reason=f"{type(exc).__name__}: {exc}") from exc
        self._authenticated = True

    def request(self, method, url, body=None, report=None):
        """The JSON answer (or None); raises Conflict, PlacementError, or
        PlacementUnavailable once retries are spent."""
        self._authenticate()
        reason = ""
        for attempt in range(1, self.attempts + 1):
            if report is not None:
                setattr(report, "reads" if method == "GET" else "writes",
                        getattr(report, "reads" if method == "GET" else "writes") + 1)
            try:
                response = self.proxy.request(url, method, json=body,
                                              microversion=MICROVERSION, raise_exc=False)
            except ks_exceptions.ConnectionError as exc:  # refused, timed out, reset
                reason = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code == 409:
                    raise Conflict(method=method, url=url, detail=response.text[:300])
                if response.status_code < 500:
                    if response.status_code >= 400:
                        raise PlacementError(method=method, url=url,
                                             status=response.status_code,
                                             detail=response.text[:300])
                    return response.json() if response.content else None
                reason = f"HTTP {response.status_code}"
            if attempt < self.attempts:
                self.sleep(self.backoff * 2 ** (attempt - 1))
        raise PlacementUnavailable(method=method, url=url, attempts=self.attempts,
                                   reason=reason)


def query_url(path, **params):
    """``path`` with its query parameters URL-encoded: a name holding ``+``,
    ``&`` or ``#`` must reach Placement as written."""
    return f"{path}?{parse.urlencode(params)}"


def exact_name_match(providers, name):
    """The one provider of ``providers`` named exactly ``name``, or None: an
    answer is never trusted to hold only what the query asked for."""
    matches = [p for p in providers if p.get("name") == name]
    if len(matches) > 1:
        raise PlacementError(method="GET", url=query_url("/resource_providers", name=name),
                             status=200, detail=f"{len(matches)} providers named {name!r}")
    return matches[0] if matches else None


def is_managed_trait(trait):
    """A trait vgpu-driver sets from the GPU's type (an operator's is not)."""
    return trait.startswith(MANAGED_TRAIT_PREFIXES)


def with_managed_traits(traits, managed):
    """``traits`` with the managed ones replaced by ``managed``; any other
    trait (an operator's) is kept."""
    return {t for t in traits if not is_managed_trait(t)} | set(managed)


def is_vanished_gpu_provider(tree, name, parent_uuid, root_uuid, inventories, traits):
    """Whether a provider stands for a GPU of ``tree``'s host that is gone: a
    child of the root, named ``<root>_...``, that ``tree`` no longer has.

    Others share the root and the name prefix (nova names its PCI device
    providers ``<root>_<address>``).  A provider is taken for ours when it
    has only mdev classes, or a type trait we set (a class no longer
    configured); never with another owner's trait.
    """
    ours = (set(inventories) <= tree.mdev_classes
            or any(is_managed_trait(t) for t in traits))
    return (parent_uuid == root_uuid and name.startswith(f"{tree.root_name}_")
            and tree.provider(name) is None and ours
            and not set(traits) & FOREIGN_OWNER_TRAITS)


def why_unwanted(tree, name):
    """Why a provider of ours is no longer wanted: its GPU is gone, or it is
    there but no longer configured (listed in ``tree.unserved``)."""
    prefix = f"{tree.root_name}_"
    for address, reason in tree.unserved:
        if name in (f"{prefix}{address}", f"{prefix}{_provider_suffix(address)}"):
            if address in tree.vfs_pending:
                return f"its GPU {address} has no VFs now ({reason})"
            return f"its GPU {address} is no longer configured ({reason})"
    return "its GPU is gone"


def _provider_suffix(address):
    return names.parse_pci_address(address).provider_suffix if names.is_pci_address(
        address) else address


def fully_reserved(inventories):
    """The same inventories with everything reserved: a vanished GPU's
    provider that guests still hold takes no new allocation."""
    return {rc: {**inv, "reserved": inv["total"]} for rc, inv in inventories.items()}


class ProviderSync:
    """Keeps one compute node's GPU providers in Placement as desired."""

    def __init__(self, client, conflict_attempts=5, sleep=time.sleep):
        self.client = client
        self.conflict_attempts = conflict_attempts
        self.sleep = sleep
        self.known = {}          # provider name -> Known
        self.root_uuid = None
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
        found = self._get(query_url("/resource_providers", name=name),
                          report)["resource_providers"]
        return exact_name_match(found, name)

    def _observe(self, tree, report):
        """One read of the tree; re-read only providers whose generation moved."""
        if self.root_uuid is None:
            root = self._find_by_name(tree.root_name, report)
            if root is None:
                return []
            self.root_uuid = root["uuid"]
        listed = self._get(query_url("/resource_providers", in_tree=self.root_uuid),
                           report)["resource_providers"]
        seen = {p["name"] for p in listed}
        for name in [n for n in self.known if n not in seen]:
            del self.known[name]
        for rp in listed:
            known = self.known.get(rp["name"])
            if known is None or known.generation != rp["generation"]:
                self._load(rp["name"], rp["uuid"], rp["generation"],
                           rp["parent_provider_uuid"], report)
        return listed

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
            except Conflict:
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
            traits = with_managed_traits(known.traits, wanted_managed)
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
        except Conflict as exc:
            if "placement.duplicate_name" not in str(exc):
                raise
            # Created by an earlier attempt whose answer was lost: adopt it.
            answer = self._find_by_name(name, report)
            if answer is None:
                raise
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
            if not is_vanished_gpu_provider(tree, name, known.parent_uuid, self.root_uuid,
                                            known.inventories, known.traits):
                continue
            consumers = sorted(self.allocations(name, report))
            why = why_unwanted(tree, name)
            if not consumers:
                self._delete(name, report, dry_run, why)
                continue
            LOG.warning("Provider %s: %s but %s still hold allocations on it; %s it fully "
                        "reserved", name, why, ", ".join(consumers),
                        "would keep" if dry_run else "keeping")
            self._set_inventories(name, fully_reserved(known.inventories), report, dry_run)
            report.kept.append((name, consumers))

    def _delete(self, name, report, dry_run, why):
        def write(known):
            try:
                self._write(report, dry_run, "DELETE", f"/resource_providers/{known.uuid}")
            except PlacementError as exc:
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
