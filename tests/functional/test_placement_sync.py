"""Per-GPU providers synced into the real Placement (openstack-placement,
served on 127.0.0.1 by this process), read back through openstacksdk."""

import contextlib
import io
import json
import os
import textwrap
import uuid

import pytest
from prometheus_client import parser as prometheus_parser

from tests import confs
from vgpu_driver import audit
from vgpu_driver import compute_api
from vgpu_driver import discovery
from vgpu_driver import inventory
from vgpu_driver import placement
from vgpu_driver import placement_service
from vgpu_driver.cmd import manage
from vgpu_driver.conf import mdev_types
from vgpu_driver.conf import placement as placement_conf
from vgpu_driver.fake import domains

A100 = "0000:41:00.0"
OWNER = "CUSTOM_OWNER_VGPU_DRIVER"
MANAGER = "CUSTOM_NVIDIA_VGPU_MANAGER_550_127_06"  # the shipped NVIDIA profiles'
T4 = [
    "0000:18:00.0",
    "0000:19:00.0",
    "0000:35:00.0",
    "0000:36:00.0",
    "0000:e7:00.0",
    "0000:e8:00.0",
    "0000:f4:00.0",
    "0000:f5:00.0",
]


@pytest.fixture
def service():
    with placement_service.EmbeddedPlacement() as running:
        yield running


@pytest.fixture
def api(service):
    conn = service.connection()

    def call(method, url, body=None):
        response = conn.placement.request(
            url, method, json=body, microversion=placement.MICROVERSION
        )
        return response.json() if response.content else None

    return call


@pytest.fixture
def tree_for(make_conf):
    def compute(host, conf_text, nodename="cn1", in_use=None):
        config = mdev_types.from_conf(make_conf(conf_text))
        return inventory.compute(discovery.discover(host), config, nodename, in_use)

    return compute


def placement_view(api, root_name):
    """``{name: (parent name, {rc: (total, reserved)}, traits)}`` under a root."""
    root = api("GET", f"/resource_providers?name={root_name}")["resource_providers"][0]
    listed = api("GET", f"/resource_providers?in_tree={root['uuid']}")["resource_providers"]
    names = {p["uuid"]: p["name"] for p in listed}
    view = {}
    for rp in listed:
        inventories = api("GET", f"/resource_providers/{rp['uuid']}/inventories")
        traits = api("GET", f"/resource_providers/{rp['uuid']}/traits")["traits"]
        view[rp["name"]] = (
            names.get(rp["parent_provider_uuid"]),
            {rc: (i["total"], i["reserved"]) for rc, i in inventories["inventories"].items()},
            sorted(traits),
        )
    return view


PROFILES = {
    "t4x8": (
        "[devices]\nenabled_mdev_types = nvidia-231\n",
        {f"cn1_pci_{a.replace(':', '_').replace('.', '_')}": ("VGPU", 8) for a in T4},
        ["CUSTOM_MDEV_NVIDIA_231", MANAGER, OWNER, "CUSTOM_VGPU_GRID_T4_2Q"],
    ),
    "a100-sriov": (
        "[devices]\nenabled_mdev_types = nvidia-468\n",
        {"cn1_pci_0000_41_00_0": ("VGPU", 10)},
        ["CUSTOM_MDEV_NVIDIA_468", MANAGER, OWNER, "CUSTOM_VGPU_NVIDIA_A100_4C"],
    ),
    "m60-multi": (
        confs.NOVA_GUIDE_M60,
        {
            "cn1_pci_0000_84_00_0": ("VGPU", 16),
            "cn1_pci_0000_85_00_0": ("VGPU", 16),
            "cn1_pci_0000_86_00_0": ("VGPU", 8),
        },
        None,
    ),
    "mtty": (
        "[devices]\nenabled_mdev_types = mtty-2\n[mdev_mtty-2]\nmdev_class = CUSTOM_SERIAL\n",
        {"cn1_mtty_mtty": ("CUSTOM_SERIAL", 12)},
        ["CUSTOM_MDEV_MTTY_2", OWNER, "CUSTOM_VGPU_DUAL_PORT_SERIAL"],
    ),
    "l40s-vfio": (
        "[devices]\nenabled_mdev_types = nvidia-1156\n[mdev_nvidia-1156]\nmax_instances = 6\n",
        {"cn1_pci_0000_c1_00_0": ("VGPU", 6)},
        ["CUSTOM_MDEV_NVIDIA_1156", MANAGER, OWNER, "CUSTOM_VGPU_NVIDIA_L40S_8Q"],
    ),
}


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_first_sync_of_each_profile(profile, make_host, tree_for, service, api):
    conf_text, expected, traits = PROFILES[profile]
    tree = tree_for(make_host(profile), conf_text)
    report = placement.ProviderSync(placement.Client(service.connection())).sync(tree)
    assert sorted(report.created) == sorted(["cn1", *expected])
    view = placement_view(api, "cn1")
    assert view.pop("cn1") == (None, {}, [])
    assert {name: (parent, inv) for name, (parent, inv, _) in view.items()} == {
        name: ("cn1", {rc: (total, 0)}) for name, (rc, total) in expected.items()
    }
    for _parent, _inv, got in view.values():
        assert traits is None or got == traits


def test_gpus_come_and_go(make_host, tree_for, service, api):
    host = make_host("a100-sriov", "t4x8")
    conf = (
        "[devices]\nenabled_mdev_types = nvidia-468, nvidia-231\n"
        "[mdev_nvidia-468]\ndevice_addresses = 0000:41:00.0\n"
    )
    sync = placement.ProviderSync(placement.Client(service.connection()))
    host.set_vfs(A100, 0)  # before the vendor enabled the VFs
    sync.sync(tree_for(host, conf))
    assert "cn1_pci_0000_41_00_0" not in placement_view(api, "cn1")
    host.set_vfs(A100, 16)  # the GPU is added
    report = sync.sync(tree_for(host, conf))
    assert report.created == ["cn1_pci_0000_41_00_0"]
    a100 = sync.known["cn1_pci_0000_41_00_0"].uuid
    host.set_vfs(A100, 0)  # and removed, with nothing allocated
    report = sync.sync(tree_for(host, conf))
    assert report.deleted == ["cn1_pci_0000_41_00_0"]
    assert api("GET", f"/resource_providers?uuid={a100}")["resource_providers"] == []
    assert len(placement_view(api, "cn1")) == 9


def test_other_services_providers_under_the_root_are_left_alone(make_host, tree_for, service, api):
    """nova's PCI-in-Placement providers and Cyborg's share the root and the
    ``<root>_`` name prefix; the sync and the audit leave them to their owners,
    while our own stale providers go, also one of a class no longer
    configured (its type traits say it is ours)."""
    from vgpu_driver import audit

    host = make_host("a100-sriov")
    conf = "[devices]\nenabled_mdev_types = nvidia-468\n"
    sync = placement.ProviderSync(placement.Client(service.connection()))
    sync.sync(tree_for(host, conf))
    root = sync.root_uuid
    foreign = {  # name: (class, owner trait)
        "cn1_0000:81:00.0": ("CUSTOM_PCI_10DE_1EB8", "COMPUTE_MANAGED_PCI_DEVICE"),
        "cn1_0000:82:00.0": ("VGPU", "COMPUTE_MANAGED_PCI_DEVICE"),
        "cn1_fpga_0": ("FPGA", "OWNER_CYBORG"),
        "cn1_nic_0": ("CUSTOM_NIC_VF", None),
    }
    ours_before = {"cn1_pci_0000_42_00_0": ("CUSTOM_A100_OLD", "CUSTOM_VGPU_NVIDIA_A100_4C")}
    for name, (rc, trait) in {**foreign, **ours_before}.items():
        rp = api("POST", "/resource_providers", {"name": name, "parent_provider_uuid": root})
        if rc.startswith("CUSTOM_"):
            api("PUT", f"/resource_classes/{rc}")
        if trait and trait.startswith("CUSTOM_"):
            api("PUT", f"/traits/{trait}")
        api(
            "PUT",
            f"/resource_providers/{rp['uuid']}/inventories",
            {"resource_provider_generation": 0, "inventories": {rc: {"total": 1}}},
        )
        if trait:
            api(
                "PUT",
                f"/resource_providers/{rp['uuid']}/traits",
                {"resource_provider_generation": 1, "traits": [trait]},
            )
    host.set_vfs(A100, 0)  # our GPU goes, with nothing allocated
    tree = tree_for(host, conf)
    drifts = audit.audit(sync, tree, discovery.discover(host), [], {})
    stale = ["cn1_pci_0000_41_00_0", *ours_before]
    assert [(d.kind, d.provider) for d in drifts] == [("stale-provider", n) for n in stale]
    report = sync.sync(tree)
    assert (sorted(report.deleted), report.kept) == (stale, [])
    assert sorted(placement_view(api, "cn1")) == sorted(["cn1", *foreign])
    assert audit.audit(sync, tree, discovery.discover(host), [], {}) == []


def test_a_vanished_gpu_with_allocations_is_kept_fully_reserved(make_host, tree_for, service, api):
    host = make_host("a100-sriov")
    conf = "[devices]\nenabled_mdev_types = nvidia-468\n"
    sync = placement.ProviderSync(placement.Client(service.connection()))
    sync.sync(tree_for(host, conf))
    a100 = sync.known["cn1_pci_0000_41_00_0"].uuid
    consumer = str(uuid.uuid4())
    api(
        "PUT",
        f"/allocations/{consumer}",
        {
            "allocations": {a100: {"resources": {"VGPU": 1}}},
            "project_id": "p",
            "user_id": "u",
            "consumer_generation": None,
            "consumer_type": "INSTANCE",
        },
    )
    host.set_vfs(A100, 0)
    report = sync.sync(tree_for(host, conf))
    assert report.kept == [("cn1_pci_0000_41_00_0", [consumer])] and report.deleted == []
    assert placement_view(api, "cn1")["cn1_pci_0000_41_00_0"][1] == {"VGPU": (10, 10)}


def test_type_change_reserves_the_draining_gpu_and_keeps_operator_traits(
    make_host, tree_for, service, api
):
    old = str(uuid.uuid4())
    host = make_host("t4x8", mdevs=[{"parent": T4[0], "type": "nvidia-222", "uuid": old}])
    sync = placement.ProviderSync(placement.Client(service.connection()))
    sync.sync(tree_for(host, "[devices]\nenabled_mdev_types = nvidia-222\n"))
    first = sync.known["cn1_pci_0000_18_00_0"]
    api("PUT", "/traits/CUSTOM_RACK_A")
    api(
        "PUT",
        f"/resource_providers/{first.uuid}/traits",
        {
            "resource_provider_generation": api("GET", f"/resource_providers/{first.uuid}")[
                "generation"
            ],
            "traits": sorted([*first.traits, "CUSTOM_RACK_A"]),
        },
    )
    # The operator switches the host to T4-2Q while a guest still uses the old mdev.
    tree = tree_for(host, "[devices]\nenabled_mdev_types = nvidia-231\n", in_use={old})
    sync.sync(tree)
    name, inv, traits = placement_view(api, "cn1")["cn1_pci_0000_18_00_0"]
    assert inv == {"VGPU": (8, 8)}
    assert traits == [
        "CUSTOM_MDEV_NVIDIA_231",
        MANAGER,
        OWNER,
        "CUSTOM_RACK_A",
        "CUSTOM_VGPU_GRID_T4_2Q",
    ]
    assert tree.by_gpu(T4[0]).reason.startswith("draining:")
    assert placement_view(api, "cn1")["cn1_pci_0000_19_00_0"][1] == {"VGPU": (8, 0)}


def test_sixteen_hosts_of_eight_gpus_and_their_candidates(make_host, tree_for, service, api):
    host = make_host("t4x8")
    trees = [
        tree_for(
            host,
            f"[devices]\nenabled_mdev_types = {'nvidia-231' if n % 2 else 'nvidia-222'}\n",
            f"host-{n:02d}",
        )
        for n in range(16)
    ]
    client = placement.Client(service.connection())
    for tree in trees:
        placement.ProviderSync(client).sync(tree)
    candidates = api(
        "GET", "/allocation_candidates?resources=VGPU:1&required=CUSTOM_VGPU_GRID_T4_2Q"
    )
    chosen = {rp for request in candidates["allocation_requests"] for rp in request["allocations"]}
    expected = {
        sync_uuid
        for tree in trees
        if tree.providers[0].type_id == "nvidia-231"
        for sync_uuid in _uuids(api, tree)
    }
    assert len(chosen) == 64 and chosen == expected
    everything = api("GET", "/allocation_candidates?resources=VGPU:1")
    assert len(everything["allocation_requests"]) == 128


def _uuids(api, tree):
    return {
        api("GET", f"/resource_providers?name={p.name}")["resource_providers"][0]["uuid"]
        for p in tree.providers
    }


def run_cli(tmp_path, service, monkeypatch, sysfs_root, *argv, conf=""):
    for key, value in service.cli_environment().items():
        monkeypatch.setenv(key, value)
    conf_file = tmp_path / "nova.conf"
    conf_file.write_text(textwrap.dedent(conf))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = manage.main(
            [
                "--config-file",
                str(conf_file),
                "--nodename",
                "cn1",
                "--sysfs-root",
                sysfs_root,
                "--state-dir",
                str(tmp_path / "s"),
                "--libvirt-uri",
                "test:///default",
                *argv,
            ]
        )
    return code, out.getvalue(), err.getvalue()


def test_cli_sync_dry_run_sync_and_audit(make_host, service, api, tmp_path, monkeypatch):
    host = make_host("a100-sriov")
    conf = "[devices]\nenabled_mdev_types = nvidia-468\n"
    args = (tmp_path, service, monkeypatch, host.paths.root)
    code, out, err = run_cli(*args, "sync", "--dry-run", "-f", "json", conf=conf)
    planned = json.loads(out)
    assert code == 0 and [r["method"] for r in planned][:2] == ["POST", "POST"]
    assert "would make" in err
    assert api("GET", "/resource_providers")["resource_providers"] == []
    code, out, err = run_cli(*args, "sync", "-f", "value", "-c", "method", conf=conf)
    assert code == 0 and "1 created" not in err and "2 created" in err
    code, out, _ = run_cli(*args, "audit", "-f", "json", conf=conf)
    assert (code, json.loads(out)) == (0, [])
    # Placement allocates a vGPU nobody holds here: drift, exit 1.
    a100 = api("GET", "/resource_providers?name=cn1_pci_0000_41_00_0")["resource_providers"][0][
        "uuid"
    ]
    ghost = str(uuid.uuid4())
    api(
        "PUT",
        f"/allocations/{ghost}",
        {
            "allocations": {a100: {"resources": {"VGPU": 1}}},
            "project_id": "p",
            "user_id": "u",
            "consumer_generation": None,
            "consumer_type": "INSTANCE",
        },
    )
    host.create_mdev("0000:41:00.4", "nvidia-470", str(uuid.uuid4()))  # blocks the GPU
    assert run_cli(*args, "claims", "init")[0] == 0
    code, out, err = run_cli(*args, "audit", "-f", "json", conf=conf)
    kinds = {(r["kind"], r["consumer"]) for r in json.loads(out)}
    assert code == 1
    assert kinds == {("allocation-without-mdev", ghost), ("inventory", None)}
    # No nova here to say whether the ghost is a move's: said once, shown as drift.
    assert err.count("warning: nova's API did not list the migrations of host cn1") == 1
    # What it found is left for vgpu-manage metrics.
    code, out, err = run_cli(*args, "metrics", conf=conf)
    samples = [
        s
        for family in prometheus_parser.text_string_to_metric_families(out)
        for s in family.samples
    ]
    drift = {s.labels["kind"]: s.value for s in samples if s.name == "vgpu_placement_drift"}
    assert code == 0
    assert drift == {
        kind: (1 if kind in ("allocation-without-mdev", "inventory") else 0) for kind in audit.KINDS
    }
    (ran,) = [s.value for s in samples if s.name == "vgpu_audit_last_run_timestamp_seconds"]
    assert ran == audit.read_record(str(tmp_path / "s"))["at"]
    # A record that cannot be written costs one warning, not the audit.
    record = tmp_path / "s" / audit.RECORD_FILE
    record.unlink()
    record.mkdir()
    code, out, err = run_cli(*args, "audit", "-f", "json", conf=conf)
    assert code == 1 and len(json.loads(out)) == 2
    assert err.count("warning: the audit's result was not recorded for vgpu-manage metrics: ") == 1
    assert os.listdir(tmp_path / "s").count(audit.RECORD_FILE) == 1
    assert not [f for f in os.listdir(tmp_path / "s") if f.endswith(".tmp")]


def test_audit_counts_a_pending_move_allocation_as_its_instance(make_host, tree_for, service, api):
    """A resize awaiting confirmation: nova holds the source's allocation
    under the migration's UUID while the guest keeps its vGPU here."""
    from vgpu_driver import audit

    host = make_host("t4x8")
    instance, migration, mdev = (str(uuid.uuid4()) for _ in range(3))
    host.create_mdev(T4[0], "nvidia-222", mdev)
    guests = domains.InProcessDomains()
    guests.define(instance, [mdev])
    tree = tree_for(host, "[devices]\nenabled_mdev_types = nvidia-222\n", in_use={mdev})
    sync = placement.ProviderSync(placement.Client(service.connection()))
    sync.sync(tree)
    rp = api("GET", f"/resource_providers?name={tree.providers[0].name}")["resource_providers"][0][
        "uuid"
    ]
    api(
        "PUT",
        f"/allocations/{migration}",
        {
            "allocations": {rp: {"resources": {"VGPU": 1}}},
            "project_id": "p",
            "user_id": "u",
            "consumer_generation": None,
            "consumer_type": "MIGRATION",
        },
    )
    snapshot = discovery.discover(host)
    users = guests.mdev_users()
    without = audit.audit(sync, tree, snapshot, [], users)
    assert sorted((d.kind, d.consumer) for d in without) == [
        ("allocation-without-mdev", migration),
        ("mdev-without-allocation", instance),
    ]
    moves = compute_api.moves_from(
        [
            {
                "uuid": migration,
                "instance_uuid": instance,
                "status": "finished",
                "source_compute": "cn1",
                "dest_compute": "cn2",
            }
        ],
        "cn1",
    )
    assert audit.audit(sync, tree, snapshot, [], users, moves=lambda: moves) == []
    # Once nova confirmed, an allocation left under the migration is drift again.
    ended = compute_api.moves_from(
        [
            {
                "uuid": migration,
                "instance_uuid": instance,
                "status": "confirmed",
                "source_compute": "cn1",
                "dest_compute": "cn2",
            }
        ],
        "cn1",
    )
    assert len(audit.audit(sync, tree, snapshot, [], users, moves=lambda: ended)) == 2
    # Confirmed: the allocation is the instance's, nothing differs, nova is not asked.
    api("DELETE", f"/allocations/{migration}")
    api(
        "PUT",
        f"/allocations/{instance}",
        {
            "allocations": {rp: {"resources": {"VGPU": 1}}},
            "project_id": "p",
            "user_id": "u",
            "consumer_generation": None,
            "consumer_type": "INSTANCE",
        },
    )
    asked = []
    assert audit.audit(sync, tree, snapshot, [], users, moves=lambda: asked.append(1) or {}) == []
    assert asked == []


def test_audit_sees_a_guest_placement_does_not_know(make_host, tree_for, service):
    from vgpu_driver import audit

    host = make_host("t4x8")
    used = str(uuid.uuid4())
    host.create_mdev(T4[0], "nvidia-222", used)
    guests = domains.InProcessDomains()
    guests.define("guest-1", [used])
    tree = tree_for(host, "[devices]\nenabled_mdev_types = nvidia-222\n", in_use={used})
    sync = placement.ProviderSync(placement.Client(service.connection()))
    sync.sync(tree)
    drifts = audit.audit(sync, tree, discovery.discover(host), [], guests.mdev_users())
    assert [(d.kind, d.consumer, d.gpu) for d in drifts] == [
        ("mdev-without-allocation", "guest-1", T4[0])
    ]


def test_credentials_from_a_placement_section(make_host, tree_for, service, make_conf, monkeypatch):
    """The keystoneauth options nova reads in [placement] reach Placement."""
    for key in list(os.environ):
        if key.startswith("OS_"):
            monkeypatch.delenv(key)
    conf = make_conf(f"""
        [placement]
        auth_type = admin_token
        endpoint = {service.endpoint}
        token = admin
        """)
    connection = placement_conf.connection(conf)
    host = make_host("a100-sriov")
    report = placement.ProviderSync(placement.Client(connection)).sync(
        tree_for(host, "[devices]\nenabled_mdev_types = nvidia-468\n")
    )
    assert report.created == ["cn1", "cn1_pci_0000_41_00_0"]
