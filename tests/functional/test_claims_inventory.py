"""Claims that no Placement allocation covers are reserved in the real
Placement, so it offers exactly what the allocator would hand out."""

import json
import uuid

import pytest

from tests.functional.test_placement_sync import run_cli
from vgpu_driver import claims
from vgpu_driver import claims_journal
from vgpu_driver import exception
from vgpu_driver import placement
from vgpu_driver import placement_service

A100 = "0000:41:00.0"
PROVIDER = "cn1_pci_0000_41_00_0"


@pytest.fixture
def service():
    with placement_service.EmbeddedPlacement() as running:
        yield running


def allocate_in_placement(client, rp_uuid, consumer, units):
    client.request(
        "PUT",
        f"/allocations/{consumer}",
        {
            "allocations": {rp_uuid: {"resources": {"VGPU": units}}},
            "project_id": "p",
            "user_id": "u",
            "consumer_generation": None,
            "consumer_type": "INSTANCE",
        },
    )


def largest_offer(client, limit):
    """The most VGPU units one request can get from Placement now."""
    found = 0
    for units in range(1, limit + 1):
        query = placement.query_url("/allocation_candidates", resources=f"VGPU:{units}")
        if client.request("GET", query)["allocation_requests"]:
            found = units
    return found


def test_placement_offers_what_the_allocator_hands_out(make_host, make_driver, service):
    vgpu = make_driver(make_host("a100-sriov"), "restore_wait = 5")
    client = placement.Client(service.connection())
    sync = placement.ProviderSync(client)
    client.request("POST", "/resource_providers", {"name": "cn1"})

    def allocations_on(name):
        return sync.allocations(name) if name in sync.known else {}

    def update():
        tree = vgpu.provider_tree("cn1", allocations_on)
        sync.sync(tree)
        return tree

    tree = update()
    rp_uuid = sync.known[PROVIDER].uuid
    providers = {rp_uuid: tree.provider(PROVIDER)}

    def allocate(instance, units):
        return vgpu.allocate(instance, {rp_uuid: {"resources": {"VGPU": units}}}, providers)

    # Counted by Placement: an instance with its allocation and its claims.
    counted = str(uuid.uuid4())
    allocate_in_placement(client, rp_uuid, counted, 2)
    allocate(counted, 2)
    # Not counted: claims whose instance has no allocation here (a migration
    # that moved its allocation away, a consumer deleted meanwhile).
    uncounted = str(uuid.uuid4())
    allocate(uncounted, 3)
    # Counted, not claimed yet: a guest being scheduled here.
    scheduled = str(uuid.uuid4())
    allocate_in_placement(client, rp_uuid, scheduled, 1)

    assert update().provider(PROVIDER).reserved == 3
    assert largest_offer(client, 6) == 4
    allocate(scheduled, 1)
    # The allocator refuses one more than Placement offers, and gives the rest.
    with pytest.raises(exception.AllocationError):
        allocate(str(uuid.uuid4()), 5)
    last = str(uuid.uuid4())
    allocate_in_placement(client, rp_uuid, last, 4)
    assert len(allocate(last, 4)) == 4
    assert update().provider(PROVIDER).reserved == 3

    # The uncounted claims go: Placement offers their capacity again.
    vgpu.release(uncounted)
    assert update().provider(PROVIDER).reserved == 0
    assert largest_offer(client, 6) == 3


def test_unknown_allocations_reserve_every_claim(make_host, make_driver):
    vgpu = make_driver(make_host("a100-sriov"), "restore_wait = 5")
    providers = {"rp": vgpu.provider_tree("cn1").by_gpu(A100)}
    vgpu.allocate("guest", {"rp": {"resources": {"VGPU": 2}}}, providers)
    assert vgpu.provider_tree("cn1").provider(PROVIDER).reserved == 0
    assert vgpu.provider_tree("cn1", lambda name: None).provider(PROVIDER).reserved == 2
    assert (
        vgpu.provider_tree("cn1", lambda name: {"guest": {"VGPU": 2}}).provider(PROVIDER).reserved
        == 0
    )


def test_cli_sync_reserves_them_as_nova_compute_does(make_host, service, tmp_path, monkeypatch):
    host = make_host("a100-sriov")
    conf = "[devices]\nenabled_mdev_types = nvidia-468\n"
    args = (tmp_path, service, monkeypatch, host.paths.root)
    assert run_cli(*args, "sync", conf=conf)[0] == 0
    client = placement.Client(service.connection())
    rp_uuid = client.request("GET", f"/resource_providers?name={PROVIDER}")["resource_providers"][
        0
    ]["uuid"]
    # Two claims of an incoming guest whose allocation is still on its
    # source; one of a guest Placement counts here.
    incoming, counted = str(uuid.uuid4()), str(uuid.uuid4())
    with claims_journal.Journal(str(tmp_path / "s")).transaction() as txn:
        for vf in ("0000:41:00.4", "0000:41:00.5"):
            txn.add(incoming, str(uuid.uuid4()), A100, vf, "nvidia-468", state=claims.MIGRATING_IN)
        txn.add(
            counted, str(uuid.uuid4()), A100, "0000:41:00.6", "nvidia-468", state=claims.ATTACHED
        )
    allocate_in_placement(client, rp_uuid, counted, 1)

    code, out, err = run_cli(*args, "sync", "--dry-run", "-f", "json", conf=conf)
    assert code == 0 and "would make 1 write" in err
    assert [
        (r["method"], json.loads(r["body"])["inventories"]["VGPU"]["reserved"])
        for r in json.loads(out)
    ] == [("PUT", 2)]
    assert run_cli(*args, "sync", conf=conf)[0] == 0
    inventories = client.request("GET", f"/resource_providers/{rp_uuid}/inventories")
    assert inventories["inventories"]["VGPU"]["reserved"] == 2
    code, out, _ = run_cli(*args, "audit", "-f", "json", conf=conf)
    assert {(r["kind"], r["consumer"]) for r in json.loads(out)} == {
        ("mdev-without-allocation", incoming)
    }
