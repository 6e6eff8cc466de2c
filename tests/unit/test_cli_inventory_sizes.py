"""``vgpu-manage inventory`` lists a mixed-size board's size classes as
Placement gets them, beside its framebuffer class."""

import json

import pytest

from tests.unit.test_cli_golden import cli  # noqa: F401 - the fixture
from tests.unit.test_cli_golden import l40s_idle  # noqa: F401 - the fixture
from tests.unit.test_cli_golden import l40s_mixed  # noqa: F401 - the fixture
from tests.unit.test_cli_golden import t4_busy  # noqa: F401 - the fixture
from vgpu_driver.cmd import host_view


@pytest.fixture
def trees(monkeypatch):
    """The provider trees the command computes, as it computes them."""
    found = []
    real = host_view.desired_tree

    def recording(*args, **kwargs):
        tree, snapshot = real(*args, **kwargs)
        found.append(tree)
        return tree, snapshot

    monkeypatch.setattr(host_view, "desired_tree", recording)
    return found


@pytest.mark.parametrize("host_name", ["l40s_mixed", "l40s_idle"])
def test_size_classes_are_the_inventories_placement_gets(
    request,
    cli,  # noqa: F811
    trees,
    host_name,
):
    host, conf, uri = request.getfixturevalue(host_name)
    code, out, _err = cli(
        "--sysfs-root", host.paths.root, "inventory", "-f", "json", conf=conf, uri=uri
    )
    assert code == 0
    ((row,), (tree,)) = json.loads(out), trees
    provider = tree.provider(row["provider"])
    placement = provider.inventory()
    assert row["resource_class"] == "CUSTOM_VGPU_FRAMEBUFFER_MIB"
    listed = {c["resource_class"]: c for c in row["size_classes"]}
    assert set(listed) == set(placement) - {row["resource_class"]}
    assert listed == {
        rc: {
            "resource_class": rc,
            "total": record["total"],
            "reserved": record["reserved"],
            "max_unit": record["max_unit"],
        }
        for rc, record in placement.items()
        if rc != row["resource_class"]
    }
    # One class per configured placement size, smallest first.
    assert [c["resource_class"] for c in row["size_classes"]] == [
        f"CUSTOM_VGPU_SIZE_{mib}_MIB" for mib in (4096, 8192, 12288, 24576)
    ]


def test_the_table_gives_each_size_class_a_line(
    request,
    cli,  # noqa: F811
    trees,
):
    host, conf, uri = request.getfixturevalue("l40s_mixed")
    code, out, _err = cli(
        "--sysfs-root", host.paths.root, "inventory", "-c", "size_classes", conf=conf, uri=uri
    )
    assert code == 0
    (tree,) = trees
    (provider,) = tree.providers
    placement = provider.inventory()
    cells = [line.strip("| ") for line in out.splitlines()[3:-1]]
    assert cells == [
        f"{rc} {placement[rc]['total']} (reserved {placement[rc]['reserved']}, "
        f"max {placement[rc]['max_unit']})"
        for rc in (f"CUSTOM_VGPU_SIZE_{mib}_MIB" for mib in (4096, 8192, 12288, 24576))
    ]


def test_providers_counting_vgpus_have_no_size_class(
    request,
    cli,  # noqa: F811
):
    host, conf, uri = request.getfixturevalue("t4_busy")
    code, out, _err = cli(
        "--sysfs-root", host.paths.root, "inventory", "-f", "json", conf=conf, uri=uri
    )
    assert code == 0
    rows = json.loads(out)
    assert rows and all(r["size_classes"] == [] for r in rows)
