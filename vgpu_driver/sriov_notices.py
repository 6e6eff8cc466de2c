"""The nova driver's warning for a configured GPU whose VFs are not there.

Inventory updates run periodically; a GPU waiting for ``vgpu-manage sriov
enable`` would otherwise log the same warning at each one.  Apart from the
SR-IOV model because it is about what was logged, not about the GPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
    from vgpu_driver.inventory import ProviderTree


class PendingNotices:
    """Logs each configured GPU whose VFs are not there once, not at every
    periodic inventory update; again only if it comes back after being
    served."""

    def __init__(self) -> None:
        self._told: set[str] = set()

    def report(self, tree: ProviderTree, log: Any) -> None:
        reasons = dict(tree.unserved)
        for address in sorted(tree.vfs_pending - self._told):
            log.warning(
                "GPU %s is configured but gets no provider: %s", address, reasons.get(address)
            )
        self._told = (self._told | tree.vfs_pending) & tree.vfs_pending
