"""``status`` and ``metrics`` say the same of every GPU of every fake
profile, with the SR-IOV boards' VFs on and off: its type(s), each type's
vGPUs (capacity, used, reserved), what the reserved units are held back
for, whether it is served, and the capacity its provider offers."""

import json

import pytest

from tests.unit import test_cli_golden
from tests.unit import test_cli_metrics
from tests.unit import test_cli_status
from vgpu_driver.fake import profiles

cli = test_cli_status.cli
MIB = 1024 * 1024
CONFS = {
    "a100-sriov": test_cli_status.A100_CONF,
    "a100-sriov-off": test_cli_status.A100_CONF,
    "a100-vfio": test_cli_status.A100_CONF,
    "h100-datacenter": test_cli_status.A100_CONF,
    "l40s-vfio": test_cli_golden.L40S_CONF,
    "m60-multi": "[devices]\nenabled_mdev_types = nvidia-35\n",
    "mtty": "[devices]\nenabled_mdev_types = mtty-2\n",
    "t4x8": test_cli_status.T4_CONF,
}
SRIOV = {name for name in CONFS if any("sriov" in gpu for gpu in profiles.load(name)["gpus"])}
# Every profile as it comes ("on": SR-IOV boards with every VF on), and
# those with an SR-IOV board once more with its VFs off.
CASES = [(name, "on") for name in sorted(CONFS)] + [(name, "off") for name in sorted(SRIOV)]


def by_gpu(found, name):
    """``{gpu: {other labels: value}}`` of one metric."""
    got = {}
    for (n, labels), value in found.items():
        if n == name:
            labels = dict(labels)
            gpu = labels.pop("gpu")
            got.setdefault(gpu, {})[tuple(sorted(labels.items()))] = value
    return got


def test_every_profile_has_a_configuration():
    assert set(CONFS) == set(profiles.names())
    assert SRIOV == {"a100-sriov", "a100-sriov-off", "a100-vfio", "l40s-vfio"}


@pytest.mark.parametrize(("profile", "vfs"), CASES)
def test_status_and_metrics_name_the_same_type_capacity_and_reasons(make_host, cli, profile, vfs):
    host = make_host(profile)
    if profile == "l40s-vfio" and vfs == "on":
        host.set_mixed_sizes(test_cli_golden.L40S, True)
    for gpu in profiles.load(profile)["gpus"]:
        wanted = gpu.get("sriov", {}).get("totalvfs", 0) if vfs == "on" else 0
        if "sriov" in gpu and gpu["sriov"]["numvfs"] != wanted:
            host.set_vfs(gpu["address"], wanted)
    conf = CONFS[profile]
    code, out, err = cli("--sysfs-root", host.paths.root, "status", "-f", "json", conf=conf)
    assert code == 0, err
    rows = {r["gpu"]: r for r in json.loads(out)}
    code, out, err = cli("--sysfs-root", host.paths.root, "metrics", conf=conf)
    assert code == 0, err
    found = test_cli_metrics.samples(out)
    configured = by_gpu(found, "vgpu_gpu_configured_type_info")
    counts = {
        name: by_gpu(found, f"vgpu_gpu_vgpus_{name}") for name in ("capacity", "used", "reserved")
    }
    reasons = by_gpu(found, "vgpu_gpu_vgpus_reserved_by_reason")
    fb_reasons = by_gpu(found, "vgpu_gpu_framebuffer_reserved_bytes")
    served = by_gpu(found, "vgpu_gpu_served")
    info = by_gpu(found, "vgpu_gpu_info")
    assert set(info) == set(rows)
    for gpu, row in rows.items():
        # The type: the one nova.conf gives it, provider or not.
        types = sorted(dict(k)["type"] for k in configured.get(gpu, {}))
        assert sorted((row["type"] or "").split(",") if row["type"] else []) == types, gpu
        # Each type's vGPUs.
        for name in ("capacity", "used", "reserved"):
            assert {dict(k)["type"]: v for k, v in counts[name].get(gpu, {}).items()} == {
                t["type"]: t[name] for t in row["vgpus"]
            }, (gpu, name)
        # The reasons, in the GPU's unit.
        if row["provider"] and row["name"] == "mixed sizes, in MiB":
            held = {dict(k)["reason"]: v / MIB for k, v in fb_reasons[gpu].items()}
            assert value_of(found, "vgpu_gpu_framebuffer_capacity_bytes", gpu) == row["total"] * MIB
        elif row["provider"]:
            held = {dict(k)["reason"]: v for k, v in reasons[gpu].items()}
            (capacity,) = [t["capacity"] for t in row["vgpus"] if t["type"] == row["type"]]
            assert capacity == row["total"]
        else:
            held = {}
            assert gpu not in reasons and gpu not in fb_reasons and row["total"] == 0
        assert {k: v for k, v in held.items() if v} == {
            k: v for k, v in row["reserved_for"].items() if v
        }, gpu
        assert sum(held.values()) == row["reserved"]
        assert list(served[gpu].values()) == [int(bool(row["provider"]))]
        (labels,) = info[gpu]
        assert dict(labels)["provider"] == (row["provider"] or "")


def value_of(found, name, gpu):
    return found[(name, frozenset({"gpu": gpu}.items()))]
