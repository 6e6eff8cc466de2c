"""Names that reach Placement: validated before any write, sent URL-encoded,
and matched exactly in what Placement answers (real Placement, real CLI)."""

import json

import pytest

from tests.functional import test_placement_sync as sync_tests
from vgpu_driver import placement
from vgpu_driver.cmd import base

service = sync_tests.service
api = sync_tests.api
CONF = "[devices]\nenabled_mdev_types = nvidia-468\n"


def everything(api):
    """Every provider in Placement with its parent: what a bad sync could touch."""
    return sorted(
        (p["name"], p["parent_provider_uuid"], p["generation"])
        for p in api("GET", "/resource_providers")["resource_providers"]
    )


def run(tmp_path, service, monkeypatch, host, nodename, *argv):
    return sync_tests.run_cli(
        tmp_path, service, monkeypatch, host.paths.root, "--nodename", nodename, *argv, conf=CONF
    )


@pytest.fixture
def other_host(make_host, tmp_path, service, monkeypatch, api):
    """Another compute node's tree, already in Placement."""
    code, _, _ = run(tmp_path, service, monkeypatch, make_host("a100-sriov"), "cn2", "sync")
    assert code == 0
    return everything(api)


def test_empty_nodename_touches_no_other_host(
    make_host, tmp_path, service, monkeypatch, api, other_host
):
    code, out, err = run(tmp_path, service, monkeypatch, make_host("a100-sriov"), "", "sync")
    assert code == base.EXIT_ERROR and out == ""
    assert err.splitlines() == [line for line in err.splitlines() if line.startswith("error:")]
    assert "Refusing nodename ''" in err
    assert everything(api) == other_host


@pytest.mark.parametrize("nodename", ["a+b", "a&in_tree=x", "node#1", "n o"])
def test_nodename_with_query_characters_syncs_and_audits(
    nodename, make_host, tmp_path, service, monkeypatch, api, other_host
):
    host = make_host("a100-sriov")
    for _ in range(2):
        code, _, err = run(tmp_path, service, monkeypatch, host, nodename, "sync")
        assert code == 0, err
    code, out, _ = run(tmp_path, service, monkeypatch, host, nodename, "audit", "-f", "json")
    assert (code, json.loads(out)) == (0, [])
    names = [n for n, _, _ in everything(api)]
    assert names.count(nodename) == 1
    assert names.count(f"{nodename}_pci_0000_41_00_0") == 1


def test_nodename_too_long_with_its_gpu_suffix_writes_nothing(
    make_host, tmp_path, service, monkeypatch, api
):
    nodename = "n" * 190
    code, _, err = run(tmp_path, service, monkeypatch, make_host("a100-sriov"), nodename, "sync")
    assert code == base.EXIT_ERROR
    assert "207 characters; Placement takes at most 200" in err
    assert everything(api) == []


def test_a_prefix_match_is_not_taken_for_the_provider():
    answer = [{"name": "cn10", "uuid": "u10"}, {"name": "cn1", "uuid": "u1"}]
    assert placement.exact_name_match(answer, "cn1")["uuid"] == "u1"
    assert placement.exact_name_match(answer[:1], "cn1") is None


def test_query_parameters_are_encoded():
    assert (
        placement.query_url("/resource_providers", name="a+b&c")
        == "/resource_providers?name=a%2Bb%26c"
    )
