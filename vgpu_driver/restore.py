"""Restoring a host's claimed vGPUs after a reboot.

The kernel comes back with no mdevs, and SR-IOV VFs only once the vendor's
enablement has run; every mdev a guest or claim still references is created
again, with its UUID, on its GPU, and every claimed vendor-VFIO VF (back
untyped) gets its type again, on that VF only: it is its guest's own device.

A mixin of :class:`vgpu_driver.reconcile.Reconciler`, which holds the
manager (its host, journal, domains and configuration) these methods use.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from oslo_log import log as logging

from vgpu_driver import claims as claims_mod
from vgpu_driver import exception
from vgpu_driver import names

if TYPE_CHECKING:
    from vgpu_driver.mdevs.manager import MdevManager
    from vgpu_driver.sysfs.writes import WritableSysfs

LOG = logging.getLogger(__name__)

RECLAIMER = "vgpu-driver:reclaim"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What happened to one mdev during a reconcile step."""

    mdev_uuid: str
    result: str  # removed | kept | restored | failed | waiting | skipped | would-remove
    reason: str = ""


class Restoring:
    """Claimed vGPUs sysfs lacks, created again; see the module."""

    manager: MdevManager

    @property
    def host(self) -> WritableSysfs:
        return self.manager.host

    def wanted_mdevs(self, instance_uuid=None):
        """``{uuid: Claim}`` of every mdev a guest or claim still needs."""
        return {
            c.mdev_uuid: c
            for c in self.manager.journal.claims(instance_uuid)
            if c.state != claims_mod.RELEASING
        }

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
        unknown = [
            u
            for u in users
            if u not in wanted and names.is_mdev_uuid(u) and instance_uuid in (None, users[u].uuid)
        ]
        if attached_only:
            wanted = {u: c for u, c in wanted.items() if c.state == claims_mod.ATTACHED}
        snapshot = self.manager.snapshot(refresh=refresh)
        present = {v.id for v in snapshot.vgpus}
        outcomes = [
            Outcome(
                u,
                "failed",
                f"domain {users[u].name} uses it, but no claim records its GPU and type",
            )
            for u in sorted(unknown)
            if u not in present
        ]
        for uuid, claim in sorted(wanted.items()):
            if uuid in present:
                continue
            outcome = self._restore_one(snapshot, claim) or Outcome(
                uuid, "waiting", f"parent {claim.parent} of GPU {claim.gpu} is not there yet"
            )
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
            if (
                now is None
                or now.state == claims_mod.RELEASING
                or now.instance_uuid != claim.instance_uuid
            ):
                return False
            if parent == now.parent:
                return True
            if any(c.parent == parent for c in current.values()):
                return False
            txn.move(claim.mdev_uuid, parent)
        return True

    def _mixed_size_mode_first(self, gpu, claim):
        """A claimed vGPU of a type sharing mixed-size boards (not type
        pools, which stay in equal-size mode) comes back on a board in
        mixed-size mode: NVIDIA's driver forgets the mode when the
        VFs go, and switches it only while the board holds no vGPU, so it
        is set before the board's first type is written again."""
        config = self.manager.config
        if (
            claim.type_id not in config.mixed_types
            or config.pools
            or self.host.mixed_sizes(gpu.address)
        ):
            return
        self.host.set_mixed_sizes(gpu.address, True)
        LOG.info("GPU %s switched to mixed-size mode before its vGPUs are restored", gpu.address)

    def _settle_restored(self, claim, where):
        """The restored vGPU, unless its claim went while it was written:
        then it is nobody's, and removed again."""
        with self.manager.journal.transaction() as txn:
            now = txn.by_mdev().get(claim.mdev_uuid)
            if now is not None and now.state != claims_mod.RELEASING:
                return Outcome(claim.mdev_uuid, "restored", where)
            if now is None:
                txn.add(
                    RECLAIMER,
                    claim.mdev_uuid,
                    claim.gpu,
                    claim.parent,
                    claim.type_id,
                    claims_mod.RELEASING,
                )
        self.manager.finish_release([claim.mdev_uuid])
        return Outcome(
            claim.mdev_uuid, "skipped", "its claim went while it was written; removed again"
        )

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
            self.host.set_vendor_vgpu_type(claim.parent, names.vendor_type_number(claim.type_id))
        except exception.VgpuDriverError as exc:
            return Outcome(claim.mdev_uuid, "failed", str(exc))
        return self._settle_restored(claim, f"type {claim.type_id} set on the VF")
