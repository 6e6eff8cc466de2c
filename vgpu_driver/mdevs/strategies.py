"""How a GPU's vGPUs are read, made and removed: one strategy per GPU mode.

An mdev parent (:class:`MdevParentStrategy`) hosts mdevs, each created with a
new UUID under the parent and removed through the mdev.  A GPU on NVIDIA's
vendor-specific VFIO framework (:class:`VendorVfioStrategy`) has no mdevs:
each VF is a parent that hosts at most one vGPU, the VF itself, once its
``nvidia/current_vgpu_type`` is set; removing it writes 0.  Everything else
about an allocation (claims, planning, undo) is the same for both, so the
manager picks a strategy once per GPU (:func:`for_gpu`) and once per vGPU it
removes or re-creates (:func:`for_vgpu`: a claim's id says how its vGPU was
made, whatever mode its GPU is in now).

Strategies are cheap and made per use, from the manager's current host,
domain source and config.
"""

from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING
from typing import ClassVar

from vgpu_driver import exception
from vgpu_driver import host_snapshot
from vgpu_driver import inventory
from vgpu_driver import names
from vgpu_driver import size_classes
from vgpu_driver.mdevs import planner

if TYPE_CHECKING:
    from vgpu_driver.conf.mdev_settings import MdevConfig
    from vgpu_driver.domains import DomainReferences
    from vgpu_driver.host_snapshot import PhysicalGPU
    from vgpu_driver.sysfs.writes import WritableSysfs

_CONSISTENT_READ_TRIES = 5


class _Strategy:
    """What both modes share: the GPU's state for the planner."""

    kind: ClassVar[str]  # each mode's: how vGPUs of a type are named in a refusal

    def __init__(self, host: WritableSysfs, domains: DomainReferences, config: MdevConfig) -> None:
        self.host, self.domains, self.config = host, domains, config

    def gpu_state(
        self, instance: str, gpu: PhysicalGPU, type_id: str, users: Container[str]
    ) -> planner.GpuState | None:
        """The planner's :class:`~planner.GpuState`; None if a parent vanished."""
        parents = self.parent_states(instance, gpu, type_id, users)
        if parents is None:
            return None
        return planner.GpuState(
            gpu.address,
            tuple(parents),
            self.limit(gpu, type_id),
            self.kind,
            self.new_vgpu_id,
            mixes_types=type_id in self.config.mixed_types and not self.config.pools,
        )

    if TYPE_CHECKING:
        # What each mode provides.
        def parent_states(
            self, instance: str, gpu: PhysicalGPU, type_id: str, users: Container[str]
        ) -> list[planner.ParentState] | None: ...

        @staticmethod
        def new_vgpu_id(parent: str) -> str: ...

        def create(self, instance: str, item: planner.Planned) -> None: ...

        def destroy(self, vgpu_id: str, timeout: float | None) -> None: ...

    def limit(self, gpu: PhysicalGPU, type_id: str) -> int | None:
        """The most vGPUs of the type the GPU can host, when known."""
        limit: int | None = inventory.per_gpu_limit(gpu, gpu.type_info(type_id))
        return limit


class MdevParentStrategy(_Strategy):
    """mdevs under their parents' ``mdev_supported_types``."""

    kind = "mdev(s) of"

    def parent_states(
        self, instance: str, gpu: PhysicalGPU, type_id: str, users: Container[str]
    ) -> list[planner.ParentState] | None:
        """Each parent's mdevs and room for ``type_id``; None if one vanished.

        Creations run outside the journal lock, so one may land between the
        two reads of a parent; its count is then consistent only if the mdev
        list is the same before and after reading ``available_instances``.
        """
        states: list[planner.ParentState] = []
        for parent in gpu.parents:
            mdevs = self.host.parent_mdevs(parent.name)
            for _attempt in range(_CONSISTENT_READ_TRIES):
                if mdevs is None:
                    return None
                available = (
                    self.host.available_instances(parent.name, type_id)
                    if parent.lists(type_id)
                    else 0
                )
                if self.host.parent_mdev_uuids(parent.name) == [u for u, _ in mdevs]:
                    break
                mdevs = self.host.parent_mdevs(parent.name)
            if mdevs is None:
                # Gone on the last re-read, the reads having never agreed.
                return None
            states.append(planner.ParentState(parent.name, tuple(mdevs), available))
        return states

    @staticmethod
    def new_vgpu_id(parent: str) -> str:
        return names.new_mdev_uuid()

    def create(self, instance: str, item: planner.Planned) -> None:
        try:
            self.host.create_mdev(item.parent, item.type_id, item.mdev_uuid)
        except exception.MdevAlreadyExists:
            # Made by an earlier attempt that died after the kernel answered.
            if item.mdev_uuid not in {u for u, _ in self.host.parent_mdevs(item.parent) or ()}:
                raise

    def destroy(self, vgpu_id: str, timeout: float | None) -> None:
        """Remove the mdev; nothing if it is gone already."""
        if self.host.mdev_created_at(vgpu_id) is not None:
            self.host.remove_mdev(vgpu_id, timeout=timeout)


class VendorVfioStrategy(_Strategy):
    """VFs standing for both parent and vGPU, typed through ``nvidia/``."""

    kind = "VF(s) set to"

    def parent_states(
        self, instance: str, gpu: PhysicalGPU, type_id: str, users: Container[str]
    ) -> list[planner.ParentState] | None:
        """Each VF as a parent; None if one vanished.

        A typed VF holds one vGPU, itself.  An untyped one has room for
        ``type_id`` when it lists the type and no domain references it (a
        guest whose VF lost its type, at a reboot say, still owns it).
        """
        self._check_users_seen(instance, gpu.address)
        number = _type_number(type_id)
        states: list[planner.ParentState] = []
        for parent in gpu.parents:
            vf = self.host.vendor_vf(parent.name)
            if vf is None:
                return None
            if vf.current_type:
                states.append(
                    planner.ParentState(
                        parent.name, ((parent.name, names.vendor_type_id(vf.current_type)),), 0
                    )
                )
                continue
            room = parent.name not in users and any(n == number for n, _ in vf.creatable)
            states.append(planner.ParentState(parent.name, (), int(room)))
        return states

    def _check_users_seen(self, instance: str, address: str) -> None:
        """A VF handed out must stay visible as its guest's: else its claim
        looks stale once attached, and the VF free to the next allocation."""
        if not self.domains.sees_pci_hostdevs:
            raise exception.AllocationError(
                instance=instance,
                gpu=address,
                reason="its vGPUs are VFs passed through as PCI hostdevs, and this "
                "host's domain source does not report PCI hostdevs, so the "
                "guests using them cannot be told",
            )

    def limit(self, gpu: PhysicalGPU, type_id: str) -> int | None:
        """As sysfs tells it, capped by the type's ``max_instances``.

        sysfs does not tell the per-GPU limit of vendor-VFIO types, and a
        VF's type list cannot count the claims not written yet; the type's
        host-wide ``max_instances``, which operators set for such GPUs,
        bounds it.
        """
        limit = super().limit(gpu, type_id)
        if type_id in self.config.mixed_types and self.config.pools:
            return self._pool_limit(gpu, type_id)
        if type_id in self.config.mixed_types:
            return self._mixed_size_limit(gpu, type_id)
        type_config = self.config.type_config(type_id)
        if type_config is not None and type_config.max_instances is not None:
            cap = type_config.max_instances
            limit = cap if limit is None else min(limit, cap)
        return limit

    def _pool_limit(self, gpu: PhysicalGPU, type_id: str) -> int | None:
        """On a pool board (equal-size mode): NVIDIA's maximum of the type
        per board, as NVML says now; None when NVML cannot say (each VF's
        list still refuses what cannot go, another size among them)."""
        number = _type_number(type_id)
        if number is None:
            return 0
        try:
            return self.host.vgpu_max_instances(gpu.address, [number]).get(number, 0)
        except (exception.NvmlUnavailable, exception.MixedSizeModeRefused):
            return None

    def _mixed_size_limit(self, gpu: PhysicalGPU, type_id: str) -> int | None:
        """On a mixed-size board: its vGPUs of the type, and as many more as
        disjoint creatable placements of its size are left
        (:func:`vgpu_driver.size_classes.disjoint`), as NVML says now; None
        when NVML cannot say (each VF's list still refuses what cannot go)."""
        number = _type_number(type_id)
        if number is None:
            return 0
        try:
            found = self.host.vgpu_placements(gpu.address, [number]).get(number)
        except (exception.NvmlUnavailable, exception.MixedSizeModeRefused):
            return None
        if found is None:
            return 0
        # Read now, as the planner counts them: the snapshot may be older.
        of_type = 0
        for parent in gpu.parents:
            vf = self.host.vendor_vf(parent.name)
            of_type += bool(vf is not None and vf.current_type == number)
        lists = size_classes.size_lists({type_id: found})[found.size]
        return of_type + size_classes.disjoint(lists.creatable, found.size)

    @staticmethod
    def new_vgpu_id(parent: str) -> str:
        """The VF is the vGPU: its address is the id."""
        return parent

    def create(self, instance: str, item: planner.Planned) -> None:
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
            raise exception.VfTypeRefused(
                instance=instance,
                type_id=item.type_id,
                gpu=item.gpu,
                vf=item.parent,
                reason=exc.kwargs.get("reason", str(exc)),
            ) from exc

    def destroy(self, vgpu_id: str, timeout: float | None) -> None:
        """Clear the VF's type (write 0); nothing if it has none or is gone."""
        vf = self.host.vendor_vf(vgpu_id)
        if vf is not None and vf.current_type:
            self.host.set_vendor_vgpu_type(vgpu_id, 0, timeout=timeout)


def for_gpu(
    gpu: PhysicalGPU, host: WritableSysfs, domains: DomainReferences, config: MdevConfig
) -> _Strategy:
    """The strategy of a GPU's mode (mdev and virtual parents alike)."""
    cls: type[_Strategy] = (
        VendorVfioStrategy if gpu.mode == host_snapshot.MODE_VENDOR_VFIO else MdevParentStrategy
    )
    return cls(host, domains, config)


def for_vgpu(
    vgpu_id: str, host: WritableSysfs, domains: DomainReferences, config: MdevConfig
) -> _Strategy:
    """The strategy that made a vGPU, told by its id: a VF's address or an mdev UUID."""
    cls: type[_Strategy] = (
        VendorVfioStrategy if names.is_vf_vgpu_id(vgpu_id) else MdevParentStrategy
    )
    return cls(host, domains, config)


def _type_number(type_id: str) -> int | None:
    """The number a vendor-VFIO type is written as; None for a type that is
    not one (nothing then lists it, so no VF takes it)."""
    try:
        return names.vendor_type_number(type_id)
    except exception.InvalidSysfsName:
        return None
