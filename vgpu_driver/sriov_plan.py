"""What enabling or disabling SR-IOV VFs would do, checked before any write.

Each address is looked up (:func:`vgpu_driver.sriov_functions.function`,
which refuses anything but an NVIDIA SR-IOV GPU) and turned into a
:class:`Step`: the dry run prints these, and
:mod:`vgpu_driver.sriov_apply` carries them out.  Apart from running the
script because every refusal must come before the first GPU is touched: a
disable is refused while a VF holds a vGPU or the claims journal a claim.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Iterable
from typing import TYPE_CHECKING

from vgpu_driver import exception
from vgpu_driver.sriov_functions import function

if TYPE_CHECKING:
    from vgpu_driver.claims import Claim
    from vgpu_driver.sysfs.base import SysfsReader


@dataclasses.dataclass(frozen=True)
class Step:
    """What enable or disable did (or would do) on one GPU."""

    address: str
    action: str  # "enable", "disable", "none"
    detail: str


def plan_enable(host: SysfsReader, addresses: Iterable[object]) -> list[Step]:
    """Check every address, then say what enabling would write; no write."""
    steps: dict[str, Step] = {}
    for address in addresses:
        pf = function(host, address, "enable")
        if pf.address in steps:
            continue
        if pf.numvfs:
            steps[pf.address] = Step(
                pf.address,
                "none",
                f"already enabled ({pf.numvfs} of {pf.totalvfs} VFs), left alone",
            )
        else:
            steps[pf.address] = Step(pf.address, "enable", f"sriov_numvfs 0 -> {pf.totalvfs}")
    return list(steps.values())


def plan_disable(
    host: SysfsReader, address: object, claims: Callable[[], Iterable[Claim]] | None = None
) -> Step:
    """Check that nothing uses the GPU's VFs; the step, or SriovRefused.

    ``claims()`` gives the journal's claims; it is asked only once no VF
    holds a vGPU (a host without vGPUs may have no journal).
    """
    pf = function(host, address, "disable")
    if not pf.numvfs:
        return Step(pf.address, "none", "already off, left alone")
    busy = [vf for vf in pf.vfs if vf.busy]
    if busy:
        used = ", ".join(f"{vf.address} ({', '.join(vf.mdevs) or vf.vgpu_type})" for vf in busy[:3])
        raise exception.SriovRefused(
            action="disable",
            address=pf.address,
            reason=f"{len(busy)} VF(s) hold vGPUs: {used}; remove them first "
            "(vgpu-manage mdev list, orphans reclaim)",
        )
    vf_addresses = {vf.address for vf in pf.vfs}
    claimed = [
        c for c in (claims() if claims else ()) if c.gpu == pf.address or c.parent in vf_addresses
    ]
    if claimed:
        raise exception.SriovRefused(
            action="disable",
            address=pf.address,
            reason=f"the claims journal holds {len(claimed)} claim(s) on it (instance "
            f"{claimed[0].instance_uuid}); see vgpu-manage claims list",
        )
    return Step(pf.address, "disable", f"sriov_numvfs {pf.numvfs} -> 0")
