"""The metrics file nova-compute writes at each periodic inventory update.

The update has just read every source the metrics show (the discovery
snapshot, the journal's claims, libvirt's guests, the computed tree, the
host reconciler's state), under the driver's own rules.  Writing the file
from that one reading gives node_exporter's textfile collector the same
series as ``vgpu-manage metrics`` with no second reader of the host, no
listening socket inside nova-compute, and numbers that are exactly what
was just reported to Placement.  A write that fails is logged and never
fails the update: Placement matters more than a graph.
"""

from __future__ import annotations

import os

from oslo_log import log as logging

from vgpu_driver import exception
from vgpu_driver import metrics

LOG = logging.getLogger(__name__)
OPTION = "[vgpu] metrics_textfile"
SUFFIX = ".prom"  # the only files node_exporter's textfile collector reads


def problems(path: str) -> list[exception.ConfigProblem]:
    """:class:`~vgpu_driver.exception.ConfigProblem` for a ``metrics_textfile``
    that cannot work; none when it is empty (not written)."""
    if not path:
        return []
    reason = None
    if not os.path.isabs(path):
        reason = "give an absolute path"
    elif not path.endswith(SUFFIX) or os.path.basename(path) == SUFFIX:
        reason = f"node_exporter's textfile collector reads only files named *{SUFFIX}"
    elif not os.path.isdir(os.path.dirname(path)):
        reason = (
            f"its directory {os.path.dirname(path)} does not exist (node_exporter's "
            f"textfile collector directory, made by whoever installs node_exporter)"
        )
    elif os.path.isdir(path):
        reason = "it is a directory; name a file in it"
    return [exception.ConfigProblem(OPTION, path, reason)] if reason else []


class TextfileWriter:
    """Writes each update's :class:`~vgpu_driver.metrics.Reading` to ``path``,
    replaced whole (a temporary file beside it, renamed over it)."""

    def __init__(self, path: str) -> None:
        found = problems(path)
        if found:
            raise exception.InvalidConfiguration(found)
        self.path = path
        self._failing: str | None = None  # the last failure's text, logged once

    def write(self, reading: metrics.Reading) -> None:
        """``reading`` into the file; a failure is logged when it first
        happens (and when it changes), and when it stops."""
        try:
            metrics.write_textfile(self.path, metrics.registry_of(lambda: reading))
        except OSError as exc:
            failure = f"{exc.strerror or exc}"
            if failure != self._failing:
                LOG.warning(
                    "Cannot write the metrics to %s: %s; the inventory update goes on without them",
                    self.path,
                    failure,
                )
            self._failing = failure
            return
        if self._failing is not None:
            LOG.info("The metrics are written to %s again", self.path)
            self._failing = None
