"""The model of ``vgpu-manage status``: one view of a host's GPUs.

Operators want one screen that says, per physical GPU, what it serves, how
full it is, why some of it is held back, who uses it and what is on its way
in or out.  These are the plain values that screen, its JSON and the metrics
print (:mod:`vgpu_driver.status_assembly` builds them); apart from their
assembly so that what renders a view needs neither claims nor sysfs.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vgpu_driver.framebuffer import BoardMap

BAR_WIDTH = 10
MIB = "MiB"


@dataclasses.dataclass(frozen=True)
class Guest:
    """A guest holding one of the GPU's vGPUs (the domain's UUID is nova's
    instance UUID)."""

    vgpu: str
    instance: str
    domain: str


@dataclasses.dataclass(frozen=True)
class ClaimInFlight:
    """A journal claim not yet (or no longer) attached to its guest."""

    vgpu: str
    instance: str
    state: str
    # Seconds the kernel has blocked this vGPU's removal (None: not stuck).
    stuck_for: float | None = None


@dataclasses.dataclass(frozen=True)
class SriovState:
    state: str  # off, enabled, partial (see vgpu_driver.sriov_functions)
    numvfs: int
    totalvfs: int


@dataclasses.dataclass(frozen=True)
class TypeCount:
    """One type's vGPUs on one GPU, counted in vGPUs whatever unit the GPU's
    provider counts in, so that counts of every GPU and type add up."""

    type_id: str
    capacity: int  # vGPUs of the type the GPU offers (alone, on a mixed-size board)
    used: int  # vGPUs of the type that guests or claims hold there
    reserved: int  # vGPUs of the type held back (see the GPU's reserved_for)

    @property
    def free(self) -> int:
        """vGPUs of the type Placement may still hand out on the GPU."""
        return max(self.capacity - self.reserved - self.used, 0)


@dataclasses.dataclass(frozen=True)
class GpuStatus:
    gpu: str
    provider: str | None
    type_id: str | None
    type_name: str | None
    used: int
    total: int
    reserved: int
    reason: str | None
    sriov: SriovState | None
    # None when libvirt could not be asked: who uses the GPU is unknown.
    guests: tuple[Guest, ...] | None
    claims: tuple[ClaimInFlight, ...]
    # What used, total and reserved count: vGPUs, or on a mixed-size board
    # framebuffer MiB (its inventory's unit).
    unit: str = "vGPUs"
    # A mixed-size board's framebuffer.BoardMap: where its vGPUs sit.
    board_map: BoardMap | None = None
    # Per type, in vGPUs: the provider's type(s) or, with no provider, those
    # nova.conf gives the GPU, then any other type of a vGPU held there.
    types: tuple[TypeCount, ...] = ()
    # ``((kind, units), ...)``: what the reserved units are held back for
    # (:data:`vgpu_driver.inventory.RESERVED_FOR`), in ``unit``.
    reserved_for: tuple[tuple[str, int], ...] = ()

    @property
    def bar(self) -> str:
        return bar(self.used, self.total)

    @property
    def mixed(self) -> bool:
        return self.unit == MIB


@dataclasses.dataclass(frozen=True)
class HostStatus:
    nodename: str
    gpus: tuple[GpuStatus, ...]
    reconciler: str | None = None  # one line about the host reconciler

    @property
    def guests_known(self) -> bool:
        return all(g.guests is not None for g in self.gpus)

    def summary(self) -> str:
        """One line about the whole host."""
        served = [g for g in self.gpus if g.provider]
        counted = [g for g in self.gpus if not g.mixed]
        used = sum(g.used for g in counted)
        total = sum(g.total for g in served if not g.mixed)
        reserved = sum(g.reserved for g in served if not g.mixed)
        in_flight = sum(len(g.claims) for g in self.gpus)
        if self.guests_known:
            instances = {guest.instance for g in self.gpus for guest in g.guests}  # type: ignore[union-attr]  # all known
            guests = f"{len(instances)} guest(s)"
        else:
            guests = "guests unknown (libvirt unreachable)"
        line = (
            f"{self.nodename}: {len(self.gpus)} GPU(s), {len(served)} with a provider; "
            f"vGPUs {bar(used, total)} used, {reserved} reserved; {guests}; "
            f"{in_flight} claim(s) in flight"
        )
        mixed = [g for g in served if g.mixed]
        if mixed:
            framebuffer = bar(sum(g.used for g in mixed), sum(g.total for g in mixed))
            pools = all((g.type_name or "").startswith("type pool") for g in mixed)
            line += (
                f"; {'type-pool' if pools else 'mixed-size'} framebuffer {framebuffer} {MIB} used, "
                f"{sum(g.reserved for g in mixed)} {MIB} reserved"
            )
        sriov = [g.sriov for g in self.gpus if g.sriov]
        if sriov:
            enabled = sum(1 for s in sriov if s.state != "off")
            line += f"; SR-IOV on {enabled} of {len(sriov)} board(s)"
        if self.reconciler:
            line += "\n" + self.reconciler
        return line


def bar(used: int, total: int, width: int = BAR_WIDTH) -> str:
    """``[#####.....] 5/10``: one ``#`` per used tenth, at least one when any
    is used and at least one ``.`` while any is free; full when over."""
    if total <= 0:
        filled = width if used else 0
    else:
        filled = round(width * min(used, total) / total)
        if used and not filled:
            filled = 1
        elif used < total and filled == width:
            filled = width - 1
    return f"[{'#' * filled}{'.' * (width - filled)}] {used}/{total}"
