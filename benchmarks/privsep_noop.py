"""oslo.privsep's own round trip: a context whose one entry point does nothing.

``bench_privsep.py`` starts it as a daemon (forked, by oslo.privsep's own
``Method.FORK``: the same channel and daemon as ``vgpu-privsep-helper``'s)
and calls it with the arguments of ``create_mdev``, so the report can tell
the channel's price from the entry point's.  It is a benchmark's module,
not the package's: the helper serves only ``vgpu_driver.privsep``'s entry
points.
"""

from oslo_privsep import capabilities
from oslo_privsep import priv_context

noop_context = priv_context.PrivContext(
    "privsep_noop",
    cfg_section="vgpu_bench_noop",
    pypath="privsep_noop.noop_context",
    capabilities=[capabilities.CAP_DAC_OVERRIDE],
)


@noop_context.entrypoint
def noop(parent, type_id, uuid):
    """Takes what ``create_mdev`` takes, checks and writes nothing."""
    return None
