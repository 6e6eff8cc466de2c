"""What ``vgpu-manage audit`` compares, on a compute of a nova test.

Shared by the soak and the scenarios that end with "audit clean on both
hosts"; it reads the test's own Placement and never writes to it.
"""

from vgpu_driver import audit
from vgpu_driver import compute_api
from vgpu_driver import discovery
from vgpu_driver import host_tree
from vgpu_driver import inventory
from vgpu_driver import placement
from vgpu_driver.placement import client as placement_client


def audit_of(test, host):
    """What ``vgpu-manage audit`` compares, on the host of ``test``'s compute:
    a fresh read of its sysfs, its journal's claims and its guests' vGPUs,
    and the tree :func:`vgpu_driver.host_tree.desired` makes of them."""
    driver = test.computes[host].driver
    sync = placement.ProviderSync(PlacementReader(test.placement))
    snapshot = discovery.discover(test.kernels[host])
    claim_list = driver.vgpu.journal.claims()
    users = driver.vgpu.domains.mdev_users()
    sync.observe(inventory.ProviderTree(root_name=host, providers=()))
    in_use = {c.mdev_uuid for c in claim_list} | set(users)
    tree = host_tree.desired(
        test.kernels[host],
        snapshot,
        driver.vgpu.mdev_config,
        host,
        in_use,
        claim_list,
        lambda name: sync.allocations(name) if name in sync.known else {},
    )
    return audit.audit(
        sync,
        tree,
        snapshot,
        claim_list,
        users,
        moves=lambda: compute_api.moves_from(
            test.api.api_get("/os-migrations").body["migrations"], host
        ),
    )


class PlacementReader:
    """The audit's Placement client, over the test's own Placement API: the
    audit only reads, and a write would be a bug in it."""

    def __init__(self, api):
        self.api = api

    def request(self, method, url, body=None, report=None):
        if method != "GET":
            raise AssertionError(f"the audit wrote to Placement: {method} {url}")
        if report is not None:
            report.reads += 1
        response = self.api.get(url, version=placement_client.MICROVERSION)
        if response.status >= 400:
            raise placement_client.PlacementError(
                method=method, url=url, status=response.status, detail=response.content[:300]
            )
        return response.body
