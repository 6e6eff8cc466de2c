"""What several commands read from this host: its mdev configuration, the
vGPUs in use, and the provider tree its GPUs should have.

Shared by the listings (``inventory``), ``status``, ``sync``/``audit``,
``limits``, ``sriov``, ``claims`` and ``orphans``; each helper takes the
command's app (its configuration, host, journal and libvirt).
"""

from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import host_tree
from vgpu_driver import inventory
from vgpu_driver import libvirt_host
from vgpu_driver.conf import mdev_types


def load_mdev_config(app):
    config, problems = mdev_types.load(app.conf)
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise exception.InvalidConfiguration(errors)
    for problem in problems:
        app.LOG.warning("%s", problem)
    return config


def in_use(app, snapshot, view=False):
    """vGPU ids (mdev UUIDs, VF addresses) guests or claims reference, or None
    when libvirt is unreachable.  ``view``: a read-only view, which works
    without a journal (see ``view_journal``)."""
    journal = app.view_journal(snapshot) if view else app.journal(snapshot)
    claimed = {c.mdev_uuid for c in journal.claims()} if journal else set()
    try:
        return claimed | set(app.domains().mdev_users())
    except libvirt_host.LibvirtUnavailable as exc:
        app.LOG.warning("%s", exc)
        return None


def desired_tree(app, sync=None):
    """``(ProviderTree, snapshot)``: the providers this host's GPUs should have.

    With ``sync`` (a ProviderSync), claims Placement does not count are
    reserved, as nova-compute reserves them.
    """
    config = load_mdev_config(app)
    host = app.open_host()
    snapshot = discovery.discover(host)
    claim_list, allocations_on = _claims_and_allocations(app, snapshot, sync)
    tree = host_tree.desired(
        host,
        snapshot,
        config,
        app.options.nodename,
        in_use(app, snapshot, view=sync is None),
        claim_list,
        allocations_on,
    )
    return tree, snapshot


def _claims_and_allocations(app, snapshot, sync):
    """``(claims, allocations_on)`` for :func:`vgpu_driver.host_tree.desired`: none
    without ``sync``; else the journal's claims and what Placement holds."""
    if sync is None:
        return (), None
    journal = app.journal(snapshot)
    claim_list = journal.claims() if journal else []
    if not claim_list:
        return (), lambda _name: {}
    sync.observe(inventory.ProviderTree(root_name=app.options.nodename, providers=()))
    return claim_list, lambda name: sync.allocations(name) if name in sync.known else {}
