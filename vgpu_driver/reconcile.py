"""Putting a host's mdevs right: orphans, stale types, reboots, stale claims.

* An **orphan** is an mdev no domain and no claim references.  Orphans of a
  type the GPU no longer serves are removed automatically, so a GPU can
  switch types; others are removed on request (``vgpu-manage orphans``).
* After a **reboot** the kernel has no mdevs and SR-IOV VFs come back only
  once the vendor's enablement has run; every mdev a guest or claim still
  references is created again, with its UUID, on its GPU
  (:mod:`vgpu_driver.restore`).
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
from vgpu_driver import inventory
from vgpu_driver import restore

LOG = logging.getLogger(__name__)

FREE = "free"
STALE_TYPE = "stale-type"
UNMANAGED = "unmanaged"


@dataclasses.dataclass(frozen=True)
class Orphan:
    mdev_uuid: str
    parent: str
    gpu: str
    type_id: str
    kind: str  # free | stale-type | unmanaged
    age: float | None  # seconds since the mdev appeared


class Reconciler(restore.Restoring):
    """The rules for a host's vGPUs: orphans, stale types and stale claims
    here, the restore after a reboot in :mod:`vgpu_driver.restore`."""

    def __init__(self, manager, clock=time.time):
        self.manager = manager
        self.clock = clock

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
            kind = (
                UNMANAGED if serves is None else (FREE if serves == (vgpu.type_id,) else STALE_TYPE)
            )
            if kinds is not None and kind not in kinds:
                continue
            created = self._created_at(vgpu)
            age = None if created is None else max(now - created, 0.0)
            if age is not None and age < grace:
                continue
            found.append(
                Orphan(vgpu.id, vgpu.parent, gpu.address if gpu else "", vgpu.type_id, kind, age)
            )
        return found

    def _kind_by_parent(self, snapshot):
        """``{parent: (gpu, types it serves or None)}``, the configuration
        resolved for the host once, not once per vGPU."""
        serves = inventory.configured_types(snapshot, self.manager.config)
        return {
            parent.name: (gpu, serves.get(gpu.address))
            for gpu in snapshot.gpus
            for parent in gpu.parents
        }

    def _referenced(self, snapshot):
        """vGPU ids a domain or a claim references.

        A domain source blind to PCI hostdevs cannot show a guest's VF: every
        typed VF then counts as referenced, so none is ever taken from a guest.
        """
        users = self.manager.domains.mdev_users()  # guests first: see provider_tree
        return self.referenced(snapshot, self.manager.journal.claims(), users)

    def _created_at(self, vgpu):
        if vgpu.is_vf:
            return self.host.vendor_vgpu_set_at(vgpu.parent)
        return self.host.mdev_created_at(vgpu.id)

    def reclaim(self, orphans, dry_run=False):
        """Remove the given orphans, each only if it is still unreferenced."""
        if dry_run:
            return [restore.Outcome(o.mdev_uuid, "would-remove", o.kind) for o in orphans]
        outcomes, taken = [], []
        users = self.manager.domains.mdev_users()
        with self.manager.journal.transaction() as txn:
            claimed = txn.by_mdev()
            for orphan in orphans:
                if orphan.mdev_uuid in claimed or orphan.mdev_uuid in users:
                    outcomes.append(restore.Outcome(orphan.mdev_uuid, "kept", "in use now"))
                    continue
                txn.add(
                    restore.RECLAIMER,
                    orphan.mdev_uuid,
                    orphan.gpu,
                    orphan.parent,
                    orphan.type_id,
                    claims_mod.RELEASING,
                )
                taken.append(orphan.mdev_uuid)
        removed = set(self.manager.finish_release(taken))
        for uuid in taken:
            if uuid in removed:
                LOG.info("Removed orphan mdev %s", uuid)
                outcomes.append(restore.Outcome(uuid, "removed"))
            else:
                outcomes.append(
                    restore.Outcome(
                        uuid, "failed", "the kernel has not removed it yet; it stays reserved"
                    )
                )
        return outcomes

    def reclaim_stale_types(self, grace=0.0, referenced=None):
        """Remove unused mdevs of a type their GPU no longer serves
        (``referenced`` as for :meth:`orphans`)."""
        stale = self.orphans(grace, referenced, kinds={STALE_TYPE})
        return self.reclaim(stale) if stale else []

    def finish_releases(self, wait=None):
        """Finish removals a crash or a busy device interrupted, waiting at
        most ``wait`` seconds for them (default ``mdev_remove_timeout``)."""
        pending = [
            c.mdev_uuid for c in self.manager.journal.claims() if c.state == claims_mod.RELEASING
        ]
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

    def clean_stale_claims(
        self, grace=600.0, live_instances=None, attached_too=True, migration_timeout=None, busy=None
    ):
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
        stale = [
            claim
            for claim in self.manager.journal.claims()
            if (attached_too or claim.state != claims_mod.ATTACHED)
            and self._is_stale(claim, users, now, grace, live_instances, migration_timeout)
        ]
        if stale and busy is not None:
            guarded = busy({c.instance_uuid for c in stale if c.state != claims_mod.MIGRATING_IN})
            stale = [
                c
                for c in stale
                if c.instance_uuid not in guarded or c.state == claims_mod.MIGRATING_IN
            ]
        if not stale:
            return []
        stale = self.manager.drop_stale(stale)
        for claim in stale:
            if claim.state == claims_mod.MIGRATING_IN:
                LOG.warning(
                    "Dropped the migrating_in claim of instance %s on vGPU %s, "
                    "%.0fs old: no domain uses it, and the incoming live "
                    "migration never finished nor rolled back here ([vgpu] "
                    "migration_claim_timeout)",
                    claim.instance_uuid,
                    claim.mdev_uuid,
                    now - claim.updated_at,
                )
                continue
            LOG.info(
                "Dropped stale %s claim of instance %s on mdev %s (no domain uses it)",
                claim.state,
                claim.instance_uuid,
                claim.mdev_uuid,
            )
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
