"""What ``vgpu-manage audit`` compares, on a compute of a nova test.

Shared by the soak and the scenarios that end with "audit clean on both
hosts"; it reads the test's own Placement and never writes to it.
"""

from vgpu_driver import audit
from vgpu_driver import compute_api
from vgpu_driver import discovery
from vgpu_driver import inventory
from vgpu_driver import placement
from vgpu_driver.placement import client as placement_client


def audit_of(test, host):
    """What ``vgpu-manage audit`` compares, on the host of ``test``'s compute."""
    driver = test.computes[host].driver
    sync = placement.ProviderSync(PlacementReader(test.placement))
    snapshot = discovery.discover(test.kernels[host])
    claim_list = driver.vgpu.journal.claims()
    users = driver.vgpu.domains.mdev_users()
    sync.observe(inventory.ProviderTree(root_name=host, providers=()))
    config = driver.vgpu.mdev_config
    boards = inventory.read_boards(test.kernels[host], snapshot, config)
    unallocated = inventory.claims_placement_lacks(
        claim_list,
        host,
        lambda name: sync.allocations(name) if name in sync.known else {},
        inventory.claim_units(boards),
    )
    in_use = {c.mdev_uuid for c in claim_list} | set(users)
    rooms = inventory.read_rooms(test.kernels[host], snapshot, config)
    tree = inventory.compute(snapshot, config, host, in_use, unallocated, boards, rooms)
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
