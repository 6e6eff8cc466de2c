"""``vgpu-manage sync`` and ``audit`` with one address-free nova.conf, into
the real Placement: each GPU's provider carries the type its model and
count resolve to."""

import json

from tests import confs
from tests.functional.test_placement_sync import T4
from tests.functional.test_placement_sync import api  # noqa: F401 - fixture
from tests.functional.test_placement_sync import placement_view
from tests.functional.test_placement_sync import run_cli
from tests.functional.test_placement_sync import service  # noqa: F401 - fixture


def provider(address):
    return "cn1_pci_" + address.replace(":", "_").replace(".", "_")


def test_sync_and_audit_follow_the_resolution(
    make_host,
    service,  # noqa: F811
    api,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    host = make_host("a100-sriov", "t4x8")
    args = (tmp_path, service, monkeypatch, host.paths.root)
    code, _, err = run_cli(*args, "sync", "-f", "json", conf=confs.FLEET)
    assert code == 0 and "10 created" in err
    view = placement_view(api, "cn1")
    manager = "CUSTOM_NVIDIA_VGPU_MANAGER_550_127_06"
    t4_4c = [
        "CUSTOM_MDEV_NVIDIA_319",
        manager,
        "CUSTOM_OWNER_VGPU_DRIVER",
        "CUSTOM_VGPU_GRID_T4_4C",
    ]
    t4_8c = [
        "CUSTOM_MDEV_NVIDIA_320",
        manager,
        "CUSTOM_OWNER_VGPU_DRIVER",
        "CUSTOM_VGPU_GRID_T4_8C",
    ]
    expected = {
        provider("0000:41:00.0"): (
            {"CUSTOM_A100_4C": (10, 0)},
            [
                "CUSTOM_MDEV_NVIDIA_468",
                manager,
                "CUSTOM_OWNER_VGPU_DRIVER",
                "CUSTOM_VGPU_NVIDIA_A100_4C",
            ],
        )
    }
    expected.update({provider(a): ({"VGPU": (4, 0)}, t4_4c) for a in T4[:4]})
    expected.update({provider(a): ({"VGPU": (2, 0)}, t4_8c) for a in T4[4:]})
    assert view.pop("cn1") == (None, {}, [])
    assert {name: (inv, traits) for name, (_parent, inv, traits) in view.items()} == expected
    code, out, _ = run_cli(*args, "audit", "-f", "json", conf=confs.FLEET)
    assert (code, json.loads(out)) == (0, [])
