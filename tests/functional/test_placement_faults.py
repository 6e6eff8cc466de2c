"""The Placement sync against a real Placement that misbehaves.

nova-compute keeps its providers in Placement while other writers (an
operator tagging a GPU, another service) change the same providers, while
Placement answers 500 or 503, goes away for a while, or is slow.  The sync
must converge once the fault is over, keep what others wrote, never
duplicate a provider, and fail loudly (PlacementUnavailable, naming the
request) rather than half-silently.

Everything here is real: upstream Placement served over HTTP, openstacksdk
and keystoneauth on the client side.  Faults are real HTTP answers made by
:class:`tests.placement_faults.FaultInjector` in front of Placement's WSGI
application, and the injector's record of what reached the server, not our
own SyncReport, is what the assertions about reads and writes rely on.
Backoff sleeps are recorded instead of slept, so the suite stays fast.
"""

import re
import socket
import time

import openstack
import pytest
from keystoneauth1 import session as ks_session
from keystoneauth1 import token_endpoint

from tests import confs
from tests.placement_faults import BYPASS_HEADER
from tests.placement_faults import FaultInjector
from vgpu_driver import discovery
from vgpu_driver import inventory
from vgpu_driver import placement
from vgpu_driver.conf import mdev_types
from vgpu_driver.placement_service import ADMIN_TOKEN
from vgpu_driver.placement_service import EmbeddedPlacement

MICROVERSION = "1.39"
OPERATOR_TRAIT = "CUSTOM_OPERATOR_TAG"
OWNER_TRAIT = "CUSTOM_OWNER_VGPU_DRIVER"
MANAGER_TRAIT = "CUSTOM_NVIDIA_VGPU_MANAGER_550_127_06"  # the shipped M60 profile's
UUID = "[0-9a-f-]{36}"
INVENTORIES = f"/resource_providers/{UUID}/inventories"
PROVIDER_TRAITS = f"/resource_providers/{UUID}/traits"
WRITE = "POST|PUT|PATCH|DELETE"

# The guide's M60 host with 0000:84:00.0 moved from nvidia-35 to nvidia-36.
M60_84_RETYPED = """
    [devices]
    enabled_mdev_types = nvidia-35, nvidia-36
    [mdev_nvidia-35]
    device_addresses = 0000:85:00.0
    [mdev_nvidia-36]
    device_addresses = 0000:84:00.0,0000:86:00.0
    """
A100_4C = """
    [devices]
    enabled_mdev_types = nvidia-468
    """


class Recorder:
    """A ``sleep`` that records the delays asked for instead of sleeping."""

    def __init__(self):
        self.calls = []

    def __call__(self, seconds):
        self.calls.append(seconds)


class Operator:
    """A second, independent Placement client (an operator, another service).

    Its own openstacksdk Connection, over a keystoneauth session that marks
    every request (version discovery included) with the injector's bypass
    header: what it does is real, but it never trips a fault scripted for
    the code under test, never re-enters a hook, and is not counted as ours.
    """

    def __init__(self, endpoint):
        session = ks_session.Session(
            auth=token_endpoint.Token(endpoint, ADMIN_TOKEN),
            additional_headers={BYPASS_HEADER: "1"},
        )
        self.connection = openstack.connection.Connection(session=session)

    def request(self, method, url, body=None):
        response = self.connection.placement.request(
            url, method, json=body, microversion=MICROVERSION, raise_exc=False
        )
        assert response.status_code < 300, f"{method} {url}: {response.text}"
        return response.json() if response.content else None

    def add_trait(self, uuid, trait):
        """Tag a provider, as ``openstack resource provider trait set`` does."""
        self.request("PUT", f"/traits/{trait}")
        current = self.request("GET", f"/resource_providers/{uuid}/traits")
        self.request(
            "PUT",
            f"/resource_providers/{uuid}/traits",
            {
                "resource_provider_generation": current["resource_provider_generation"],
                "traits": sorted({*current["traits"], trait}),
            },
        )

    def tree(self, root_name):
        """``{name: provider}`` of every provider in ``root_name``'s tree(s),
        with its inventories and traits; a list per name to catch duplicates."""
        roots = self.request("GET", f"/resource_providers?name={root_name}")
        found = {}
        for root in roots["resource_providers"]:
            listed = self.request("GET", f"/resource_providers?in_tree={root['uuid']}")
            for rp in listed["resource_providers"]:
                base = f"/resource_providers/{rp['uuid']}"
                rp["inventories"] = self.request("GET", f"{base}/inventories")["inventories"]
                rp["traits"] = set(self.request("GET", f"{base}/traits")["traits"])
                found.setdefault(rp["name"], []).append(rp)
        return found

    def all_named(self, prefix):
        """Names of every provider whose name starts with ``prefix`` (any tree)."""
        listed = self.request("GET", "/resource_providers")["resource_providers"]
        return sorted(rp["name"] for rp in listed if rp["name"].startswith(prefix))


class Served:
    """A Placement with a FaultInjector in front, and an operator beside it."""

    def __init__(self):
        self.injector = None
        self.placement = EmbeddedPlacement(middleware=self._wrap)

    def _wrap(self, app):
        self.injector = FaultInjector(app)
        return self.injector

    def client(self, attempts=3, backoff=0.2):
        """Our Client, made while Placement is up; its sleeps are recorded."""
        sleeps = Recorder()
        return placement.Client(
            self.placement.connection(), attempts=attempts, backoff=backoff, sleep=sleeps
        ), sleeps


@pytest.fixture
def served():
    """A fresh Placement per test, stopped (and its port closed) afterwards."""
    served = Served()
    with served.placement:
        served.operator = Operator(served.placement.endpoint)
        yield served
    assert served.injector.errors == [], "a fault injector hook failed"


@pytest.fixture
def nodename(request):
    """A node name of this test's own, so a failure names the test it came from."""
    return re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")


@pytest.fixture
def m60_tree(make_host, make_conf):
    """``tree(nodename, conf_text)``: the guide's M60 host, as configured."""
    host = make_host("m60-multi")

    def tree(nodename, text=confs.NOVA_GUIDE_M60):
        config = mdev_types.from_conf(make_conf(text))
        return inventory.compute(discovery.discover(host), config, nodename)

    return tree


@pytest.fixture
def a100_tree(make_host, make_conf):
    """``tree(nodename)``: one A100 on SR-IOV serving A100-4C (one provider)."""
    host = make_host("a100-sriov")

    def tree(nodename):
        return inventory.compute(
            discovery.discover(host), mdev_types.from_conf(make_conf(A100_4C)), nodename
        )

    return tree


def assert_converged(operator, tree, extra_traits=None):
    """Placement holds exactly ``tree``: one root, one provider per GPU."""
    extra_traits = extra_traits or {}
    found = operator.tree(tree.root_name)
    names = {tree.root_name, *(p.name for p in tree.providers)}
    assert sorted(found) == sorted(names)
    assert {n: len(rps) for n, rps in found.items()} == dict.fromkeys(names, 1), (
        "a provider exists twice"
    )
    (root,) = found[tree.root_name]
    for provider in tree.providers:
        (rp,) = found[provider.name]
        assert rp["parent_provider_uuid"] == root["uuid"]
        assert rp["inventories"] == provider.inventory()
        assert rp["traits"] == {*provider.traits, *extra_traits.get(provider.name, ())}
    return found


def assert_steady(served, sync, tree):
    """One more sync reaches Placement as exactly one GET and no write."""
    served.injector.reset()
    report = sync.sync(tree)
    assert (report.reads, report.writes) == (1, 0)
    assert [(r.method, r.path) for r in served.injector.requests] == [
        ("GET", "/resource_providers")
    ]
    assert served.injector.writes == []


def free_port():
    """A 127.0.0.1 port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- generation conflicts -----------------------------------------------------------------


def test_concurrent_writer_conflict_is_reread_and_retried(served, m60_tree, nodename):
    """An operator tags a GPU between our read and our inventory PUT.

    The tag is a real write through another connection, so Placement
    itself bumps the generation and answers our PUT 409.  The sync must
    re-read that provider, retry with the new generation, keep the
    operator's trait and converge, without a second 409.
    """
    tree = m60_tree(nodename)
    client, sleeps = served.client()
    conflict_sleeps = Recorder()
    sync = placement.ProviderSync(client, sleep=conflict_sleeps)
    tagged = []

    def operator_tags(environ):
        uuid = environ["PATH_INFO"].split("/")[2]
        served.operator.add_trait(uuid, OPERATOR_TRAIT)
        tagged.append(uuid)

    served.injector.before("PUT", INVENTORIES, operator_tags, times=1)
    sync.sync(tree)

    assert len(tagged) == 1
    assert served.injector.count("PUT", INVENTORIES, status=409, handled=True) == 1
    assert served.injector.count(status=409) == 1
    assert [
        (r.method, r.path, r.status) for r in served.injector.bypassed if r.method != "GET"
    ] == [
        ("PUT", f"/traits/{OPERATOR_TRAIT}", 201),
        ("PUT", f"/resource_providers/{tagged[0]}/traits", 200),
    ]
    # The re-read after the 409: the provider, its inventories, its traits.
    sequence = [(r.method, r.path) for r in served.injector.requests]
    first_409 = next(i for i, r in enumerate(served.injector.requests) if r.status == 409)
    assert sequence[first_409 + 1 : first_409 + 5] == [
        ("GET", f"/resource_providers/{tagged[0]}"),
        ("GET", f"/resource_providers/{tagged[0]}/inventories"),
        ("GET", f"/resource_providers/{tagged[0]}/traits"),
        ("PUT", f"/resource_providers/{tagged[0]}/inventories"),
    ]
    assert len(conflict_sleeps.calls) == 1
    assert sleeps.calls == []
    found = assert_converged(
        served.operator, tree, {f"{nodename}_pci_0000_84_00_0": {OPERATOR_TRAIT}}
    )
    assert found[f"{nodename}_pci_0000_84_00_0"][0]["uuid"] == tagged[0]
    assert_steady(served, sync, tree)


def test_injected_conflicts_are_retried_up_to_conflict_attempts(served, m60_tree, nodename):
    """Placement's own 409 body (placement.concurrent_update), given twice, then
    given more times than ``conflict_attempts``: retried, then Conflict."""
    tree = m60_tree(nodename)
    client, _ = served.client()
    sync = placement.ProviderSync(client, conflict_attempts=3, sleep=Recorder())
    served.injector.conflict("PUT", PROVIDER_TRAITS, times=2)
    sync.sync(tree)
    assert served.injector.count("PUT", PROVIDER_TRAITS, status=409) == 2
    assert_converged(served.operator, tree)

    retyped = m60_tree(nodename, M60_84_RETYPED)
    served.injector.reset()
    served.injector.conflict("PUT", PROVIDER_TRAITS, times=None)
    with pytest.raises(placement.Conflict):
        sync.sync(retyped)
    assert served.injector.count("PUT", PROVIDER_TRAITS) == 3
    assert served.injector.count("PUT", PROVIDER_TRAITS, handled=True) == 0


def test_type_change_swaps_managed_traits_and_keeps_the_operators(served, m60_tree, nodename):
    """0000:84:00.0 goes from nvidia-35 to nvidia-36 on a provider an operator
    tagged: the CUSTOM_MDEV_/CUSTOM_VGPU_ traits follow the type, the
    inventory follows its capacity, the operator's trait stays."""
    client, _ = served.client()
    sync = placement.ProviderSync(client, sleep=Recorder())
    sync.sync(m60_tree(nodename))
    gpu = f"{nodename}_pci_0000_84_00_0"
    (rp,) = served.operator.tree(nodename)[gpu]
    assert rp["traits"] == {
        "CUSTOM_MDEV_NVIDIA_35",
        "CUSTOM_VGPU_GRID_M60_0B",
        OWNER_TRAIT,
        MANAGER_TRAIT,
    }
    served.operator.add_trait(rp["uuid"], OPERATOR_TRAIT)

    retyped = m60_tree(nodename, M60_84_RETYPED)
    served.injector.reset()
    report = sync.sync(retyped)

    assert report.updated == [gpu]
    found = assert_converged(served.operator, retyped, {gpu: {OPERATOR_TRAIT}})
    (rp,) = found[gpu]
    assert rp["traits"] == {
        OPERATOR_TRAIT,
        "CUSTOM_MDEV_NVIDIA_36",
        "CUSTOM_VGPU_GRID_M60_1B",
        OWNER_TRAIT,
        MANAGER_TRAIT,
    }
    assert rp["inventories"]["VGPU"]["total"] == 8
    assert served.injector.count(status=409) == 0
    assert_steady(served, sync, retyped)


# -- server errors ------------------------------------------------------------------------


def test_server_errors_are_retried_as_configured(served, m60_tree, nodename):
    """500 and 503 on some writes, fewer than ``attempts`` in a row: each
    write is retried with exponential backoff and the sync converges."""
    tree = m60_tree(nodename)
    client, sleeps = served.client(attempts=3, backoff=0.2)
    sync = placement.ProviderSync(client, sleep=Recorder())
    served.injector.fail("PUT", INVENTORIES, status=503, times=2)
    served.injector.fail("POST", "/resource_providers", status=500, times=1)
    served.injector.fail("PUT", PROVIDER_TRAITS, status=503, times=1)

    report = sync.sync(tree)

    injected = [(r.method, r.status) for r in served.injector.requests if r.injected]
    assert injected == [("POST", 500), ("PUT", 503), ("PUT", 503), ("PUT", 503)]
    first_inventory = served.injector.calls("PUT", INVENTORIES)[:3]
    assert [r.path for r in first_inventory] == [first_inventory[0].path] * 3
    assert [r.status for r in first_inventory] == [503, 503, 200]
    assert sleeps.calls == pytest.approx([0.2, 0.2, 0.4, 0.2])
    assert report.writes == len(served.injector.calls(WRITE))
    assert served.injector.count("POST", "/resource_providers", handled=True) == 4
    assert_converged(served.operator, tree)
    assert_steady(served, sync, tree)


@pytest.mark.parametrize(
    ("writes_before_outage", "restarted"),
    [
        (1, False),  # the root is made, the first GPU's POST fails
        (3, False),  # a GPU provider without traits yet; its first PUT /traits fails
        (7, False),  # one GPU complete, the next one's POST made, its inventory PUT fails
        (1, True),  # as above, then a new ProviderSync must find the root by name
        (7, True),  # ... and adopt the providers already there
    ],
    ids=["1-same-sync", "3-same-sync", "7-same-sync", "1-restarted", "7-restarted"],
)
def test_outage_mid_sync_then_recovery(served, m60_tree, nodename, writes_before_outage, restarted):
    """Placement goes down after a few writes, for longer than the retries.

    The sync stops at the first request it cannot make, with a
    PlacementUnavailable naming it, after exactly ``attempts`` tries, and
    writes nothing after it.  Once Placement is back, the next sync (of the
    same ProviderSync, or of a new one as after a restart of nova-compute)
    finishes the tree: every provider exactly once.
    """
    tree = m60_tree(nodename)
    client, sleeps = served.client(attempts=3)
    sync = placement.ProviderSync(client, sleep=Recorder())
    served.injector.outage(status=503, after_writes=writes_before_outage)

    with pytest.raises(placement.PlacementUnavailable) as caught:
        sync.sync(tree)

    failed = [r for r in served.injector.requests if r.injected]
    assert len(failed) == 3
    assert len({(r.method, r.path, r.query) for r in failed}) == 1
    assert served.injector.requests[-3:] == failed, "something was sent after the failure"
    assert len(served.injector.writes) == writes_before_outage
    url = failed[0].path + (f"?{failed[0].query}" if failed[0].query else "")
    assert f"{failed[0].method} {url} after 3 attempts" in str(caught.value)
    assert "HTTP 503" in str(caught.value)
    assert sleeps.calls == pytest.approx([0.2, 0.4])

    served.injector.restore()
    if restarted:
        client, _ = served.client()
        sync = placement.ProviderSync(client, sleep=Recorder())
    sync.sync(tree)
    assert_converged(served.operator, tree)
    assert served.operator.all_named(nodename) == sorted(
        [nodename, *(p.name for p in tree.providers)]
    )
    assert_steady(served, sync, tree)


def test_placement_down_from_the_start_writes_nothing(served, a100_tree, nodename):
    """Every request answered 503, from the very first (version discovery
    included): PlacementUnavailable, and not a single write reached
    Placement.  nova-compute may well start before Placement does."""
    tree = a100_tree(nodename)
    served.injector.outage(status=503)
    sleeps = Recorder()
    with pytest.raises(placement.PlacementUnavailable) as caught:
        client = placement.Client(served.placement.connection(), attempts=3, sleep=sleeps)
        placement.ProviderSync(client, sleep=Recorder()).sync(tree)
    assert "503" in str(caught.value)
    assert served.injector.requests, "nothing was asked of Placement"
    assert served.injector.calls(WRITE) == []
    assert served.injector.writes == []


def test_placement_stopped_after_connecting(served, a100_tree, nodename):
    """Placement's server goes away (connections refused) after our Client
    connected: each request is retried ``attempts`` times, then
    PlacementUnavailable says which request and that the connection failed."""
    tree = a100_tree(nodename)
    client, sleeps = served.client(attempts=3, backoff=0.2)
    sync = placement.ProviderSync(client, sleep=Recorder())
    sync.sync(tree)
    served.placement.stop()
    with pytest.raises(placement.PlacementUnavailable) as caught:
        sync.sync(tree)
    message = str(caught.value)
    assert "GET /resource_providers?in_tree=" in message
    assert "after 3 attempts" in message
    assert "ConnectFailure" in message
    assert sleeps.calls == pytest.approx([0.2, 0.4])


def test_connection_refused_from_the_start(a100_tree, nodename):
    """A Client pointed at a port nothing listens on: PlacementUnavailable
    after the configured attempts, naming ConnectFailure, not a
    keystoneauth exception escaping from the first use of the connection."""
    endpoint = f"http://127.0.0.1:{free_port()}"
    connection = openstack.connection.Connection(
        auth_type="admin_token", auth={"endpoint": endpoint, "token": ADMIN_TOKEN}
    )
    sleeps = Recorder()
    with pytest.raises(placement.PlacementUnavailable) as caught:
        client = placement.Client(connection, attempts=3, backoff=0.2, sleep=sleeps)
        placement.ProviderSync(client, sleep=Recorder()).sync(a100_tree(nodename))
    message = str(caught.value)
    assert "after 3 attempts" in message
    assert "ConnectFailure" in message
    assert sleeps.calls == pytest.approx([0.2, 0.4])


def test_lost_answer_to_a_create_makes_no_duplicate(served, m60_tree, nodename):
    """Placement creates a provider but its answer is lost (a proxy in front
    timed out: 504).  The retried POST finds the name taken (409): the sync
    must adopt that provider, not fail nor make a second one."""
    tree = m60_tree(nodename)
    client, _ = served.client(attempts=3)
    sync = placement.ProviderSync(client, sleep=Recorder())
    served.injector.fail("POST", "/resource_providers", status=504, times=1, lost=True)
    sync.sync(tree)
    assert served.injector.count("POST", "/resource_providers", status=504, handled=True) == 1
    assert_converged(served.operator, tree)
    assert_steady(served, sync, tree)


# -- a slow Placement ---------------------------------------------------------------------


def test_slow_placement_still_converges(served, a100_tree, nodename):
    """Every answer 0.2 s late: nothing times out (openstacksdk sets no
    timeout unless told), nothing is retried, the sync converges."""
    tree = a100_tree(nodename)
    client, sleeps = served.client()
    assert client.proxy.session.timeout is None
    sync = placement.ProviderSync(client, sleep=Recorder())
    served.injector.reset()
    served.injector.delay(seconds=0.2)
    started = time.monotonic()
    sync.sync(tree)
    elapsed = time.monotonic() - started
    requests = served.injector.requests
    assert all(r.delayed == 0.2 and not r.injected for r in requests)
    assert elapsed >= 0.2 * len(requests)
    assert sleeps.calls == []
    assert len(served.injector.writes) == len(served.injector.calls(WRITE))
    served.injector.restore()
    assert_converged(served.operator, tree)
    assert_steady(served, sync, tree)


# -- steady state -------------------------------------------------------------------------


def test_steady_state_is_one_get_and_no_write(served, m60_tree, a100_tree, nodename):
    """Once in sync, a periodic sync costs Placement one GET of the tree and
    no write, as the server counts it, on every host shape."""
    for tree in (m60_tree(f"{nodename}-m60"), a100_tree(f"{nodename}-a100")):
        client, _ = served.client()
        sync = placement.ProviderSync(client, sleep=Recorder())
        sync.sync(tree)
        assert_converged(served.operator, tree)
        for _ in range(3):
            assert_steady(served, sync, tree)
            (request,) = served.injector.requests
            root = served.operator.tree(tree.root_name)[tree.root_name][0]
            assert request.query == f"in_tree={root['uuid']}"
