"""The shipped recording rules and the documented dcgm-exporter join,
evaluated by Prometheus' own ``promtool`` on what ``vgpu-manage metrics``
printed for a fake host: T4s (one draining from nvidia-222 to nvidia-231,
its guests' old vGPUs still there), and an L40S serving mixed sizes.
"""

import contextlib
import io
import json

import pytest

from tests import libvirt_domains
from tests import promtool
from vgpu_driver.cmd import manage

T4_DRAINING = "0000:18:00.0"
T4_BUSY = "0000:19:00.0"
L40S = "0000:c1:00.0"
MIXED = ("nvidia-1155", "nvidia-1157", "nvidia-1159")
CONF = (
    "[devices]\nenabled_mdev_types = nvidia-231, "
    + ", ".join(MIXED)
    + "\n"
    + "".join(f"[mdev_{t}]\ndevice_addresses = {L40S}\n" for t in MIXED)
)
MINUTES = 10
# A sample of dcgm-exporter's exposition for the same host, in its format:
# one series per physical GPU and field, labelled gpu (its index), UUID,
# pci_bus_id (NVML's, eight hex digits of domain, upper case), device,
# modelName and Hostname.
DCGM = "".join(
    f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}",UUID="GPU-{i:08x}-0000-4000-8000-00000000000{i}",'
    f'pci_bus_id="{bus}",device="nvidia{i}",modelName="{model}",Hostname="cn1"}} {util}\n'
    for i, (bus, model, util) in enumerate(
        [
            ("00000000:18:00.0", "Tesla T4", 35),
            ("00000000:19:00.0", "Tesla T4", 80),
            ("00000000:1A:00.0", "Tesla T4", 0),
            ("00000000:C1:00.0", "NVIDIA L40S", 55),
        ]
    )
)
DCGM = (
    "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
    "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n" + DCGM
)
# The join doc/source/admin/metrics.rst documents: each guest's vGPU with
# the use of the GPU it is on.
JOIN = (
    'label_replace(vgpu_vgpu_info{instance_uuid!=""}, "Hostname", "$1", "nodename", '
    '"(.*)") * on (Hostname, pci_bus_id) group_left (modelName, UUID) '
    "DCGM_FI_DEV_GPU_UTIL"
)


def uid(n):
    return f"00000000-0000-4000-8000-{n:012d}"


@pytest.fixture
def host_and_uri(make_host, tmp_path, fake_kernel_cli):
    return make_mixed(make_host, tmp_path)


def make_mixed(make_host, tmp_path):
    """The host, and the URI of libvirt's test driver holding its guests."""
    host = make_host("t4x8", "l40s-vfio")
    for n in (1, 2):  # the old type's vGPUs, guests still on them
        host.create_mdev(T4_DRAINING, "nvidia-222", uid(n))
    for n in (3, 4, 5):
        host.create_mdev(T4_BUSY, "nvidia-231", uid(n))
    host.set_mixed_sizes(L40S, True)
    host.set_vendor_vgpu_type("0000:c1:00.4", 1155)
    host.set_vendor_vgpu_type("0000:c1:00.5", 1157)
    uri = libvirt_domains.node_file(
        tmp_path / "node.xml",
        [
            libvirt_domains.domain_xml("instance-00000001", [uid(1), uid(2)], uid(101)),
            libvirt_domains.domain_xml("instance-00000002", [uid(3), uid(4)], uid(102)),
            libvirt_domains.domain_xml(
                "instance-00000003", (), uid(103), vfs=["0000:c1:00.4", "0000:c1:00.5"]
            ),
        ],
    )
    return host, uri


def cli(tmp_path, host, uri, *argv):
    conf_file = tmp_path / "nova.conf"
    conf_file.write_text(CONF)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = manage.main(
            [
                "--config-file",
                str(conf_file),
                "--nodename",
                "cn1",
                "--sysfs-root",
                host.paths.root,
                "--state-dir",
                str(tmp_path / "state"),
                "--libvirt-uri",
                uri,
                *argv,
            ]
        )
    assert code == 0, err.getvalue()
    return out.getvalue()


def sample(name, value, **labels):
    return {"labels": promtool.selector(name, labels), "value": value}


def test_recorded_free_vgpus_are_what_status_says_is_free(host_and_uri, tmp_path):
    host, uri = host_and_uri
    rows = json.loads(cli(tmp_path, host, uri, "status", "-f", "json"))
    scraped = cli(tmp_path, host, uri, "metrics")
    counts = {(r["gpu"], t["type"]): t for r in rows for t in r["vgpus"]}
    # The draining T4 counts its guests' vGPUs under their own type.
    assert counts[(T4_DRAINING, "nvidia-222")] == {
        "type": "nvidia-222",
        "capacity": 0,
        "used": 2,
        "reserved": 0,
        "free": 0,
    }
    assert counts[(T4_DRAINING, "nvidia-231")]["used"] == 0
    assert {t for g, t in counts if g == L40S} == set(MIXED)
    assert (
        counts[(T4_BUSY, "nvidia-231")]["free"] == counts[(T4_BUSY, "nvidia-231")]["capacity"] - 2
    )  # the two a guest uses (the third is nobody's)
    per_type = {}
    for (_gpu, type_id), count in counts.items():
        per_type[type_id] = per_type.get(type_id, 0) + count["free"]
    at = f"{MINUTES - 1}m"
    tests = [
        {
            "interval": "1m",
            "input_series": promtool.input_series(scraped, "cn1:9839", MINUTES),
            "promql_expr_test": [
                {
                    "expr": "gpu_type:vgpu_vgpus_free",
                    "eval_time": at,
                    "exp_samples": [
                        sample(
                            "gpu_type:vgpu_vgpus_free",
                            c["free"],
                            gpu=gpu,
                            type=t,
                            instance="cn1:9839",
                            job="vgpu",
                        )
                        for (gpu, t), c in sorted(counts.items())
                    ],
                },
                {
                    "expr": "instance_type:vgpu_vgpus_free:sum",
                    "eval_time": at,
                    "exp_samples": [
                        sample(
                            "instance_type:vgpu_vgpus_free:sum", free, type=t, instance="cn1:9839"
                        )
                        for t, free in sorted(per_type.items())
                    ],
                },
                {
                    "expr": "type:vgpu_vgpus_free:sum",
                    "eval_time": at,
                    "exp_samples": [
                        sample("type:vgpu_vgpus_free:sum", free, type=t)
                        for t, free in sorted(per_type.items())
                    ],
                },
                # Capacity adds up to vGPUs: every GPU's, in vGPUs.
                {
                    "expr": "sum(vgpu_gpu_vgpus_capacity)",
                    "eval_time": at,
                    "exp_samples": [
                        {"labels": "{}", "value": sum(c["capacity"] for c in counts.values())}
                    ],
                },
                {
                    "expr": "min(gpu_type:vgpu_vgpus_free) >= 0",
                    "eval_time": at,
                    "exp_samples": [{"labels": "{}", "value": 0}],
                },
            ],
        }
    ]
    promtool.run_tests(tmp_path, tests)


def test_the_dcgm_join_names_each_running_guests_vgpu(host_and_uri, tmp_path):
    host, uri = host_and_uri
    scraped = cli(tmp_path, host, uri, "metrics")
    rows = json.loads(cli(tmp_path, host, uri, "status", "-f", "json"))
    util = {"0000:18:00.0": 35, "0000:19:00.0": 80, L40S: 55}
    models = {"0000:18:00.0": "Tesla T4", "0000:19:00.0": "Tesla T4", L40S: "NVIDIA L40S"}
    index = {"0000:18:00.0": 0, "0000:19:00.0": 1, L40S: 3}
    info = {lbl["vgpu"]: lbl for n, lbl, _v in promtool.samples(scraped) if n == "vgpu_vgpu_info"}
    expected = []
    for row in rows:
        for guest in row["guests"]:
            gpu, labels, i = row["gpu"], info[guest["vgpu"]], index[row["gpu"]]
            assert (labels["gpu"], labels["instance_uuid"]) == (gpu, guest["instance"])
            expected.append(
                sample(
                    "",
                    util[gpu],
                    **{
                        **labels,
                        "Hostname": "cn1",
                        "instance": "cn1:9839",
                        "job": "vgpu",
                        "modelName": models[gpu],
                        "UUID": f"GPU-{i:08x}-0000-4000-8000-00000000000{i}",
                    },
                )
            )
    # Six guests' vGPUs; uid(5) on 19:00.0, which no guest holds, is no row.
    assert len(expected) == 6 and uid(5) in info
    series = promtool.input_series(scraped, "cn1:9839", MINUTES) + promtool.input_series(
        DCGM, "cn1:9400", MINUTES, job="dcgm"
    )
    tests = [
        {
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": [
                {"expr": JOIN, "eval_time": f"{MINUTES - 1}m", "exp_samples": expected}
            ],
        }
    ]
    promtool.run_tests(tmp_path, tests)
