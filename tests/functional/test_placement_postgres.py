"""The real Placement on a real PostgreSQL: what ProviderSync writes is what Placement serves.

Upstream Placement (its WSGI application, schema migrations and policy) is
served on 127.0.0.1 by :class:`~vgpu_driver.placement_service.EmbeddedPlacement`
against a private PostgreSQL cluster (``tests/postgres.py``: initdb in a
temporary directory, a free loopback port, stopped by PID at the end of the
module).  Two fake hosts are synced into it with their own
:class:`~vgpu_driver.placement.ProviderSync`; everything is then read back
over Placement's REST API through openstacksdk, and straight from the
database with psycopg2, so the test also proves which database it ran on.

The hosts: ``compute-t4`` is ``t4x8`` with half its T4s on T4-1B
(nvidia-222, the default type) and half on T4-2Q (nvidia-231, by address);
``compute-a100`` is ``a100-sriov`` serving A100-4C (nvidia-468) on its 16 VFs.
"""

import contextlib
from types import MappingProxyType

import pytest

from tests import postgres
from vgpu_driver import discovery
from vgpu_driver import inventory
from vgpu_driver import placement
from vgpu_driver import sysfs
from vgpu_driver.conf.mdev_settings import MdevConfig
from vgpu_driver.conf.mdev_settings import TypeConfig
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles
from vgpu_driver.placement_service import EmbeddedPlacement

T4_1B, T4_2Q, A100_4C = "nvidia-222", "nvidia-231", "nvidia-468"
T4_2Q_GPUS = ("0000:e7:00.0", "0000:e8:00.0", "0000:f4:00.0", "0000:f5:00.0")
T4_1B_GPUS = ("0000:18:00.0", "0000:19:00.0", "0000:35:00.0", "0000:36:00.0")
A100_GPU = "0000:41:00.0"

OWNER = "CUSTOM_OWNER_VGPU_DRIVER"
MANAGER = "CUSTOM_NVIDIA_VGPU_MANAGER_550_127_06"  # the shipped NVIDIA profiles'
# What each GPU's provider must hold, from the profiles' vendor limits:
# T4-1B max_instance=16, T4-2Q 8, A100-4C 10 (and 16 VFs >= 10).
EXPECTED = {
    **{
        ("compute-t4", gpu): (
            T4_1B,
            16,
            ("CUSTOM_MDEV_NVIDIA_222", MANAGER, OWNER, "CUSTOM_VGPU_GRID_T4_1B"),
        )
        for gpu in T4_1B_GPUS
    },
    **{
        ("compute-t4", gpu): (
            T4_2Q,
            8,
            ("CUSTOM_MDEV_NVIDIA_231", MANAGER, OWNER, "CUSTOM_VGPU_GRID_T4_2Q"),
        )
        for gpu in T4_2Q_GPUS
    },
    ("compute-a100", A100_GPU): (
        A100_4C,
        10,
        ("CUSTOM_MDEV_NVIDIA_468", MANAGER, OWNER, "CUSTOM_VGPU_NVIDIA_A100_4C"),
    ),
}
HOSTS = ("compute-t4", "compute-a100")

UNAVAILABLE = postgres.unavailable()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=UNAVAILABLE or "")


def _config(nodename):
    if nodename == "compute-t4":
        return MdevConfig(
            types=(TypeConfig(T4_1B), TypeConfig(T4_2Q, T4_2Q_GPUS)),
            default_type=T4_1B,
            by_address=MappingProxyType(dict.fromkeys(T4_2Q_GPUS, T4_2Q)),
        )
    return MdevConfig(types=(TypeConfig(A100_4C),), default_type=A100_4C)


def _provider_name(nodename, gpu):
    bus, slot_fn = gpu.split(":")[1:]
    slot, fn = slot_fn.split(".")
    return f"{nodename}_pci_0000_{bus}_{slot}_{fn}"


@pytest.fixture(scope="module")
def cluster():
    with postgres.private_cluster() as running:
        yield running


@pytest.fixture(scope="module")
def service(cluster):
    with EmbeddedPlacement(cluster.url) as served:
        yield served


@pytest.fixture(scope="module")
def synced(service, tmp_path_factory):
    """Both hosts synced once: ``{nodename: (tree, ProviderSync, first SyncReport)}``."""
    client = placement.Client(service.connection())
    result = {}
    for nodename, profile in (("compute-t4", "t4x8"), ("compute-a100", "a100-sriov")):
        root = str(tmp_path_factory.mktemp(nodename) / "sys")
        fakekernel.FakeKernel.build(root, profiles.load(profile))
        tree = inventory.compute(
            discovery.discover(sysfs.open_host(root)), _config(nodename), nodename
        )
        sync = placement.ProviderSync(client)
        result[nodename] = (tree, sync, sync.sync(tree))
    return result


@pytest.fixture(scope="module")
def conn(service):
    return service.connection()


def _get(conn, url):
    """One GET through openstacksdk's placement proxy, as JSON.

    Raw JSON rather than the sdk's resource classes: building those emits
    openstacksdk's own RemovedInSDK50Warning ("The _compute_attributes
    method is deprecated for removal"), which this suite turns into errors.
    """
    response = conn.placement.get(url, microversion=placement.MICROVERSION)
    assert response.status_code == 200, f"GET {url}: {response.status_code} {response.text}"
    return response.json()


def _providers(conn):
    """``{name: resource provider}`` as Placement lists them."""
    return {rp["name"]: rp for rp in _get(conn, "/resource_providers")["resource_providers"]}


def _gpu_uuids(conn, gpus):
    providers = _providers(conn)
    return sorted(providers[_provider_name(nodename, gpu)]["uuid"] for nodename, gpu in gpus)


def _candidates(conn, query):
    """``(allocation_requests, provider_summaries)`` of GET /allocation_candidates."""
    answer = _get(conn, f"/allocation_candidates?{query}")
    return answer["allocation_requests"], answer["provider_summaries"]


def test_database_is_postgresql(cluster, service, synced):
    import psycopg2
    from placement import db_api

    engine = db_api.get_placement_engine()
    assert (engine.dialect.name, engine.url.port) == ("postgresql", cluster.port)
    with contextlib.closing(psycopg2.connect(cluster.dsn())) as db, db.cursor() as cur:
        cur.execute("SELECT current_setting('server_version_num')::int")
        assert cur.fetchone()[0] >= 100000
        cur.execute("SELECT count(*) FROM resource_providers")
        count = cur.fetchone()[0]
        cur.execute("SELECT name FROM resource_providers")
        names = {row[0] for row in cur.fetchall()}
    assert count == len(HOSTS) + len(EXPECTED) == 11
    assert names == {*HOSTS, *(_provider_name(n, g) for n, g in EXPECTED)}


def test_first_sync_creates_every_provider(synced):
    for nodename, (tree, _sync, report) in synced.items():
        assert sorted(report.created) == sorted([nodename, *(p.name for p in tree.providers)])
        # The root's name lookup, and each GPU provider's: nothing else exists
        # yet, and no name may be another provider's.
        assert report.reads == 1 + len(tree.providers)
        assert not (report.updated or report.deleted or report.kept)
    assert len(synced["compute-t4"][0].providers) == 8
    assert len(synced["compute-a100"][0].providers) == 1


def test_providers_inventories_traits(conn, synced):
    providers = _providers(conn)
    assert set(providers) == {*HOSTS, *(_provider_name(n, g) for n, g in EXPECTED)}
    for nodename in HOSTS:
        root = providers[nodename]
        assert (root["parent_provider_uuid"], root["root_provider_uuid"]) == (None, root["uuid"])
        url = f"/resource_providers/{root['uuid']}"
        assert _get(conn, f"{url}/inventories")["inventories"] == {}
        assert _get(conn, f"{url}/traits")["traits"] == []
    for (nodename, gpu), (type_id, total, traits) in EXPECTED.items():
        rp = providers[_provider_name(nodename, gpu)]
        root_uuid = providers[nodename]["uuid"]
        assert (rp["parent_provider_uuid"], rp["root_provider_uuid"]) == (root_uuid, root_uuid)
        url = f"/resource_providers/{rp['uuid']}"
        assert _get(conn, f"{url}/inventories")["inventories"] == {
            "VGPU": {
                "total": total,
                "reserved": 0,
                "min_unit": 1,
                "max_unit": total,
                "step_size": 1,
                "allocation_ratio": 1.0,
            }
        }, (gpu, type_id)
        assert sorted(_get(conn, f"{url}/traits")["traits"]) == sorted(traits), (gpu, type_id)
    custom = set(_get(conn, "/traits?name=startswith:CUSTOM_")["traits"])
    assert custom == {t for _type, _total, traits in EXPECTED.values() for t in traits}


def test_unchanged_sync_is_one_read_and_no_write(synced):
    for tree, sync, _first in synced.values():
        report = sync.sync(tree)
        assert (report.reads, report.writes) == (1, 0), report
        assert not (report.planned or report.created or report.updated or report.deleted)


@pytest.mark.parametrize(
    ("trait", "gpus"),
    [
        ("CUSTOM_VGPU_GRID_T4_1B", [("compute-t4", g) for g in T4_1B_GPUS]),
        ("CUSTOM_MDEV_NVIDIA_231", [("compute-t4", g) for g in T4_2Q_GPUS]),
        ("CUSTOM_VGPU_NVIDIA_A100_4C", [("compute-a100", A100_GPU)]),
    ],
)
def test_allocation_candidates_by_type_trait(conn, synced, trait, gpus):
    """Only the GPUs serving the type, not their siblings under the same root."""
    requests, summaries = _candidates(conn, f"resources=VGPU:1&required={trait}")
    assert all(len(r["allocations"]) == 1 for r in requests)
    assert sorted(rp for r in requests for rp in r["allocations"]) == _gpu_uuids(conn, gpus)
    for request in requests:
        ((rp_uuid, allocation),) = request["allocations"].items()
        assert allocation["resources"] == {"VGPU": 1}
        assert trait in summaries[rp_uuid]["traits"]


def test_allocation_candidates_without_trait_offer_every_gpu(conn, synced):
    requests, summaries = _candidates(conn, "resources=VGPU:1")
    assert sorted(rp for r in requests for rp in r["allocations"]) == _gpu_uuids(conn, EXPECTED)
    capacity = sum(s["resources"].get("VGPU", {}).get("capacity", 0) for s in summaries.values())
    assert capacity == 4 * 16 + 4 * 8 + 10
