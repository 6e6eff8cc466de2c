"""vgpu-manage flavor-spec: the extra specs a flavor of one type asks."""

import json
import sys

import pytest

from tests.unit.test_cli import run  # noqa: F401 - the fixture
from vgpu_driver.fake import nvml as fake_nvml

L40S = "0000:c1:00.0"
MIXED = ("nvidia-1155", "nvidia-1157", "nvidia-1159")
L40S_CONF = (
    "[devices]\nenabled_mdev_types = "
    + ", ".join(MIXED)
    + "\n"
    + "".join(f"[mdev_{t}]\ndevice_addresses = {L40S}\n" for t in MIXED)
)


@pytest.fixture
def mixed_host(make_host, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml)
    host = make_host("l40s-vfio")
    host.set_mixed_sizes(L40S, True)
    return host


def test_a_mixed_size_type_asks_mib_its_size_class_and_its_trait(mixed_host, run):  # noqa: F811
    code, out, _err = run(
        "--sysfs-root",
        mixed_host.paths.root,
        "flavor-spec",
        "nvidia-1155",
        "3",
        "-f",
        "json",
        conf=L40S_CONF,
    )
    assert code == 0
    assert {row["property"]: row["value"] for row in json.loads(out)} == {
        "resources_VGPU:CUSTOM_VGPU_FRAMEBUFFER_MIB": "12288",
        "resources_VGPU:CUSTOM_VGPU_SIZE_4096_MIB": "3",
        "trait_VGPU:CUSTOM_MDEV_NVIDIA_1155": "required",
    }


def test_a_type_no_gpu_serves_is_refused(mixed_host, run):  # noqa: F811
    code, out, err = run(
        "--sysfs-root", mixed_host.paths.root, "flavor-spec", "nvidia-1160", conf=L40S_CONF
    )
    assert (code, out) == (2, "")
    assert err.startswith("error: TYPE 'nvidia-1160': no GPU of this host serves it")
