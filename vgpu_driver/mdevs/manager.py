"""The claims transaction around a plan, and the writes that carry it out.

:meth:`MdevManager.allocate` reads each GPU asked for through its strategy
(:mod:`vgpu_driver.mdevs.strategies`), lets the planner decide
(:mod:`vgpu_driver.mdevs.planner`) and writes the decision's claims in one
journal transaction before any vGPU is created or handed out; the creations
follow, through the host abstraction (whose writes go through the privileged
helper).  If anything goes wrong after the claims are written, the claims
this call added are dropped again; those the instance held before stay.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Container
from collections.abc import Iterable
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

from oslo_log import log as logging

from vgpu_driver import claims as claims_mod
from vgpu_driver import claims_journal
from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import removals as removals_mod
from vgpu_driver.mdevs import planner
from vgpu_driver.mdevs import strategies

if TYPE_CHECKING:
    from vgpu_driver.conf.mdev_settings import MdevConfig
    from vgpu_driver.domains import DomainReferences
    from vgpu_driver.host_snapshot import HostSnapshot
    from vgpu_driver.host_snapshot import PhysicalGPU
    from vgpu_driver.inventory import GpuProvider
    from vgpu_driver.sysfs.writes import WritableSysfs

LOG = logging.getLogger(__name__)


class MdevManager:
    """The mdev lifecycle of one host: allocate and release, claims first."""

    def __init__(
        self,
        host: WritableSysfs,
        journal: claims_journal.Journal,
        domains: DomainReferences,
        mdev_config: MdevConfig,
        *,
        remove_on_release: bool = False,
        remove_timeout: float = 30.0,
        removals: removals_mod.Removals | None = None,
    ) -> None:
        self.host = host
        self.journal = journal
        self.domains = domains
        self.config = mdev_config
        self.remove_on_release = remove_on_release
        self.remove_timeout = remove_timeout
        #: The removal writers in flight (one per vGPU at most).
        self.removals = removals or removals_mod.Removals()
        #: Told each vGPU whose removal returned, before those waiting for
        #: the removal are (the cached discovery reads its GPU again).
        self.vgpu_removed: Callable[[str], object] = lambda vgpu: None
        self._snapshot: HostSnapshot | None = None
        # vGPUs whose removal waits for a domain to let go, already logged.
        self._held_by_domain: set[str] = set()

    # -- the host's structure, cached: which parents each GPU has ---------------------

    def snapshot(self, refresh: bool = False) -> HostSnapshot:
        if refresh or self._snapshot is None:
            self._snapshot = discovery.discover(self.host)
        return self._snapshot

    def use_snapshot(self, snapshot: HostSnapshot) -> HostSnapshot:
        """Take a snapshot read elsewhere (the cached discovery) as current."""
        self._snapshot = snapshot
        return snapshot

    def _for_gpu(self, gpu: PhysicalGPU) -> strategies._Strategy:
        return strategies.for_gpu(gpu, self.host, self.domains, self.config)

    def _for_vgpu(self, vgpu_id: str) -> strategies._Strategy:
        return strategies.for_vgpu(vgpu_id, self.host, self.domains, self.config)

    def _gpu_state(
        self, instance: str, address: str, type_id: str, users: Container[str]
    ) -> planner.GpuState:
        """The GPU's live state for the planner; refreshes a stale cache."""
        for refresh in (False, True):
            gpu = self.snapshot(refresh=refresh).gpu(address)
            state = (
                None if gpu is None else self._for_gpu(gpu).gpu_state(instance, gpu, type_id, users)
            )
            if state is not None:
                break
        if state is None or not state.parents:
            raise exception.GpuGone(instance=instance, gpu=address)
        return state

    # -- allocation ---------------------------------------------------------------------

    def allocate(
        self,
        instance_uuid: str,
        allocations: Mapping[str, Mapping[str, Any]],
        providers: Mapping[str, GpuProvider],
        state: str = claims_mod.CLAIMED,
        type_traits: Iterable[str] | None = None,
    ) -> list[str]:
        """The mdev UUIDs for an instance's allocation, claimed and present.

        ``allocations`` is Placement's ``{rp_uuid: {"resources": {rc: n}}}``;
        ``providers`` maps those rp UUIDs to this host's ``GpuProvider``.
        Calling it again for the same instance returns the same mdevs.
        ``state`` is the claims' (``migrating_in`` for an incoming migration);
        ``type_traits`` those the flavor requires (they name the type of a
        mixed-size board's vGPUs, :func:`planner.requests_of`).
        """
        requests = planner.requests_of(
            instance_uuid, allocations, providers, self.config.mdev_classes, type_traits
        )
        if not requests:
            return []
        # Read before the lock, which only ever waits for claims: a vGPU a
        # domain took since was claimed first, and the claims are re-read.
        users = self.domains.mdev_users()
        with self.journal.transaction() as txn:
            claimed = txn.on_gpu_or_of(sorted({r.gpu for r in requests}), instance_uuid)
            plan = self._plan(instance_uuid, requests, claimed, users)
            added = planner.new_claims(plan, claimed, instance_uuid)
            for item in added:
                txn.add(
                    instance_uuid,
                    item.mdev_uuid,
                    item.gpu,
                    item.parent,
                    item.type_id,
                    state,
                    created=item.create,
                )
        try:
            for item in plan:
                if item.create:
                    self._for_vgpu(item.mdev_uuid).create(instance_uuid, item)
        except BaseException:
            # Whatever went wrong (a kernel refusal, a timeout, a bug), the
            # claims this call added must not outlive it; those it reused
            # were the instance's before and stay.
            self._undo(instance_uuid, added)
            raise
        LOG.info(
            "Instance %s gets mdevs %s",
            instance_uuid,
            ", ".join(
                f"{p.mdev_uuid} ({'created' if p.create else 'reused'} on {p.parent})" for p in plan
            ),
        )
        return [item.mdev_uuid for item in plan]

    def _plan(
        self,
        instance: str,
        requests: Iterable[planner.Request],
        claimed: Mapping[str, claims_mod.Claim],
        users: Container[str],
    ) -> list[planner.Planned]:
        """Each GPU read, then planned, in turn: a refusal stops the reading."""
        plan: list[planner.Planned] = []
        for request in requests:
            state = self._gpu_state(instance, request.gpu, request.type_id, users)
            plan += planner.plan_gpu(instance, request, state, claimed, users)
        return plan

    def _undo(self, instance_uuid: str, added: list[planner.Planned]) -> None:
        """Drop the claims a failed allocation added; what it created stays free."""
        if not added:
            return
        with self.journal.transaction() as txn:
            txn.remove(instance_uuid, [p.mdev_uuid for p in added])
        LOG.warning("Released the claims of a failed allocation for %s", instance_uuid)

    # -- after the guest is defined, and when it goes ---------------------------------------

    def mark_attached(self, instance_uuid: str) -> int:
        """The instance's domain now uses its claimed (or migrated-in)
        vGPUs.  A ``releasing`` claim stays so: its vGPU is going (a removal
        the kernel still blocks, from a move away from this host that the
        guest has since come back from), and no domain refers to it."""
        with self.journal.transaction() as txn:
            return txn.set_state(
                instance_uuid,
                claims_mod.ATTACHED,
                from_states=(claims_mod.CLAIMED, claims_mod.MIGRATING_IN, claims_mod.ATTACHED),
            )

    def release(self, instance_uuid: str) -> list[str]:
        """Forget an instance's claims; remove its vGPUs if so configured.

        Kept, an mdev (or a VF with its type) is free for the next guest.
        With removal, claims stay (``releasing``) until the kernel has removed
        the mdev (the driver cleared the VF's type), so nothing can hand it
        out while it goes.  A vGPU of a type that shares mixed-size boards
        always goes: kept, its framebuffer would serve that type alone.
        """
        with self.journal.transaction() as txn:
            mine = txn.claims(instance_uuid)
            going = [c.mdev_uuid for c in mine if self._goes_on_release(c.type_id)]
            kept = [c.mdev_uuid for c in mine if c.mdev_uuid not in going]
            if kept:
                txn.remove(instance_uuid, kept)
            if not going:
                return kept
            txn.set_state(instance_uuid, claims_mod.RELEASING, going)
        return kept + self.finish_release(going)

    def drop_stale(self, stale: Iterable[claims_mod.Claim]) -> list[claims_mod.Claim]:
        """Drop claims an earlier read found stale, those still unchanged;
        the dropped ones.  Their vGPUs go as a release's do (:meth:`release`):
        a guest that never came, or went without telling this host (nova
        deletes an offloaded server without its last compute), must not
        leave behind a vGPU nothing will ever remove."""
        with self.journal.transaction() as txn:
            dropped = txn.remove_exact(stale)
            going = [c for c in dropped if self._goes_on_release(c.type_id)]
            for claim in going:
                txn.add(
                    claim.instance_uuid,
                    claim.mdev_uuid,
                    claim.gpu,
                    claim.parent,
                    claim.type_id,
                    claims_mod.RELEASING,
                    claim.created,
                )
        if going:
            self.finish_release([c.mdev_uuid for c in going])
        return dropped

    def _goes_on_release(self, type_id: str) -> bool:
        return self.remove_on_release or type_id in self.config.mixed_types

    def finish_release(self, mdev_uuids: Iterable[str], wait: float | None = None) -> list[str]:
        """Remove vGPUs held ``releasing`` and drop their claims once gone.

        A vendor-VFIO vGPU goes by clearing its VF's type (writing 0).  Each
        removal has one writer at most (:mod:`vgpu_driver.removals`); this
        call waits for them together, ``wait`` seconds at most (default
        ``mdev_remove_timeout``), and leaves those the kernel still blocks in
        flight, their claims ``releasing``.
        """
        wait = self.remove_timeout if wait is None else wait
        called = self.removals.clock()
        users = self.domains.mdev_users()
        done: list[str] = []
        started: dict[str, removals_mod.Removal | None] = {}
        for uuid in mdev_uuids:
            if uuid in users:
                self._wait_for_domain(uuid, users[uuid].name)
                continue
            started[uuid] = self.removals.remove(uuid, self._destroy, 0)
        self._held_by_domain &= set(users)
        deadline = self.removals.clock() + wait
        for uuid, removal in started.items():
            # A writer an earlier call started is not waited for: when it
            # returns, the host reconciler is told.
            earlier = removal is not None and removal.started_at < called
            if not earlier and (removal is None or removal.state == removals_mod.IN_FLIGHT):
                removal = self.removals.remove(
                    uuid, self._destroy, deadline - self.removals.clock()
                )
            if self._removed(uuid, removal):
                done.append(uuid)
        if done:
            with self.journal.transaction() as txn:
                txn.remove(mdev_uuids=done, state=claims_mod.RELEASING)
        return done

    def _wait_for_domain(self, uuid: str, domain: str) -> None:
        """A domain still uses a vGPU its guest released (a guest that left
        is undefined after nova tells us): its claim stays ``releasing``,
        and a later pass of the host reconciler removes it once the domain
        lets go.  Dropping the claim would leave an mdev behind for good."""
        if uuid not in self._held_by_domain:
            self._held_by_domain.add(uuid)
            LOG.info("vGPU %s is removed once domain %s no longer uses it", uuid, domain)

    def _destroy(self, vgpu_id: str) -> None:
        # No timeout: the writer is the removal's own thread, and the
        # kernel's block cannot be cut short anyway.
        try:
            self._for_vgpu(vgpu_id).destroy(vgpu_id, None)
        finally:
            self.vgpu_removed(vgpu_id)

    def _removed(self, uuid: str, removal: removals_mod.Removal | None) -> bool:
        if removal is None:
            LOG.info(
                "vGPU %s waits for its removal: %d others are in flight", uuid, self.removals.limit
            )
            return False
        if removal.state == removals_mod.IN_FLIGHT:
            LOG.warning(
                "vGPU %s not removed yet: the kernel has blocked its removal "
                "for %.0fs (a guest still holds it); it stays reserved",
                uuid,
                self.removals.clock() - removal.started_at,
            )
            return False
        if removal.state == removals_mod.FAILED:
            LOG.warning("vGPU %s not removed yet: %s", uuid, removal.error)
            return False
        return True
