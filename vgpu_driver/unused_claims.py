"""Claims no domain uses, released once nothing will come for them.

A crash or a failed step can leave a guest a claim its domain here does
not use: a vGPU claimed on a destination whose finish died, kept through
the hard reboot that recovered the guest and marked attached by the next
define; or the claim of a guest that has no domain here any more (it left,
was deleted, or its stale domain was undefined by hand).  Its vGPU stays
reserved for nobody, and Placement counts what the guest does not use.

The host reconciler's periodic pass releases such a claim (``claimed`` or
``attached``) once it is older than ``[vgpu] unused_claim_grace`` and
its instance is not one the compute driver's *keeper* names: an instance
nova is in the middle of an operation on (a hard reboot, a resize, a move
undefines and defines domains and claims before defining them), or one
that keeps its vGPUs without a domain (a stopped guest whose next start
defines it from its claims).  Only the compute driver knows either: with
no keeper, nothing is released.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from collections.abc import Container
from collections.abc import Iterable
from typing import TYPE_CHECKING

from oslo_log import log as logging

from vgpu_driver import claims as claims_mod

if TYPE_CHECKING:
    from vgpu_driver.mdevs import MdevManager

LOG = logging.getLogger(__name__)

_UNUSED_STATES = (claims_mod.CLAIMED, claims_mod.ATTACHED)


def candidates(
    claim_list: Iterable[claims_mod.Claim], users: Container[str], now: float, grace: float
) -> dict[str, list[claims_mod.Claim]]:
    """The claims no domain uses, older than ``grace``, per instance."""
    found: collections.defaultdict[str, list[claims_mod.Claim]] = collections.defaultdict(list)
    for claim in claim_list:
        if (
            claim.state in _UNUSED_STATES
            and claim.mdev_uuid not in users
            and now - claim.updated_at > grace
        ):
            found[claim.instance_uuid].append(claim)
    return dict(found)


def release(
    manager: MdevManager,
    keeper: Callable[[set[str]], Container[str]] | None,
    grace: float,
    now: float,
) -> list[claims_mod.Claim]:
    """Release the unused claims of instances ``keeper`` does not keep;
    returns the released claims.

    Judged on a plain read; the claims are then released only if unchanged
    since (a claim someone took or moved on meanwhile stays), as
    :meth:`MdevManager.release` does: their vGPUs removed when so
    configured, or when of a type of mixed-size boards.
    """
    if keeper is None:
        return []
    users = manager.domains.mdev_users()
    found = candidates(manager.journal.claims(), users, now, grace)
    if not found:
        return []
    kept = keeper(set(found))
    stale = [c for uuid in sorted(found) if uuid not in kept for c in found[uuid]]
    if not stale:
        return []
    going: list[str] = []
    with manager.journal.transaction() as txn:
        current = set(txn.claims())
        stale = [c for c in stale if c in current]
        removed = [
            c
            for c in stale
            if not (manager.remove_on_release or c.type_id in manager.config.mixed_types)
        ]
        txn.remove_exact(removed)
        for claim in stale:
            if claim not in removed:
                txn.set_state(
                    claim.instance_uuid,
                    claims_mod.RELEASING,
                    [claim.mdev_uuid],
                    from_states=[claim.state],
                )
                going.append(claim.mdev_uuid)
    for claim in stale:
        LOG.warning(
            "Released the %s claim of instance %s on vGPU %s: no domain here uses "
            "it, %.0fs on ([vgpu] unused_claim_grace), and nothing is under way "
            "on the instance",
            claim.state,
            claim.instance_uuid,
            claim.mdev_uuid,
            now - claim.updated_at,
        )
    if going:
        manager.finish_release(going)
    return stale
