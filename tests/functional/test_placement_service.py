"""The embedded Placement under concurrent clients.

Several ``openstack`` CLIs (or several builds of the demo) talk to one
EmbeddedPlacement at once.  On sqlite, and above all on the in-memory
database whose single connection every request thread shares, transactions
of overlapping requests must not meet: each request here must succeed.
"""

import concurrent.futures
import uuid

import pytest

from vgpu_driver import placement
from vgpu_driver import placement_service

WORKERS = 12
ROUNDS = 6


def _provider_round_trip(conn, index):
    """Create a provider, give it inventory, read it back; its final view."""

    def call(method, url, body=None):
        response = conn.placement.request(
            url, method, json=body, raise_exc=False, microversion=placement.MICROVERSION
        )
        assert response.status_code < 300, (method, url, response.status_code, response.text)
        return response.json() if response.content else None

    rp_uuid = str(uuid.uuid4())
    call("POST", "/resource_providers", {"uuid": rp_uuid, "name": f"rp-{index}"})
    call(
        "PUT",
        f"/resource_providers/{rp_uuid}/inventories",
        {"resource_provider_generation": 0, "inventories": {"VGPU": {"total": index + 1}}},
    )
    call("GET", "/resource_providers")
    return call("GET", f"/resource_providers/{rp_uuid}/inventories")["inventories"]


@pytest.mark.parametrize("database", ["memory", "file"])
def test_overlapping_requests_all_succeed(database, tmp_path):
    url = "sqlite://" if database == "memory" else f"sqlite:///{tmp_path}/placement.sqlite"
    with placement_service.EmbeddedPlacement(url) as served:
        # One connection (its own HTTP pool) per worker, as separate clients.
        conns = [served.connection() for _ in range(WORKERS)]
        with concurrent.futures.ThreadPoolExecutor(max_workers=WORKERS) as pool:
            futures = {
                i: pool.submit(_provider_round_trip, conns[i % WORKERS], i)
                for i in range(WORKERS * ROUNDS)
            }
            seen = {i: f.result() for i, f in futures.items()}
    assert {i: inv["VGPU"]["total"] for i, inv in seen.items()} == {
        i: i + 1 for i in range(WORKERS * ROUNDS)
    }
