"""Putting a host's mdevs right: orphans, stale types, reboots, stale claims.

* An **orphan** is an mdev no domain and no claim references.  Orphans of a
  type the GPU no longer serves are removed automatically, so a GPU can
  switch types; others are removed on request (``vgpu-manage orphans``).
* After a **reboot** the kernel has no mdevs and SR-IOV VFs come back only
  once the vendor's enablement has run; every mdev a guest or claim still
  references is created again, with its UUID, on its GPU.
* A **stale claim** is one no guest came to use, or whose guest is gone, or
  an incoming live migration's that neither finished nor rolled back.

Removals hold a ``releasing`` claim while the kernel works, so nothing hands
the mdev out meanwhile.

The same holds for vGPUs of NVIDIA's vendor-specific VFIO framework, a VF
given a type: an orphan is a typed VF nobody references, removing it clears
its type, and a reboot (VFs come back untyped) sets each claimed VF's type
again.  A VF is its guest's own device, so it is restored on that VF only.
"""

import dataclasses
import time

from oslo_log import log as logging

from vgpu_driver import claims as claims_mod
from vgpu_driver import exception
from vgpu_driver import inventory
from vgpu_driver import names

LOG = logging.getLogger(__name__)

RECLAIMER = "vgpu-driver:reclaim"

FREE = "free"
STALE_TYPE = "stale-type"
UNMANAGED = "unmanaged"


@dataclasses.dataclass(frozen=True)
class Orphan:
    mdev_uuid: str
    parent: str
    gpu: str
    type_id: str
    kind: str          # free | stale-type | unmanaged
    age: float | None  # seconds since the mdev appeared


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What happened to one mdev during a reconcile step."""

    mdev_uuid: str
    result: str        # removed | kept | restored | failed | waiting | skipped | would-remove
    reason: str = ""


class Reconciler:
    def __init__(self, manager, clock=time.time):
        self.manager = manager
        self.clock = clock

    @property
    def host(self):
        return self.manager.host

    # -- orphans --------------------------------------------------------------------------

    def orphans(self, grace=0.0, referenced=None, kinds=None):
        """Unreferenced vGPUs older than ``grace`` seconds: mdevs by UUID,
        then typed vendor-VFIO VFs by address.

        ``referenced``: what :meth:`in_use` just said, if the caller has it;
        the host is then not read again (its cached snapshot is used).
        ``kinds``: only orphans of these kinds (their age is read from sysfs
        only then: the periodic update wants stale types alone).
        """
        if referenced is None:
            snapshot = self.manager.snapshot(refresh=True)
            referenced = self._referenced(snapshot)
        else:
            snapshot = self.manager.snapshot()
        kind_of = self._kind_by_parent(snapshot)
        now = self.clock()
        found = []
        for vgpu in snapshot.vgpus:
            if vgpu.id in referenced:
                continue
            gpu, serves = kind_of.get(vgpu.parent, (None, None))
            # On a mixed-size board a free typed VF is reclaimed as a stale
            # type would be: its framebuffer would serve its own type alone.
            kind = UNMANAGED if serves is None else (
                FREE if serves == (vgpu.type_id,) else STALE_TYPE)
            if kinds is not None and kind not in kinds:
                continue
            created = self._created_at(vgpu)
            age = None if created is None else max(now - created, 0.0)
            if age is not None and age < grace:
                continue
            found.append(Orphan(vgpu.id, vgpu.parent, gpu.address if gpu else "",
                                vgpu.type_id, kind, age))
        return found

    def _kind_by_parent(self, snapshot):
        """``{parent: (gpu, types it serves or None)}``, the configuration
        resolved for the host once, not once per vGPU."""
        serves = inventory.configured_types(snapshot, self.manager.config)
        return {parent.name: (gpu, serves.get(gpu.address))
                for gpu in snapshot.gpus for parent in gpu.parents}

    def _referenced(self, snapshot):
        """vGPU ids a domain or a claim references.

        A domain source blind to PCI hostdevs cannot show a guest's VF: every
        typed VF then counts as referenced, so none is ever taken from a guest.
        """
        users = self.manager.domains.mdev_users()     # guests first: see provider_tree
        return self.referenced(snapshot, self.manager.journal.claims(), users)

    def _created_at(self, vgpu):
        if vgpu.is_vf:
            return self.host.vendor_vgpu_set_at(vgpu.parent)
        return self.host.mdev_created_at(vgpu.id)

    def reclaim(self, orphans, dry_run=False):
        """Remove the given orphans, each only if it is still unreferenced."""
        if dry_run:
            return [Outcome(o.mdev_uuid, "would-remove", o.kind) for o in orphans]
        outcomes, taken = [], []
        users = self.manager.domains.mdev_users()
        with self.manager.journal.transaction() as txn:
            claimed = txn.by_mdev()
            for orphan in orphans:
                if orphan.mdev_uuid in claimed or orphan.mdev_uuid in users:
                    outcomes.append(Outcome(orphan.mdev_uuid, "kept", "in use now"))
                    continue
                txn.add(RECLAIMER, orphan.mdev_uuid, orphan.gpu, orphan.parent,
                        orphan.type_id, claims_mod.RELEASING)
                taken.append(orphan.mdev_uuid)
        removed = set(self.manager.finish_release(taken))
        for uuid in taken:
            if uuid in removed:
                LOG.info("Removed orphan mdev %s", uuid)
                outcomes.append(Outcome(uuid, "removed"))
            else:
                outcomes.append(Outcome(uuid, "failed", "the kernel has not removed it "
                                                        "yet; it stays reserved"))
        return outcomes

    def reclaim_stale_types(self, grace=0.0, referenced=None):
        """Remove unused mdevs of a type their GPU no longer serves
        (``referenced`` as for :meth:`orphans`)."""
        stale = self.orphans(grace, referenced, kinds={STALE_TYPE})
        return self.reclaim(stale) if stale else []

    def finish_releases(self, wait=None):
        """Finish removals a crash or a busy device interrupted, waiting at
        most ``wait`` seconds for them (default ``mdev_remove_timeout``)."""
        pending = [c.mdev_uuid for c in self.manager.journal.claims()
                   if c.state == claims_mod.RELEASING]
        return self.manager.finish_release(pending, wait) if pending else []

    # -- in-use view for the inventory ------------------------------------------------------

    def in_use(self):
        """vGPU ids a domain or a claim references (draining vs blocked)."""
        return self._referenced(self.manager.snapshot())

    def referenced(self, snapshot, claim_list, users):
        """:meth:`in_use` of a snapshot, claims and ``{vgpu id: domain}``
        already read (the caller shows them too, and they must agree)."""
        referenced = set(users) | {c.mdev_uuid for c in claim_list}
        if not self.manager.domains.sees_pci_hostdevs:
            referenced |= {v.id for v in snapshot.vgpus if v.is_vf}
        return referenced

    # -- claims nobody came for ----------------------------------------------------------------

    def clean_stale_claims(self, grace=600.0, live_instances=None, attached_too=True,
                           migration_timeout=None, busy=None):
        """Drop claims whose guest never came or is gone; returns them.

        A ``claimed`` claim older than ``grace`` that no domain references
        never got its guest; an ``attached`` one without a domain lost it
        (only with ``attached_too``).  A ``migrating_in`` claim is the
        migration's to settle, unless no domain references it
        ``migration_timeout`` seconds on (None or 0: never): its rollback
        never came.  With ``live_instances``, claims of other instances go
        too (not ``migrating_in`` ones: their instance lives on the source).
        ``busy(instance uuids)`` names those an operation is under way on
        (the compute driver's guard): their claims stay.
        """
        users = self.manager.domains.mdev_users()
        now = self.clock()
        # Judged on a plain read; the write lock is taken only when there is
        # something to drop, and drops only claims unchanged since.
        stale = [claim for claim in self.manager.journal.claims()
                 if (attached_too or claim.state != claims_mod.ATTACHED)
                 and self._is_stale(claim, users, now, grace, live_instances,
                                    migration_timeout)]
        if stale and busy is not None:
            guarded = busy({c.instance_uuid for c in stale
                            if c.state != claims_mod.MIGRATING_IN})
            stale = [c for c in stale if c.instance_uuid not in guarded
                     or c.state == claims_mod.MIGRATING_IN]
        if not stale:
            return []
        stale = self.manager.drop_stale(stale)
        for claim in stale:
            if claim.state == claims_mod.MIGRATING_IN:
                LOG.warning("Dropped the migrating_in claim of instance %s on vGPU %s, "
                            "%.0fs old: no domain uses it, and the incoming live "
                            "migration never finished nor rolled back here ([vgpu] "
                            "migration_claim_timeout)", claim.instance_uuid,
                            claim.mdev_uuid, now - claim.updated_at)
                continue
            LOG.info("Dropped stale %s claim of instance %s on mdev %s (no domain uses it)",
                     claim.state, claim.instance_uuid, claim.mdev_uuid)
        return stale

    @staticmethod
    def _is_stale(claim, users, now, grace, live_instances, migration_timeout):
        if claim.mdev_uuid in users or claim.state == claims_mod.RELEASING:
            return False
        age = now - claim.updated_at
        if claim.state == claims_mod.MIGRATING_IN:
            return bool(migration_timeout) and age > migration_timeout
        gone = live_instances is not None and claim.instance_uuid not in live_instances
        return gone or claim.state == claims_mod.ATTACHED or age > grace

    # -- after a reboot ---------------------------------------------------------------------------

    def wanted_mdevs(self, instance_uuid=None):
        """``{uuid: Claim}`` of every mdev a guest or claim still needs."""
        return {c.mdev_uuid: c for c in self.manager.journal.claims(instance_uuid)
                if c.state != claims_mod.RELEASING}

    def restore(self, instance_uuid=None, refresh=True, attached_only=False):
        """One pass: create again, with their UUIDs, the claimed mdevs sysfs
        lacks, and give claimed vendor-VFIO VFs that lost it their type again.

        Returns one Outcome per vGPU that was missing: ``restored``,
        ``failed``, ``waiting`` (its parent is not there yet, such as a VF
        before the vendor enables it: a later pass tries again) or
        ``skipped`` (its claim changed or went since it was read).  With
        ``instance_uuid``, only that instance's; with ``refresh`` False, the
        manager's current snapshot says what sysfs has.  Each creation is checked
        against the journal just before and just after it, so a vGPU whose
        instance went meanwhile is not left behind.
        """
        users = self.manager.domains.mdev_users()
        wanted = self.wanted_mdevs(instance_uuid)
        # Only mdevs: a PCI hostdev without a claim may be any device (a NIC).
        unknown = [u for u in users if u not in wanted and names.is_mdev_uuid(u)
                   and instance_uuid in (None, users[u].uuid)]
        if attached_only:
            wanted = {u: c for u, c in wanted.items() if c.state == claims_mod.ATTACHED}
        snapshot = self.manager.snapshot(refresh=refresh)
        present = {v.id for v in snapshot.vgpus}
        outcomes = [Outcome(u, "failed", f"domain {users[u].name} uses it, but no claim "
                                         "records its GPU and type")
                    for u in sorted(unknown) if u not in present]
        for uuid, claim in sorted(wanted.items()):
            if uuid in present:
                continue
            outcome = self._restore_one(snapshot, claim) or Outcome(
                uuid, "waiting", f"parent {claim.parent} of GPU {claim.gpu} is not "
                                 "there yet")
            outcomes.append(outcome)
        for outcome in outcomes:
            log = {"restored": LOG.info, "failed": LOG.error}.get(outcome.result, LOG.debug)
            log("vGPU %s: %s %s", outcome.mdev_uuid, outcome.result, outcome.reason)
        return outcomes

    def _restore_one(self, snapshot, claim):
        """Outcome once settled, or None to wait for the parent."""
        gpu = snapshot.gpu(claim.gpu)
        if gpu is None:
            return None
        if claim.is_vf:
            return self._restore_vf(gpu, claim)
        parents = [p.name for p in gpu.parents if p.lists(claim.type_id)]
        if claim.parent not in parents and gpu.sriov:
            return None  # its VF is not back yet: the vendor enables VFs after boot
        if not parents:
            return None
        # Its own parent first, then any other of the same GPU no other
        # claim points at (another allocation may be about to use it).
        last = None
        for parent in sorted(parents, key=lambda name: name != claim.parent):
            if not self._take_parent(claim, parent):
                continue
            try:
                self.host.create_mdev(parent, claim.type_id, claim.mdev_uuid)
            except exception.MdevWriteError as exc:
                last = exc
                continue
            return self._settle_restored(claim, f"on {parent}")
        if last is None:
            return Outcome(claim.mdev_uuid, "skipped", "its claim changed since it was read")
        return Outcome(claim.mdev_uuid, "failed", str(last))

    def _take_parent(self, claim, parent):
        """Whether ``claim`` is unchanged and ``parent`` is its own or one no
        other claim points at; the claim then names ``parent``."""
        with self.manager.journal.transaction() as txn:
            current = txn.by_mdev()
            now = current.get(claim.mdev_uuid)
            if now is None or now.state == claims_mod.RELEASING \
                    or now.instance_uuid != claim.instance_uuid:
                return False
            if parent == now.parent:
                return True
            if any(c.parent == parent for c in current.values()):
                return False
            txn.move(claim.mdev_uuid, parent)
        return True

    def _mixed_size_mode_first(self, gpu, claim):
        """A claimed vGPU of a type sharing mixed-size boards comes back on a
        board in mixed-size mode: NVIDIA's driver forgets the mode when the
        VFs go, and switches it only while the board holds no vGPU, so it
        is set before the board's first type is written again."""
        if claim.type_id not in self.manager.config.mixed_types \
                or self.host.mixed_sizes(gpu.address):
            return
        self.host.set_mixed_sizes(gpu.address, True)
        LOG.info("GPU %s switched to mixed-size mode before its vGPUs are restored",
                 gpu.address)

    def _settle_restored(self, claim, where):
        """The restored vGPU, unless its claim went while it was written:
        then it is nobody's, and removed again."""
        with self.manager.journal.transaction() as txn:
            now = txn.by_mdev().get(claim.mdev_uuid)
            if now is not None and now.state != claims_mod.RELEASING:
                return Outcome(claim.mdev_uuid, "restored", where)
            if now is None:
                txn.add(RECLAIMER, claim.mdev_uuid, claim.gpu, claim.parent,
                        claim.type_id, claims_mod.RELEASING)
        self.manager.finish_release([claim.mdev_uuid])
        return Outcome(claim.mdev_uuid, "skipped", "its claim went while it was written; "
                                                   "removed again")

    def _restore_vf(self, gpu, claim):
        """Set the claimed VF's type again, once the VF is back.

        Its guest's domain names this very VF, so no other VF will do.
        """
        if not any(p.name == claim.parent for p in gpu.parents):
            return None  # the vendor enables VFs after boot
        if not self._take_parent(claim, claim.parent):
            return Outcome(claim.mdev_uuid, "skipped", "its claim changed since it was read")
        try:
            self._mixed_size_mode_first(gpu, claim)
        except exception.VgpuDriverError as exc:
            return Outcome(claim.mdev_uuid, "failed", f"its board cannot mix sizes: {exc}")
        try:
            self.host.set_vendor_vgpu_type(claim.parent,
                                           names.vendor_type_number(claim.type_id))
        except exception.VgpuDriverError as exc:
            return Outcome(claim.mdev_uuid, "failed", str(exc))
        return self._settle_restored(claim, f"type {claim.type_id} set on the VF")
