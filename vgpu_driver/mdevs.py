"""Allocations -> mdevs: reuse a free one or create one, claims first.

For each GPU provider in an instance's Placement allocation and each unit
asked for, :meth:`MdevManager.allocate` takes a free mdev of the GPU's type
(free: referenced by no domain and no claim) or creates one on a parent that
can take it.  The decision and its claims are written in one journal
transaction before any mdev is created or handed out; the creations follow.
Choices are deterministic: free mdevs and parents in name order.

GPUs on NVIDIA's vendor-specific VFIO framework have no mdevs: each VF is a
parent that hosts at most one vGPU, the VF itself, once its
``current_vgpu_type`` is set.  They go through the same steps, a VF standing
for both parent and vGPU (named by its PCI address, see
:func:`vgpu_driver.names.check_vgpu_id`): a free VF already set to the type
is reused, else an untyped VF that lists the type and no domain references
is claimed, then given the type.

Per allocation, only the parents of the GPUs asked for are read (their mdev
directories and one ``available_instances`` each, or each VF's two
``nvidia/`` files), so the cost does not grow with the host or with the
number of guests.
"""

import dataclasses

from oslo_log import log as logging

from vgpu_driver import claims as claims_mod
from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import inventory
from vgpu_driver import names

LOG = logging.getLogger(__name__)

_CONSISTENT_READ_TRIES = 5


@dataclasses.dataclass(frozen=True)
class Planned:
    """One vGPU an allocation hands out: reused, or to be created.

    For a vendor-VFIO VF, ``mdev_uuid`` and ``parent`` are both its address,
    and to create is to set its type.
    """

    mdev_uuid: str
    gpu: str
    parent: str
    type_id: str
    create: bool


class _Referenced:
    """``uuid in referenced``: by a domain or a claim, without merging both."""

    def __init__(self, users, claimed):
        self._users, self._claimed = users, claimed

    def __contains__(self, uuid):
        return uuid in self._users or uuid in self._claimed


@dataclasses.dataclass(frozen=True)
class _ParentState:
    name: str
    mdevs: tuple[tuple[str, str], ...]   # (vgpu id, type id); a typed VF: itself
    available: int


class MdevManager:
    """The mdev lifecycle of one host: allocate and release, claims first."""

    def __init__(self, host, journal, domains, mdev_config, *, remove_on_release=False,
                 remove_timeout=30.0):
        self.host = host
        self.journal = journal
        self.domains = domains
        self.config = mdev_config
        self.remove_on_release = remove_on_release
        self.remove_timeout = remove_timeout
        self._snapshot = None

    # -- the host's structure, cached: which parents each GPU has ---------------------

    def snapshot(self, refresh=False):
        if refresh or self._snapshot is None:
            self._snapshot = discovery.discover(self.host)
        return self._snapshot

    def use_snapshot(self, snapshot):
        """Take a snapshot read elsewhere (the cached discovery) as current."""
        self._snapshot = snapshot
        return snapshot

    def configured_type(self, gpu):
        config = self.config.for_host(self.snapshot())
        type_id, _why = inventory.configured_type(gpu, config)
        return type_id

    def _gpu_states(self, instance, address, type_id, users):
        """The GPU and the live state of its parents; refreshes a stale cache."""
        for refresh in (False, True):
            gpu = self.snapshot(refresh=refresh).gpu(address)
            if gpu is not None and gpu.mode == discovery.MODE_VENDOR_VFIO:
                self._check_vf_users_seen(instance, address)
                states = self._vf_states(gpu, type_id, users)
            else:
                states = self._parent_states(gpu, type_id) if gpu is not None else None
            if states is not None:
                break
        if gpu is None or not states:
            raise exception.GpuGone(instance=instance, gpu=address)
        return gpu, states

    def _check_vf_users_seen(self, instance, address):
        """A VF handed out must stay visible as its guest's: else its claim
        looks stale once attached, and the VF free to the next allocation."""
        if not self.domains.sees_pci_hostdevs:
            raise exception.AllocationError(
                instance=instance, gpu=address,
                reason="its vGPUs are VFs passed through as PCI hostdevs, and this "
                       "host's domain source does not report PCI hostdevs, so the "
                       "guests using them cannot be told")

    def _vf_states(self, gpu, type_id, users):
        """Each VF as a parent; None if one vanished.

        A typed VF holds one vGPU, itself.  An untyped one has room for
        ``type_id`` when it lists the type and no domain references it (a
        guest whose VF lost its type, at a reboot say, still owns it).
        """
        number = _type_number(type_id)
        states = []
        for parent in gpu.parents:
            vf = self.host.vendor_vf(parent.name)
            if vf is None:
                return None
            if vf.current_type:
                states.append(_ParentState(
                    parent.name, ((parent.name, names.vendor_type_id(vf.current_type)),), 0))
                continue
            room = parent.name not in users and any(n == number for n, _ in vf.creatable)
            states.append(_ParentState(parent.name, (), int(room)))
        return states

    def _parent_states(self, gpu, type_id):
        """Each parent's mdevs and room for ``type_id``; None if one vanished.

        Creations run outside the journal lock, so one may land between the
        two reads of a parent; its count is then consistent only if the mdev
        list is the same before and after reading ``available_instances``.
        """
        states = []
        for parent in gpu.parents:
            mdevs = self.host.parent_mdevs(parent.name)
            for _attempt in range(_CONSISTENT_READ_TRIES):
                if mdevs is None:
                    return None
                available = self.host.available_instances(parent.name, type_id) \
                    if parent.type(type_id) else 0
                if self.host.parent_mdev_uuids(parent.name) == [u for u, _ in mdevs]:
                    break
                mdevs = self.host.parent_mdevs(parent.name)
            states.append(_ParentState(parent.name, tuple(mdevs), available))
        return states

    # -- allocation ---------------------------------------------------------------------

    def _requests(self, instance, allocations, providers):
        """``[(GpuProvider, units)]`` for the mdev classes in an allocation."""
        mdev_classes = self.config.mdev_classes
        requests = []
        for rp_uuid, allocation in sorted(allocations.items()):
            resources = allocation.get("resources", {})
            units = sum(n for rc, n in resources.items() if rc in mdev_classes)
            if not units:
                continue
            provider = providers.get(rp_uuid)
            if provider is None:
                raise exception.UnknownProvider(instance=instance, provider=rp_uuid)
            units = resources.get(provider.resource_class, 0)
            if units:
                requests.append((provider, units))
        return requests

    def allocate(self, instance_uuid, allocations, providers, state=claims_mod.CLAIMED):
        """The mdev UUIDs for an instance's allocation, claimed and present.

        ``allocations`` is Placement's ``{rp_uuid: {"resources": {rc: n}}}``;
        ``providers`` maps those rp UUIDs to this host's ``GpuProvider``.
        Calling it again for the same instance returns the same mdevs.
        ``state`` is the claims' (``migrating_in`` for an incoming migration).
        """
        requests = self._requests(instance_uuid, allocations, providers)
        if not requests:
            return []
        # Read before the lock, which only ever waits for claims: a vGPU a
        # domain took since was claimed first, and the claims are re-read.
        users = self.domains.mdev_users()
        with self.journal.transaction() as txn:
            plan, claimed = self._plan(txn, instance_uuid, requests, users)
            held = {u for u, c in claimed.items() if c.instance_uuid == instance_uuid}
            added = [item for item in plan if item.mdev_uuid not in held]
            for item in added:
                txn.add(instance_uuid, item.mdev_uuid, item.gpu, item.parent, item.type_id,
                        state, created=item.create)
        try:
            for item in plan:
                if item.create:
                    self._create(instance_uuid, item)
        except BaseException:
            # Whatever went wrong (a kernel refusal, a timeout, a bug), the
            # claims this call added must not outlive it; those it reused
            # were the instance's before and stay.
            self._undo(instance_uuid, added)
            raise
        LOG.info("Instance %s gets mdevs %s", instance_uuid,
                 ", ".join(f"{p.mdev_uuid} ({'created' if p.create else 'reused'} on "
                           f"{p.parent})" for p in plan))
        return [item.mdev_uuid for item in plan]

    def _plan(self, txn, instance, requests, users):
        claimed = txn.on_gpu_or_of(sorted({p.gpu for p, _ in requests}), instance)
        used = _Referenced(users, claimed)
        plan = []
        for provider, units in requests:
            plan += self._plan_gpu(instance, provider.gpu, provider.type_id, units, claimed,
                                   used, users)
        return plan, claimed

    def _plan_gpu(self, instance, address, type_id, units, claimed, used, users):
        gpu, states = self._gpu_states(instance, address, type_id, users)
        existing = {uuid for s in states for uuid, _ in s.mdevs}
        mine = [c for c in claimed.values()
                if c.instance_uuid == instance and c.gpu == gpu.address]
        plan = [Planned(c.mdev_uuid, gpu.address, c.parent, c.type_id,
                        create=c.mdev_uuid not in existing) for c in mine[:units]]
        wanted = units - len(plan)
        free = [(s.name, uuid) for s in states for uuid, t in s.mdevs
                if t == type_id and uuid not in used]
        for parent, uuid in free[:wanted]:
            plan.append(Planned(uuid, gpu.address, parent, type_id, create=False))
        wanted -= min(wanted, len(free))
        if wanted:
            slots = self._creatable(gpu, type_id, states, claimed, existing)
            if len(slots) < wanted:
                self._refuse(instance, gpu, type_id, units, len(free), len(slots),
                             states, claimed, used)
            plan += [Planned(_new_vgpu_id(gpu, parent), gpu.address, parent, type_id,
                             create=True)
                     for parent in slots[:wanted]]
        # The same order on a retry, whatever was reused or created first time.
        return sorted(plan, key=lambda item: item.mdev_uuid)

    def _creatable(self, gpu, type_id, states, claimed, existing):
        """Parents to create on, one entry per mdev that still fits, in order.

        Claims whose mdev is not created yet hold their place: the kernel's
        counts do not know about them.
        """
        pending = {}
        for claim in claimed.values():
            if claim.gpu == gpu.address and claim.mdev_uuid not in existing:
                pending[claim.parent] = pending.get(claim.parent, 0) + 1
        slots = []
        for state in states:
            room = state.available - pending.get(state.name, 0)
            slots += [state.name] * max(room, 0)
        limit = self._per_gpu_limit(gpu, type_id)
        if limit is not None:
            of_type = sum(1 for s in states for _, t in s.mdevs if t == type_id)
            slots = slots[:max(limit - of_type - sum(pending.values()), 0)]
        return slots

    def _per_gpu_limit(self, gpu, type_id):
        """The most vGPUs of the type the GPU can host, when known.

        sysfs does not tell it for vendor-VFIO types, and a VF's type list
        cannot count the claims not written yet; the type's host-wide
        ``max_instances``, which operators set for such GPUs, bounds it.
        """
        limit = inventory.per_gpu_limit(gpu, gpu.type_info(type_id))
        type_config = self.config.type_config(type_id)
        if gpu.mode == discovery.MODE_VENDOR_VFIO and type_config is not None \
                and type_config.max_instances is not None:
            cap = type_config.max_instances
            limit = cap if limit is None else min(limit, cap)
        return limit

    def _refuse(self, instance, gpu, type_id, units, free, creatable, states, claimed, used):
        others = {}
        for state in states:
            for uuid, t in state.mdevs:
                if t != type_id:
                    others.setdefault(t, []).append(uuid)
        in_use = {t: [u for u in uuids if u in used] for t, uuids in others.items()}
        if not free and not creatable and any(in_use.values()):
            kind = "VF(s) set to" if gpu.mode == discovery.MODE_VENDOR_VFIO else "mdev(s) of"
            present = ", ".join(f"{len(u)} {kind} {t}" for t, u in sorted(in_use.items())
                                if u)
            raise exception.WrongTypePresent(instance=instance, gpu=gpu.address,
                                             type_id=type_id, present=present)
        pending = sum(1 for c in claimed.values() if c.gpu == gpu.address)
        raise exception.NoGpuCapacity(instance=instance, gpu=gpu.address, type_id=type_id,
                                      wanted=units, free=free, creatable=creatable,
                                      claimed=pending)

    def _create(self, instance, item):
        if names.is_vf_vgpu_id(item.mdev_uuid):
            return self._set_vf_type(instance, item)
        try:
            self.host.create_mdev(item.parent, item.type_id, item.mdev_uuid)
        except exception.MdevAlreadyExists:
            # Made by an earlier attempt that died after the kernel answered.
            if item.mdev_uuid not in {u for u, _ in self.host.parent_mdevs(item.parent) or ()}:
                raise

    def _set_vf_type(self, instance, item):
        """Give a claimed VF its type; a GPU found full is the allocation's refusal."""
        number = names.vendor_type_number(item.type_id)
        try:
            self.host.set_vendor_vgpu_type(item.parent, number)
        except exception.MdevBusy:
            # Typed by an earlier attempt that died after the driver answered.
            vf = self.host.vendor_vf(item.parent)
            if vf is None or vf.current_type != number:
                raise
        except (exception.MdevInvalidRequest, exception.MdevNoCapacity) as exc:
            raise exception.VfTypeRefused(instance=instance, type_id=item.type_id,
                                          gpu=item.gpu, vf=item.parent,
                                          reason=exc.kwargs.get("reason", str(exc))
                                          ) from exc

    def _undo(self, instance_uuid, added):
        """Drop the claims a failed allocation added; what it created stays free."""
        if not added:
            return
        with self.journal.transaction() as txn:
            txn.remove(instance_uuid, [p.mdev_uuid for p in added])
        LOG.warning("Released the claims of a failed allocation for %s", instance_uuid)

    # -- after the guest is defined, and when it goes ---------------------------------------

    def mark_attached(self, instance_uuid):
        with self.journal.transaction() as txn:
            return txn.set_state(instance_uuid, claims_mod.ATTACHED)

    def release(self, instance_uuid):
        """Forget an instance's claims; remove its vGPUs if so configured.

        Kept, an mdev (or a VF with its type) is free for the next guest.
        With removal, claims stay (``releasing``) until the kernel has removed
        the mdev (the driver cleared the VF's type), so nothing can hand it
        out while it goes.
        """
        with self.journal.transaction() as txn:
            mine = txn.claims(instance_uuid)
            if not self.remove_on_release:
                txn.remove(instance_uuid)
                return [c.mdev_uuid for c in mine]
            txn.set_state(instance_uuid, claims_mod.RELEASING)
        return self.finish_release([c.mdev_uuid for c in mine])

    def finish_release(self, mdev_uuids):
        """Remove vGPUs held ``releasing`` and drop their claims once gone.

        A vendor-VFIO vGPU goes by clearing its VF's type (writing 0).
        """
        users = self.domains.mdev_users()
        done = []
        for uuid in mdev_uuids:
            if uuid in users:
                # Its claim goes all the same: the domain keeps it from others.
                LOG.warning("Not removing vGPU %s: domain %s still uses it", uuid,
                            users[uuid].name)
            else:
                try:
                    self._destroy(uuid)
                except exception.MdevWriteError as exc:
                    LOG.warning("vGPU %s not removed yet: %s", uuid, exc)
                    continue
            done.append(uuid)
        if done:
            with self.journal.transaction() as txn:
                txn.remove(mdev_uuids=done, state=claims_mod.RELEASING)
        return done

    def _destroy(self, vgpu_id):
        """Remove an mdev, or clear a VF's type; nothing if it is gone already."""
        if names.is_vf_vgpu_id(vgpu_id):
            vf = self.host.vendor_vf(vgpu_id)
            if vf is not None and vf.current_type:
                self.host.set_vendor_vgpu_type(vgpu_id, 0, timeout=self.remove_timeout)
        elif self.host.mdev_created_at(vgpu_id) is not None:
            self.host.remove_mdev(vgpu_id, timeout=self.remove_timeout)


def _type_number(type_id):
    """The number a vendor-VFIO type is written as; None for a type that is
    not one (nothing then lists it, so no VF takes it)."""
    try:
        return names.vendor_type_number(type_id)
    except exception.InvalidSysfsName:
        return None


def _new_vgpu_id(gpu, parent):
    """The id of a vGPU to create on ``parent``: a new mdev UUID, or the VF."""
    if gpu.mode == discovery.MODE_VENDOR_VFIO:
        return parent
    return names.new_mdev_uuid()
