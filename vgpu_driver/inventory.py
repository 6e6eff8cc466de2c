"""Host snapshot + mdev config -> the desired provider tree (no I/O).

One child provider per physical GPU, named ``<nodename>_pci_dddd_bb_ss_f``
after its physical function.  Its capacity for the GPU's configured type is
what exists plus what can still be created, capped by the type's per-GPU
maximum, by the GPU's VFs on SR-IOV boards and by the host-wide
``max_instances``.  A GPU that cannot serve its type right now keeps its
provider with everything reserved, and says why.  Claimed vGPUs that no
Placement allocation of their instance covers are reserved, so Placement
never offers what the allocator would refuse.
"""

import collections
import dataclasses

from vgpu_driver import discovery
from vgpu_driver import framebuffer
from vgpu_driver import names
from vgpu_driver import size_classes
from vgpu_driver.placement import ownership

TRAIT_MAX_LENGTH = 255
TYPE_ID_TRAIT_PREFIX = "CUSTOM_MDEV_"

# What a GPU's reserved units are held back for (GpuProvider.reserved_for).
NO_CAPACITY = "no_capacity"  # the GPU offers no more of its type, for no reason seen
BLOCKED = "blocked"  # unused vGPUs of another type are in the way
DRAINING = "draining"  # guests' vGPUs of another type are in the way
MAX_INSTANCES = "max_instances"  # the type's host-wide max_instances is used elsewhere
UNREADABLE = "unreadable"  # a sysfs value the vendor driver wrote is garbage
CLAIMS = "claims"  # claimed vGPUs no Placement allocation covers
FRAGMENTED = "fragmented"  # mixed-size framebuffer no configured type can take now
RESERVED_FOR = (NO_CAPACITY, BLOCKED, DRAINING, MAX_INSTANCES, UNREADABLE, CLAIMS, FRAGMENTED)


@dataclasses.dataclass(frozen=True)
class GpuProvider:
    """The desired state of one GPU's resource provider."""

    name: str
    parent_provider: str
    gpu: str
    type_id: str
    type_name: str | None
    resource_class: str
    total: int
    reserved: int = 0
    max_unit: int = 0
    traits: tuple[str, ...] = ()
    reason: str | None = None
    # ``((kind, units), ...)``: what the reserved units are held back for
    # (one of RESERVED_FOR); their units add up to ``reserved``.
    reserved_for: tuple[tuple[str, int], ...] = ()
    min_unit: int = 1
    step_size: int = 1
    allocation_ratio: float = 1.0
    # A mixed-size board: ``((type id, MiB), ...)`` of the types it serves,
    # its inventory in framebuffer MiB; ``type_id`` then lists them.
    sizes: tuple[tuple[str, int], ...] = ()
    # A mixed-size board: ``((size class, SizeInventory), ...)``, the vGPUs
    # of each placement size it can take (:mod:`vgpu_driver.size_classes`).
    size_inventories: tuple[tuple[str, size_classes.SizeInventory], ...] = ()

    @property
    def mixed(self):
        return bool(self.sizes)

    def units_of(self, type_id):
        """What one vGPU of ``type_id`` counts for in the inventory: one,
        or on a mixed-size board its framebuffer MiB (0: not its type)."""
        return dict(self.sizes).get(type_id, 0) if self.sizes else 1

    def inventory(self):
        """The Placement inventory records of this provider's classes."""
        records = {
            self.resource_class: {
                "total": self.total,
                "reserved": self.reserved,
                "min_unit": self.min_unit,
                "max_unit": self.max_unit,
                "step_size": self.step_size,
                "allocation_ratio": self.allocation_ratio,
            }
        }
        records.update((rc, found.as_placement()) for rc, found in self.size_inventories)
        return records

    def size_class_of(self, type_id):
        """The size class of ``type_id`` on a mixed-size board (None: not one)."""
        mib = dict(self.sizes).get(type_id)
        return size_classes.class_name(mib // framebuffer.SLOT_MIB) if mib else None


@dataclasses.dataclass(frozen=True)
class ProviderTree:
    root_name: str
    providers: tuple[GpuProvider, ...]
    # GPUs that get no provider, and why: (gpu address, reason).
    unserved: tuple[tuple[str, str], ...] = ()
    # Resource classes a GPU provider of this host may carry: VGPU and every
    # configured mdev class.  A provider with any other class is not ours.
    mdev_classes: frozenset[str] = frozenset({"VGPU"})
    # Configured SR-IOV GPUs in ``unserved`` because their VFs are not there.
    vfs_pending: frozenset[str] = frozenset()

    def provider(self, name):
        for provider in self.providers:
            if provider.name == name:
                return provider
        return None

    def by_gpu(self, address):
        for provider in self.providers:
            if provider.gpu == address:
                return provider
        return None


def provider_name(nodename, gpu):
    return provider_name_for(nodename, gpu.address)


def provider_name_for(nodename, gpu_address):
    """The provider name of a GPU by its address (a PCI address, or a
    virtual device's ``<class>_<device>`` name)."""
    if names.is_pci_address(gpu_address):
        return f"{nodename}_{names.parse_pci_address(gpu_address).provider_suffix}"
    return f"{nodename}_{gpu_address}"


def type_traits(type_id, type_name):
    """Traits that let flavors ask for a type by id or by its vendor name."""
    traits = [f"{TYPE_ID_TRAIT_PREFIX}{names.trait_fragment(type_id)}"]
    if type_name:
        traits.append(f"CUSTOM_VGPU_{names.trait_fragment(type_name)}")
    return tuple(sorted({t[:TRAIT_MAX_LENGTH] for t in traits}))


def manager_trait(version):
    """The trait naming an NVIDIA vGPU manager version (``550.127.06`` ->
    ``CUSTOM_NVIDIA_VGPU_MANAGER_550_127_06``): a live migration of
    vendor-VFIO vGPUs reads the source's from Placement."""
    return f"{ownership.MANAGER_TRAIT_PREFIX}{names.trait_fragment(version)}"


def manager_version_of(trait):
    """The version a :func:`manager_trait` names, dotted again."""
    return trait[len(ownership.MANAGER_TRAIT_PREFIX) :].replace("_", ".")


def provider_traits(type_id, type_name, manager_version=None):
    """A GPU provider's traits: its type's, the one saying it is ours, and
    on an NVIDIA GPU the one naming the host's vGPU manager version."""
    traits = {*type_traits(type_id, type_name), ownership.OWNER_TRAIT}
    if manager_version:
        traits.add(manager_trait(manager_version))
    return tuple(sorted(traits))


def _manager_version(snapshot, gpu):
    nvidia = gpu.pci is not None and gpu.pci.vendor == discovery.NVIDIA_VENDOR
    return snapshot.vgpu_manager_version if nvidia else None


def configured_types(snapshot, mdev_config):
    """``{gpu address: (type id, ...)}`` of every GPU of ``snapshot`` a type
    is configured for (several on a mixed-size board), the fleet's
    configuration resolved once."""
    config = mdev_config.for_host(snapshot)
    served = {}
    for gpu in snapshot.gpus:
        types, _why = configured_type(gpu, config)
        if types:
            served[gpu.address] = types
    return served


def configured_type(gpu, config):
    """``((type_id, ...), None)`` or ``((), reason the GPU is not served)``:
    one type, or the vendor-VFIO types of a mixed-size board.

    ``config`` is resolved for the host (:meth:`MdevConfig.for_host`) when
    its types select GPUs by ``device_ids``.
    """
    assigned = config.types_for(gpu.addresses)
    if len(assigned) > 1 and not _can_mix(gpu, assigned):
        return (), (
            f"its addresses are listed under several types ({', '.join(assigned)}); "
            "a GPU serves one type, unless it is a board serving vendor-VFIO "
            "vGPUs, which mixes sizes: fix device_addresses"
        )
    if assigned:
        return tuple(assigned), None
    if config.default_type:
        return (config.default_type,), None
    if not config.types:
        return (), "no mdev type is enabled ([devices] enabled_mdev_types)"
    return (), (
        config.fleet_reason(gpu.address)
        or "not listed in any [mdev_<type>] device_addresses nor matched by device_ids"
    )


def _can_mix(gpu, type_ids):
    """Whether ``gpu`` may serve several types: NVIDIA's, on a board whose
    VFs serve vendor-VFIO vGPUs (or are not there yet to tell)."""
    return all(map(names.is_vendor_type_id, type_ids)) and gpu.mode in (
        discovery.MODE_VENDOR_VFIO,
        discovery.MODE_VFS_PENDING,
    )


def vfs_pending_reason(gpu):
    """Why a configured SR-IOV GPU has no provider yet, and the fix."""
    if gpu.vfs_off:
        return f"SR-IOV is off: run vgpu-manage sriov enable {gpu.address}"
    return (
        f"its {gpu.pci.sriov_numvfs} VFs offer no mdev type yet (the NVIDIA vGPU "
        f"manager has not registered them); see vgpu-manage sriov status"
    )


def per_gpu_limit(gpu, type_info):
    """The most mdevs of a type the GPU can ever host, when it is known."""
    limits = []
    if type_info is not None and type_info.max_instance:
        limits.append(type_info.max_instance)
    if gpu.sriov:
        limits.append(len(gpu.parents))
    return min(limits) if limits else None


def _blocked_reason(gpu, type_id, in_use):
    """``(kind, why)`` a GPU cannot serve its type now: mdevs of other types."""
    others = {}
    for mdev in gpu.mdevs:
        if mdev.type_id != type_id:
            others.setdefault(mdev.type_id, []).append(mdev.uuid)
    for parent in gpu.parents:
        if parent.current_vgpu_type and parent.current_vgpu_type != type_id:
            others.setdefault(parent.current_vgpu_type, []).append(parent.name)
    if not others:
        return NO_CAPACITY, f"no {type_id} can be created now"
    listed = ", ".join(f"{len(u)} of {t}" for t, u in sorted(others.items()))
    if in_use is None:
        return BLOCKED, (
            f"blocked by existing mdevs ({listed}); remove the unused ones to serve {type_id}"
        )
    busy = sum(1 for uuids in others.values() for u in uuids if u in in_use)
    if busy:
        return DRAINING, (
            f"draining: mdevs ({listed}) of which {busy} in use by guests; "
            f"serves {type_id} once they are gone"
        )
    return BLOCKED, f"blocked by unused mdevs ({listed}); they are reclaimed automatically"


def _hidden_by_other_vgpus(gpu, type_id):
    """True when the GPU's VFs may hide ``type_id`` for now.

    NVIDIA's vendor-specific VFIO lists only the types a VF can take now, so
    a GPU holding vGPUs of another size lists none of the served type's
    size: it is draining (or blocked), not a GPU that never offers the type.
    """
    return gpu.mode == discovery.MODE_VENDOR_VFIO and any(
        p.current_vgpu_type and p.current_vgpu_type != type_id for p in gpu.parents
    )


def _gpu_capacity(gpu, type_id, in_use=None):
    """``(total, reserved_for, reason)`` for one GPU before host-wide caps."""
    existing = gpu.vgpu_types_in_use().get(type_id, 0)
    creatable = sum(info.available_instances for _, info in gpu.offers(type_id))
    limit = per_gpu_limit(gpu, gpu.type_info(type_id))
    capacity = existing + creatable
    if limit is not None:
        capacity = min(capacity, max(limit, existing))
    if capacity:
        return capacity, (), None
    potential = limit or 1
    kind, reason = _blocked_reason(gpu, type_id, in_use)
    return potential, ((kind, potential),), reason


def _apply_host_cap(rows, max_instances):
    """Cap a type's totals host-wide, filling GPUs in address order."""
    remaining = max_instances
    capped = []
    for row in rows:
        total, reserved_for, reason, existing = (
            row["total"],
            row["reserved_for"],
            row["reason"],
            row["existing"],
        )
        usable = total - _units(reserved_for)
        allowed = max(existing, min(usable, remaining))
        remaining = max(remaining - allowed, 0)
        if usable and allowed == 0:
            reserved_for = ((MAX_INSTANCES, total),)
            reason = f"max_instances={max_instances} for {row['type_id']} is used by other GPUs"
        elif usable:
            total = allowed
        capped.append({**row, "total": total, "reserved_for": reserved_for, "reason": reason})
    return capped


def unallocated_claims(claim_list, allocated, units_of=None):
    """``{gpu address: claimed vGPUs that Placement does not count}``.

    Placement already counts the units an instance has allocated on a GPU's
    provider, so only an instance's claims beyond those units are added (a
    claim left by a failed migration, a consumer whose allocation is gone
    or on another GPU).  The allocator refuses every claimed vGPU to other
    instances, whatever the claim's state.  ``allocated`` maps a GPU
    address to ``{consumer: {resource class: units}}`` on its provider (a
    GPU provider has one class); a GPU it lacks has unknown allocations and
    all its claims count: one update reserving too much is better than
    Placement offering what the allocator refuses.  ``units_of(claim)`` is
    what one claimed vGPU counts for (default 1 of the GPU's one class):
    a number, or ``{class: units}`` (a mixed-size board's, :func:`claim_units`),
    whose GPU then gets ``{class: units}`` too, each class counted apart.
    """
    held = collections.defaultdict(collections.Counter)
    for claim in claim_list:
        units = units_of(claim) if units_of else 1
        held[claim.gpu, claim.instance_uuid].update(
            units if isinstance(units, dict) else {None: units}
        )
    extra = {}
    for (gpu, instance), counts in held.items():
        mine = allocated.get(gpu, {}).get(instance, {})
        for rc, count in counts.items():
            # None: the GPU's one class, whatever it is named.
            units = sum(mine.values()) if rc is None else mine.get(rc, 0)
            missing = max(count - units, 0)
            if rc is None:
                extra[gpu] = extra.get(gpu, 0) + missing
            elif missing:
                extra.setdefault(gpu, collections.Counter())[rc] += missing
    return {gpu: count for gpu, count in extra.items() if count}


def claims_placement_lacks(claim_list, nodename, allocations_on, units_of=None):
    """:func:`unallocated_claims`, asking ``allocations_on(provider name)``
    (None when Placement cannot say) only about GPUs that hold claims."""
    allocated = {}
    for gpu in sorted({c.gpu for c in claim_list}):
        found = allocations_on(provider_name_for(nodename, gpu))
        if found is not None:
            allocated[gpu] = found
    return unallocated_claims(claim_list, allocated, units_of)


def claim_units(boards):
    """``units_of`` for :func:`unallocated_claims`: a claim on a mixed-size
    board of ``boards`` (:func:`vgpu_driver.framebuffer.read_boards`)
    counts its type's framebuffer MiB and one vGPU of its size class
    (``{class: units}``), any other claim one vGPU."""

    def units_of(claim):
        reading = boards.get(claim.gpu)
        found = reading.placements.get(claim.type_id) if reading else None
        if not found:
            return 1
        return {
            framebuffer.RESOURCE_CLASS: found.size * framebuffer.SLOT_MIB,
            size_classes.class_name(found.size): 1,
        }

    return units_of


def _reserve_unallocated(rows, unallocated):
    """Add to each GPU's reserved units the claims Placement does not count."""
    reserved = []
    for row in rows:
        held = _units(row["reserved_for"])
        extra = min(row["total"] - held, unallocated.get(row["gpu"].address, 0))
        reserved.append(
            {**row, "reserved_for": row["reserved_for"] + (((CLAIMS, extra),) if extra > 0 else ())}
        )
    return reserved


def _units(reserved_for):
    return sum(units for _kind, units in reserved_for)


def mixed_size_provider(snapshot, gpu, types, reading, nodename, in_use=None, unallocated=None):
    """``(GpuProvider, None)`` of a board serving several vendor-VFIO types
    in mixed-size mode, or ``(None, why it cannot)``.

    One inventory of framebuffer MiB (:mod:`vgpu_driver.framebuffer`):
    vGPUs that guests or claims hold count as used; a typed VF nobody holds
    keeps its slots from every other type, so they are reserved with what
    fragmentation leaves unusable; and one inventory per placement size
    (:mod:`vgpu_driver.size_classes`).  Claims Placement does not count
    (``unallocated``: ``{class: units}``, or MiB alone) are reserved too.
    """
    why_not = _why_not_mixed(gpu, types, reading)
    if why_not:
        return None, why_not
    listed = ", ".join(types)
    configured = {t: reading.placements[t] for t in types}
    typed = {p.name: p.current_vgpu_type for p in gpu.parents if p.current_vgpu_type}
    board_slots = framebuffer.board_slots(configured)
    held_slots = sum(
        reading.placements[t].size for vf, t in typed.items() if in_use is None or vf in in_use
    )
    free_vfs = sum(
        1
        for p in gpu.parents
        if not p.current_vgpu_type and (in_use is None or p.name not in in_use)
    )
    fb = framebuffer.inventory(board_slots, configured, held_slots, free_vfs)
    if not isinstance(unallocated, dict):
        unallocated = {framebuffer.RESOURCE_CLASS: unallocated or 0}
    claims_mib = min(unallocated.get(framebuffer.RESOURCE_CLASS, 0), fb.capacity)
    held = collections.Counter(
        reading.placements[t].size for vf, t in typed.items() if in_use is None or vf in in_use
    )
    uncounted = {size: unallocated.get(size_classes.class_name(size), 0) for size in held}
    by_size = size_classes.inventories(configured, held, uncounted, free_vfs)
    room = fb.capacity - claims_mib - held_slots * framebuffer.SLOT_MIB
    reserved_for = (((FRAGMENTED, fb.reserved),) if fb.reserved else ()) + (
        ((CLAIMS, claims_mib),) if claims_mib else ()
    )
    traits = {
        t
        for type_id in types
        for t in provider_traits(type_id, None, _manager_version(snapshot, gpu))
    }
    return GpuProvider(
        name=provider_name(nodename, gpu),
        parent_provider=nodename,
        gpu=gpu.address,
        type_id=",".join(types),
        type_name=None,
        resource_class=framebuffer.RESOURCE_CLASS,
        total=fb.total,
        reserved=fb.reserved + claims_mib,
        min_unit=fb.min_unit,
        max_unit=fb.max_unit,
        step_size=fb.step_size,
        traits=tuple(sorted(traits)),
        reason=_mixed_size_reason(listed, fb, room, size_classes.fitting(configured, free_vfs)),
        reserved_for=reserved_for,
        sizes=tuple((t, configured[t].size * framebuffer.SLOT_MIB) for t in types),
        size_inventories=tuple(sorted(by_size.items())),
    ), None


def _mixed_size_reason(listed, fb, room, fitting):
    """What a mixed-size board can still take, for the operator's views
    (``fitting``: ``{size: vGPUs of it that fit now}``)."""
    fragmented = f"; {fb.reserved} MiB fragmented" if fb.reserved else ""
    fits = ", ".join(
        f"{count} x {size * framebuffer.SLOT_MIB} MiB"
        for size, count in sorted(fitting.items())
        if count
    )
    if room <= 0 or not fits:
        return (
            f"none of {listed} fits now (the board is full, or its free framebuffer "
            f"is fragmented){fragmented}"
        )
    return f"mixed sizes: fit now {fits}{fragmented}"


def _why_not_mixed(gpu, types, reading):
    """Why a board configured for ``types`` gets no framebuffer inventory
    from what NVML said (``reading``), or None."""
    listed = ", ".join(types)
    if reading is None or reading.error:
        why = reading.error if reading else "NVML was not asked"
        return f"configured for mixed sizes ({listed}), but NVML cannot say: {why}"
    if not reading.mixed:
        return (
            f"configured for mixed sizes ({listed}) but in equal-size mode: run "
            f"vgpu-manage sriov sizes {gpu.address} mixed"
        )
    unplaceable = [
        t for t in types if not reading.placements.get(t) or not reading.placements[t].supported
    ]
    if unplaceable:
        return (
            f"cannot place {', '.join(unplaceable)} in mixed-size mode: not a vGPU "
            "type of this board (see vgpu-manage types)"
        )
    unknown = sorted(
        {
            p.current_vgpu_type
            for p in gpu.parents
            if p.current_vgpu_type and p.current_vgpu_type not in reading.placements
        }
    )
    if unknown:
        return (
            f"its VFs hold {', '.join(unknown)}, whose size NVML was not asked; it "
            "gets a provider once they are gone"
        )
    return None


def read_boards(host, snapshot, config):
    """What NVML says of the host's boards ``config`` gives several types
    (:func:`vgpu_driver.framebuffer.read_boards`), for :func:`compute`."""
    return framebuffer.read_boards(host, snapshot, configured_types(snapshot, config))


def check_nodename(nodename, snapshot):
    """InvalidNodename unless every GPU's provider name built on
    ``nodename`` is one Placement takes."""
    names.check_nodename(nodename, [provider_name("", gpu) for gpu in snapshot.gpus])


def compute(snapshot, config, nodename, in_use=None, unallocated=None, boards=None):
    """The desired :class:`ProviderTree` of a host.

    ``in_use`` (mdev UUIDs guests or claims reference), when known, tells a
    GPU draining for a type change from one blocked by unused mdevs;
    ``unallocated`` (:func:`unallocated_claims`), when known, is reserved;
    ``boards`` (:func:`vgpu_driver.framebuffer.read_boards`) is what NVML
    says of the mixed-size boards: without it they get no provider.
    """
    check_nodename(nodename, snapshot)
    rows, unserved, pending = [], [], set()
    config = config.for_host(snapshot)
    mixed = []
    for gpu in snapshot.gpus:
        types, why_not = configured_type(gpu, config)
        if not types:
            unserved.append((gpu.address, why_not))
            continue
        if gpu.mode == discovery.MODE_VFS_PENDING:
            unserved.append((gpu.address, vfs_pending_reason(gpu)))
            pending.add(gpu.address)
            continue
        if len(types) > 1:
            provider, why_not = mixed_size_provider(
                snapshot,
                gpu,
                types,
                (boards or {}).get(gpu.address),
                nodename,
                in_use,
                (unallocated or {}).get(gpu.address),
            )
            if provider is None:
                unserved.append((gpu.address, why_not))
            else:
                mixed.append(provider)
            continue
        type_id = types[0]
        type_info = gpu.type_info(type_id)
        if (
            type_info is None
            and not gpu.vgpu_types_in_use().get(type_id)
            and not _hidden_by_other_vgpus(gpu, type_id)
        ):
            offered = sorted({t for p in gpu.parents for t in p.type_ids})
            unserved.append(
                (
                    gpu.address,
                    f"does not offer {type_id} (offers: {', '.join(offered) or 'nothing'})",
                )
            )
            continue
        total, reserved_for, reason = _gpu_capacity(gpu, type_id, in_use)
        unreadable = sorted({u for _, info in gpu.offers(type_id) for u in info.unreadable})
        if unreadable:
            reserved_for, reason = (
                ((UNREADABLE, total),),
                (f"unreadable sysfs value {unreadable[0]}; check the vendor driver"),
            )
        rows.append(
            {
                "gpu": gpu,
                "type_id": type_id,
                "total": total,
                "reserved_for": reserved_for,
                "reason": reason,
                "type_name": type_info.name if type_info else None,
                "existing": gpu.vgpu_types_in_use().get(type_id, 0),
            }
        )
    for type_config in config.types:
        if type_config.max_instances is None:
            continue
        mine = [r for r in rows if r["type_id"] == type_config.type_id]
        capped = iter(_apply_host_cap(mine, type_config.max_instances))
        rows = [next(capped) if r["type_id"] == type_config.type_id else r for r in rows]
    rows = _reserve_unallocated(rows, unallocated or {})
    providers = []
    for row in rows:
        type_config = config.type_config(row["type_id"])
        providers.append(
            GpuProvider(
                name=provider_name(nodename, row["gpu"]),
                parent_provider=nodename,
                gpu=row["gpu"].address,
                type_id=row["type_id"],
                type_name=row["type_name"],
                resource_class=type_config.mdev_class,
                total=row["total"],
                reserved=_units(row["reserved_for"]),
                max_unit=row["total"],
                traits=provider_traits(
                    row["type_id"], row["type_name"], _manager_version(snapshot, row["gpu"])
                ),
                reason=row["reason"],
                reserved_for=row["reserved_for"],
            )
        )
    providers = sorted(providers + mixed, key=lambda p: p.gpu)
    return ProviderTree(
        root_name=nodename,
        providers=tuple(providers),
        unserved=tuple(unserved),
        mdev_classes=config.mdev_classes
        | {"VGPU"}
        | {rc for p in mixed for rc, _found in p.size_inventories},
        vfs_pending=frozenset(pending),
    )
