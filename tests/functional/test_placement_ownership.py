"""``vgpu-manage sync`` writes only providers that are vgpu-driver's.

Each case puts into the real Placement (served in-process) a provider that
holds a name this host's sync would write: a GPU provider given as the
nodename, another service's provider, another tree's root or child.  The
sync refuses with one ``error:`` line naming it, and every provider in
Placement keeps its generation, inventories and traits; the audit lists the
clash.  A provider an older vgpu-driver created, before providers carried
the owner trait, is adopted.
"""

import contextlib
import io
import json

import pytest

from vgpu_driver import placement
from vgpu_driver import placement_service
from vgpu_driver.cmd import base
from vgpu_driver.cmd import manage

GPU = "cn1_pci_0000_41_00_0"
CONF = "[devices]\nenabled_mdev_types = nvidia-468\n"
TYPE_TRAITS = ["CUSTOM_MDEV_NVIDIA_468", "CUSTOM_VGPU_NVIDIA_A100_4C"]
MANAGER = "CUSTOM_NVIDIA_VGPU_MANAGER_550_127_06"  # the shipped A100 profile's
REFUSING = f"Refusing to write provider {GPU}: "


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
        assert response.status_code < 400, (method, url, response.text)
        return response.json() if response.content else None

    return call


@pytest.fixture
def cli(make_host, service, tmp_path, monkeypatch):
    host = make_host("a100-sriov")
    for key, value in service.cli_environment().items():
        monkeypatch.setenv(key, value)
    conf_file = tmp_path / "nova.conf"
    conf_file.write_text(CONF)

    def run(*argv, nodename="cn1"):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = manage.main(
                [
                    "--config-file",
                    str(conf_file),
                    "--nodename",
                    nodename,
                    "--sysfs-root",
                    host.paths.root,
                    "--state-dir",
                    str(tmp_path / "state"),
                    "--libvirt-uri",
                    "test:///default",
                    *argv,
                ]
            )
        return code, out.getvalue(), err.getvalue()

    return run


def snapshot(api):
    """Every provider: name, uuid, generation, parent, root, inventories, traits."""
    view = []
    for rp in api("GET", "/resource_providers")["resource_providers"]:
        url = f"/resource_providers/{rp['uuid']}"
        view.append(
            (
                rp["name"],
                rp["uuid"],
                rp["generation"],
                rp["parent_provider_uuid"],
                rp["root_provider_uuid"],
                api("GET", f"{url}/inventories")["inventories"],
                sorted(api("GET", f"{url}/traits")["traits"]),
            )
        )
    return sorted(view, key=str)


def make_provider(api, name, parent=None, inventories=None, traits=()):
    body = {"name": name}
    if parent:
        body["parent_provider_uuid"] = parent
    rp = api("POST", "/resource_providers", body)
    generation = rp["generation"]
    if inventories:
        for rc in inventories:
            if rc.startswith("CUSTOM_"):
                api("PUT", f"/resource_classes/{rc}")
        generation = api(
            "PUT",
            f"/resource_providers/{rp['uuid']}/inventories",
            {
                "resource_provider_generation": generation,
                "inventories": {
                    rc: inv if isinstance(inv, dict) else {"total": inv}
                    for rc, inv in inventories.items()
                },
            },
        )["resource_provider_generation"]
    if traits:
        for trait in traits:
            if trait.startswith("CUSTOM_"):
                api("PUT", f"/traits/{trait}")
        api(
            "PUT",
            f"/resource_providers/{rp['uuid']}/traits",
            {"resource_provider_generation": generation, "traits": sorted(traits)},
        )
    return rp["uuid"]


def assert_refused(api, cli, before, culprit, argv=("sync",), nodename="cn1"):
    code, out, err = cli(*argv, nodename=nodename)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == base.EXIT_ERROR, err
    assert len(errors) == 1, err
    assert culprit in errors[0], errors[0]
    assert "nothing was written" in errors[0]
    assert out == "" and "Traceback" not in err
    assert snapshot(api) == before
    return errors[0]


def audit_rows(cli, nodename="cn1"):
    code, out, err = cli("audit", "-f", "json", nodename=nodename)
    return code, [(r["kind"], r["provider"]) for r in json.loads(out)], err


@pytest.mark.parametrize("argv", [("sync",), ("sync", "--dry-run")])
def test_a_gpu_providers_name_as_nodename_is_refused(api, cli, argv):
    """Taken for a root, it would get a host's worth of providers inside
    another host's tree."""
    assert cli("sync")[0] == 0
    before = snapshot(api)
    error = assert_refused(
        api,
        cli,
        before,
        REFUSING + "it would be this host's root provider "
        "but is another provider's child (parent cn1, traits "
        "CUSTOM_MDEV_NVIDIA_468, CUSTOM_NVIDIA_VGPU_MANAGER_550_127_06, "
        "CUSTOM_OWNER_VGPU_DRIVER, "
        "CUSTOM_VGPU_NVIDIA_A100_4C)",
        argv,
        nodename=GPU,
    )
    assert f"{GPU}_pci" not in error
    code, rows, err = audit_rows(cli, nodename=GPU)
    assert (code, rows) == (1, [("name-clash", GPU)]), err
    assert snapshot(api) == before


def test_a_new_roots_gpu_name_in_another_tree_is_refused(api, cli):
    """No root of this name yet; the GPU's name is a provider of another
    tree, which a new root's child would have adopted."""
    other = make_provider(api, "other")
    make_provider(api, GPU, parent=other, inventories={"VGPU": 4})
    before = snapshot(api)
    assert_refused(
        api, cli, before, REFUSING + "it is in another provider tree (parent other, traits none)"
    )
    assert "cn1" not in [rp[0] for rp in before]  # the root was not created either


@pytest.mark.parametrize(
    "inventories, traits",
    [
        ({"CUSTOM_PCI_10DE_20B5": 1}, ["COMPUTE_MANAGED_PCI_DEVICE"]),
        ({"VGPU": 7}, ["COMPUTE_MANAGED_PCI_DEVICE"]),
        ({"VGPU": 7}, ["CUSTOM_OWNER_VGPU_DRIVER", "OWNER_CYBORG"]),
        ({"FPGA": 2}, ["CUSTOM_RACK_A", "OWNER_CYBORG"]),
        ({"CUSTOM_NIC_VF": 8}, []),
    ],
    ids=["nova-pci", "nova-pci-vgpu", "cyborg-marked", "cyborg-fpga", "unmarked-nic"],
)
def test_another_owners_provider_under_the_root_is_refused(api, cli, inventories, traits):
    """Same name, same parent: another service's provider keeps its
    inventory and traits."""
    root = make_provider(api, "cn1")
    make_provider(api, GPU, parent=root, inventories=inventories, traits=traits)
    before = snapshot(api)
    assert_refused(
        api,
        cli,
        before,
        REFUSING + "it is not vgpu-driver's (parent cn1, traits "
        f"{', '.join(sorted(traits)) or 'none'})",
    )
    code, rows, err = audit_rows(cli)
    assert (code, rows) == (1, [("name-clash", GPU)]), err
    assert snapshot(api) == before


@pytest.mark.parametrize("with_root", [False, True], ids=["no-root", "root"])
def test_another_trees_root_with_a_gpu_providers_name_is_refused(api, cli, with_root):
    """A compute node once reported under a GPU provider's name keeps its
    own inventory."""
    if with_root:
        make_provider(api, "cn1")
    make_provider(
        api,
        GPU,
        inventories={"DISK_GB": 100, "MEMORY_MB": 2048},
        traits=["COMPUTE_STATUS_DISABLED"],
    )
    before = snapshot(api)
    assert_refused(
        api,
        cli,
        before,
        REFUSING + "it is the root of another provider tree "
        "(a root provider, traits COMPUTE_STATUS_DISABLED)",
    )
    code, rows, err = audit_rows(cli)
    assert code == 1 and ("name-clash", GPU) in rows, err
    assert ("missing-provider", GPU) not in rows
    assert snapshot(api) == before


def test_a_provider_deeper_in_the_tree_without_the_owner_trait_is_refused(api, cli):
    root = make_provider(api, "cn1")
    numa = make_provider(api, "cn1_numa_0", parent=root)
    make_provider(api, GPU, parent=numa, inventories={"VGPU": 10}, traits=TYPE_TRAITS)
    before = snapshot(api)
    assert_refused(
        api,
        cli,
        before,
        REFUSING + "it is not vgpu-driver's (parent cn1_numa_0, "
        "root cn1, traits CUSTOM_MDEV_NVIDIA_468, CUSTOM_VGPU_NVIDIA_A100_4C)",
    )


def test_an_unmarked_provider_of_an_older_vgpu_driver_is_adopted(api, cli):
    """Created before providers carried the owner trait: a child of the
    root with only mdev classes.  It gets the trait, keeps its uuid and the
    operator's trait, and later syncs write nothing."""
    root = make_provider(api, "cn1")
    uuid = make_provider(
        api,
        GPU,
        parent=root,
        inventories={"VGPU": {"total": 10, "max_unit": 10}},
        traits=[*TYPE_TRAITS, "CUSTOM_RACK_A"],
    )
    code, rows, err = audit_rows(cli)
    assert (code, rows) == (1, [("traits", GPU)]), err
    code, out, err = cli("sync", "-f", "json")
    assert code == 0, err
    assert "0 created, 1 updated" in err
    planned = [(r["method"], r["url"]) for r in json.loads(out)]
    assert planned[-1] == ("PUT", f"/resource_providers/{uuid}/traits")
    assert all(method == "PUT" and url.startswith("/traits/") for method, url in planned[:-1])
    adopted = {rp[0]: rp for rp in snapshot(api)}[GPU]
    assert adopted[1] == uuid
    assert adopted[6] == sorted(
        [*TYPE_TRAITS, MANAGER, "CUSTOM_OWNER_VGPU_DRIVER", "CUSTOM_RACK_A"]
    )
    before = snapshot(api)
    code, out, err = cli("sync", "-f", "json")
    assert (code, json.loads(out)) == (0, []), err
    assert snapshot(api) == before
    code, rows, err = audit_rows(cli)
    assert (code, rows) == (0, []), err


def test_every_gpu_provider_sync_creates_carries_the_owner_trait(api, cli):
    assert cli("sync")[0] == 0
    traits = {rp[0]: rp[6] for rp in snapshot(api)}
    assert traits == {"cn1": [], GPU: sorted([*TYPE_TRAITS, MANAGER, "CUSTOM_OWNER_VGPU_DRIVER"])}
    # An operator cannot take the trait away: it is vgpu-driver's to keep.
    gpu = api("GET", f"/resource_providers?name={GPU}")["resource_providers"][0]
    api(
        "PUT",
        f"/resource_providers/{gpu['uuid']}/traits",
        {"resource_provider_generation": gpu["generation"], "traits": TYPE_TRAITS},
    )
    assert audit_rows(cli)[:2] == (1, [("traits", GPU)])
    assert cli("sync")[0] == 0
    assert {rp[0]: rp[6] for rp in snapshot(api)} == traits
