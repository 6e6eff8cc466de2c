"""The README's first command: the demo, run as a real process.

What it prints is checked against what it leaves behind, each read by an
independent way: Placement's database (served again here), the fake /sys
tree, the claims journal and the domains' XML as libvirt held them.
"""

import collections
import contextlib
import glob
import io
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import urllib.request

import libvirt
import pytest
from prometheus_client import parser as prometheus_parser

from tests import libvirt_domains
from vgpu_driver import claims
from vgpu_driver import claims_journal
from vgpu_driver import discovery
from vgpu_driver import guest
from vgpu_driver import inventory
from vgpu_driver import placement
from vgpu_driver import placement_service
from vgpu_driver import status
from vgpu_driver import sysfs
from vgpu_driver.cmd import demo_commands
from vgpu_driver.cmd import manage
from vgpu_driver.cmd.demo import compute
from vgpu_driver.cmd.demo import scenario
from vgpu_driver.fake import fakekernel

NODE = "demo-host"
FLAVORS = [scenario.FLAVORS[flavor] for _name, flavor in scenario.BOOTS]
A100 = "0000:41:00.0"
ORPHAN = "7f5a0e0c-3a59-4b7e-9f65-2bb1d1f1e0aa"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """One run of ``vgpu-manage --config-file /dev/null demo --dir DIR``."""
    kept = tmp_path_factory.mktemp("demo") / "kept"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "vgpu_driver.cmd.manage",
            "--config-file",
            "/dev/null",
            "demo",
            "--dir",
            str(kept),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done, kept


def table_after(out, heading):
    """The rows of the first table after the line starting with ``heading``
    (a cell continued on the next line is not a row of its own)."""
    lines = out.split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("+"))
    rows = []
    for line in lines[start + 3 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if cells[0]:
            rows.append(cells)
    return rows


@pytest.fixture(scope="module")
def placement_after(demo):
    """``(allocations, inventories, usages)`` from the demo's Placement database:
    ``{(consumer, provider name): VGPU}``, ``{name: (total, reserved)}``,
    ``{name: VGPU used}`` over the GPU providers."""
    _done, kept = demo
    with placement_service.EmbeddedPlacement(f"sqlite:///{kept}/placement.sqlite") as svc:
        client = placement.Client(svc.connection())
        root = client.request("GET", f"/resource_providers?name={NODE}")["resource_providers"][0]
        listed = client.request("GET", f"/resource_providers?in_tree={root['uuid']}")[
            "resource_providers"
        ]
        allocations, inventories, usages = {}, {}, {}
        for rp in listed:
            if rp["uuid"] == root["uuid"]:
                continue
            base = f"/resource_providers/{rp['uuid']}"
            vgpu = client.request("GET", f"{base}/inventories")["inventories"]["VGPU"]
            inventories[rp["name"]] = (vgpu["total"], vgpu["reserved"])
            usages[rp["name"]] = client.request("GET", f"{base}/usages")["usages"].get("VGPU", 0)
            for consumer, data in client.request("GET", f"{base}/allocations")[
                "allocations"
            ].items():
                allocations[(consumer, rp["name"])] = data["resources"]["VGPU"]
    return allocations, inventories, usages


@pytest.fixture(scope="module")
def host_after(demo):
    """``{mdev uuid: (parent, gpu, type)}`` read from the fake /sys tree."""
    _done, kept = demo
    snapshot = discovery.discover(sysfs.open_host(str(kept / "sys")))
    return {
        m.uuid: (m.parent, snapshot.gpu_of_parent(m.parent).address, m.type_id)
        for m in snapshot.mdevs
    }


@pytest.fixture(scope="module")
def domains_after(demo):
    """``{domain name: (domain uuid, [mdev uuids], [hostdev models])}`` from the
    XML libvirt held for each domain."""
    _done, kept = demo
    found = {}
    for path in sorted(glob.glob(str(kept / "domains" / "*.xml"))):
        with open(path) as f:
            root = guest.parse(f.read())
        models = [h.get("model") for h in root.findall("./devices/hostdev[@type='mdev']")]
        found[root.findtext("name")] = (root.findtext("uuid"), guest.mdev_uuids(root), models)
    return found


def test_allocations_mdevs_and_hostdevs_are_the_same(placement_after, host_after, domains_after):
    allocations, _inventories, _usages = placement_after
    # Every mdev on the host is some domain's hostdev, and the other way round:
    # the orphan of the old type is gone, nothing is left unused.
    hostdevs = [m for _uuid, mdevs, _models in domains_after.values() for m in mdevs]
    assert sorted(hostdevs) == sorted(host_after) and len(set(hostdevs)) == len(hostdevs)
    assert ORPHAN not in host_after
    # Per instance and GPU provider: Placement's VGPU units = the mdevs its domain
    # uses on that GPU.
    held = collections.Counter(
        (dom_uuid, inventory.provider_name_for(NODE, host_after[m][1]))
        for dom_uuid, mdevs, _models in domains_after.values()
        for m in mdevs
    )
    assert dict(held) == allocations
    assert set(domains_after) == {name for name, _flavor in scenario.BOOTS}
    for name, flavor in scenario.BOOTS:
        dom_uuid, mdevs, models = domains_after[name]
        assert dom_uuid == compute.instance_uuid(name)
        assert len(mdevs) == scenario.FLAVORS[flavor].vgpus
        assert models == ["vfio-pci"] * len(mdevs)
    # A multi-vGPU guest, guests on the A100 (one VF each) and on a T4.
    gpus = {host_after[m][1] for m in host_after}
    assert A100 in gpus and gpus - {A100}
    assert max(len(mdevs) for _u, mdevs, _m in domains_after.values()) >= 2
    a100_parents = [p for p, gpu, _t in host_after.values() if gpu == A100]
    assert len(a100_parents) == sum(f.vgpus for f in FLAVORS if f.trait == scenario.A100_4C)
    assert len(set(a100_parents)) == len(a100_parents)


def test_the_claims_journal_agrees(demo, domains_after):
    _done, kept = demo
    by_mdev = {m: dom_uuid for dom_uuid, mdevs, _ in domains_after.values() for m in mdevs}
    journal = claims_journal.Journal(str(kept / "state"))
    assert {c.mdev_uuid: (c.instance_uuid, c.state) for c in journal.claims()} == {
        m: (dom_uuid, claims.ATTACHED) for m, dom_uuid in by_mdev.items()
    }


def test_the_printed_tables_are_what_placement_and_the_host_hold(
    demo, placement_after, host_after, domains_after
):
    done, _kept = demo
    out = done.stdout
    allocations, inventories, usages = placement_after
    reported = {r[0]: r[1:] for r in table_after(out, "==> reporting the inventory")}
    assert {name: (int(r[1]), int(r[2])) for name, r in reported.items()} == inventories
    # nova.conf: the A100 serves A100-4C (10, not 16 VFs); T4-2Q is capped at 36
    # host-wide, T4s filled in address order.
    assert inventories[f"{NODE}_pci_0000_41_00_0"] == (10, 0)
    assert reported[f"{NODE}_pci_0000_41_00_0"][0] == "nvidia-468"
    assert inventories[f"{NODE}_pci_0000_e7_00_0"] == (4, 0)
    for capped in ("e8", "f4", "f5"):
        name = f"{NODE}_pci_0000_{capped}_00_0"
        assert inventories[name] == (8, 8)
        assert reported[name][3].startswith("max_instances=36 for nvidia-231")
    usage = {
        r[0]: (r[1], int(r[2]), int(r[3]), int(r[4]))
        for r in table_after(out, "==> reading usage back from Placement")
    }
    assert {n: u[1] for n, u in usage.items()} == usages
    assert {n: u[2:] for n, u in usage.items()} == inventories
    for name, used in usages.items():
        assert used == sum(n for (_c, rp), n in allocations.items() if rp == name)
        assert used == sum(
            1
            for _p, gpu, _t in host_after.values()
            if inventory.provider_name_for(NODE, gpu) == name
        )
    assert sum(usages.values()) == sum(f.vgpus for f in FLAVORS)
    instances = table_after(out, "==> reading each instance's mdevs")
    assert sorted(tuple(r) for r in instances) == sorted(
        (
            name,
            m,
            host_after[m][1],
            host_after[m][2],
            inventory.provider_name_for(NODE, host_after[m][1]),
        )
        for name, (_u, mdevs, _models) in domains_after.items()
        for m in mdevs
    )
    listed = table_after(out, "mdev list -c uuid")
    assert sorted(tuple(r) for r in listed) == sorted(
        (m, host_after[m][0], dom_uuid, "attached")
        for dom_uuid, mdevs, _models in domains_after.values()
        for m in mdevs
    )


def test_the_status_table_ends_the_story_and_agrees_with_placement(
    demo, placement_after, domains_after
):
    done, _kept = demo
    _allocations, inventories, usages = placement_after
    heading = f"--nodename {NODE} status"
    section = done.stdout.split(heading, 1)[1]
    rows = {r[0]: r for r in table_after(done.stdout, heading)}
    assert len(rows) == len(inventories) == 9
    for gpu, (_gpu, _name, shown, reserved, *_rest) in rows.items():
        total, held = inventories[inventory.provider_name_for(NODE, gpu)]
        used = usages[inventory.provider_name_for(NODE, gpu)]
        assert (shown, int(reserved)) == (status.bar(used, total), held), gpu
    assert rows[A100][5] == "enabled 16/16"
    for name, (dom_uuid, mdevs, _models) in domains_after.items():
        shown = f"{dom_uuid} ({name})" + (f" x{len(mdevs)}" if len(mdevs) > 1 else "")
        assert shown in section
    used = sum(usages.values())
    total = sum(t for t, _r in inventories.values())
    assert (
        f"{NODE}: 9 GPU(s), 9 with a provider; vGPUs {status.bar(used, total)} used, "
        f"{sum(r for _t, r in inventories.values())} reserved; {len(domains_after)} "
        "guest(s); 0 claim(s) in flight; SR-IOV on 1 of 1 board(s)\n" in section
    )


def test_the_story_is_told_in_order(demo):
    done, kept = demo
    out = done.stdout
    steps = [
        line.split(" ... ")[0]
        for line in out.splitlines()
        if line.startswith("==> ") and " ... " in line
    ]
    assert steps == [
        f"==> writing a fake host (1 A100 with 16 VFs, 8 T4) to {kept}/sys",
        "==> starting Placement (openstack-placement in this process, sqlite)",
        "==> starting the driver (init_host): unused mdevs of types their GPU no longer "
        "serves are removed",
        f"==> creating the compute node's provider {NODE}, as nova does",
        "==> reporting the inventory: one provider per physical GPU",
        *[f"==> booting {n} (flavor {f})" for n, f in scenario.BOOTS],
        "==> reading usage back from Placement",
        "==> reading each instance's mdevs from libvirt and their GPU from /sys",
        "==> stopping Placement",
    ]
    assert all(
        line.endswith(" s)")
        for line in out.splitlines()
        if line.startswith("==> ") and " ... " in line
    )
    assert f"{ORPHAN} (nvidia-222 on 0000:35:00.0): removed" in out
    assert "9 provider(s) created under demo-host" in out
    assert "no drift: Placement's allocations and inventory match" in out
    assert out.rstrip().endswith(
        f"==> kept {kept}: sys/ (the fake host), state/ (claims), "
        "placement.sqlite, nova.conf, domains/*.xml"
    )
    assert "Traceback" not in done.stderr and "error" not in done.stderr
    # The fake host was kept where asked, and plays /sys for anyone.
    assert (kept / "sys" / "class" / "mdev_bus" / "0000:41:00.4").is_symlink()


def run_in_process(monkeypatch, tmp_path, *argv):
    """The demo in this process, its temporary directory under ``tmp_path``."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = manage.main(["--config-file", "/dev/null", "demo", *argv])
    return code, out.getvalue(), err.getvalue()


def demo_domains():
    names = {name for name, _flavor in scenario.BOOTS}
    return [
        d.name() for d in libvirt.open("test:///default").listAllDomains(0) if d.name() in names
    ]


def test_without_dir_the_working_directory_is_removed(monkeypatch, tmp_path):
    code, out, err = run_in_process(monkeypatch, tmp_path)
    assert code == 0, out + err
    assert os.listdir(tmp_path) == []
    assert "==> removed " in out.splitlines()[-1]
    assert demo_domains() == []


def test_a_failed_step_is_one_error_line_and_everything_is_cleaned_up(monkeypatch, tmp_path):
    # One more guest than the A100 has room for: no allocation candidate.
    greedy = compute.Flavor("greedy.11x-a100-4c", 8, 8192, 40, 11, scenario.A100_4C)
    monkeypatch.setitem(scenario.FLAVORS, greedy.name, greedy)
    monkeypatch.setattr(scenario, "BOOTS", (*scenario.BOOTS, ("greedy-1", greedy.name)))
    code, out, err = run_in_process(monkeypatch, tmp_path)
    assert code == 2
    assert err.splitlines() == [
        "error: demo step 'booting greedy-1 (flavor greedy.11x-a100-4c)' failed: Placement "
        "has no allocation candidate for greedy-1 (GET /allocation_candidates?resources="
        "DISK_GB:40,MEMORY_MB:8192,VCPU:8,VGPU:11&required=CUSTOM_VGPU_NVIDIA_A100_4C)"
    ]
    assert "==> booting greedy-1 (flavor greedy.11x-a100-4c) ... failed" in out
    endpoint = out.split("serving on ", 1)[1].split(",")[0]
    with pytest.raises(OSError):
        urllib.request.urlopen(endpoint, timeout=2)
    assert os.listdir(tmp_path) == [] and demo_domains() == []


def test_a_missing_extra_is_named(monkeypatch, tmp_path):
    def no_placement(self):
        raise ImportError("No module named 'placement'", name="placement")

    monkeypatch.setattr(placement_service.EmbeddedPlacement, "start", no_placement)
    code, _out, err = run_in_process(monkeypatch, tmp_path)
    assert code == 2
    assert err.splitlines() == [
        "error: demo step 'starting Placement (openstack-placement in this process, "
        "sqlite)' failed: Python module 'placement' is missing "
        "(pip install 'vgpu-driver[embedded-placement]')"
    ]
    assert os.listdir(tmp_path) == []


def test_dir_must_be_new_or_empty(tmp_path):
    (tmp_path / "something").write_text("")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "vgpu_driver.cmd.manage",
            "--config-file",
            "/dev/null",
            "demo",
            "--dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"error: --dir {tmp_path} is not empty; give a new or empty directory"
    ]
    assert os.listdir(tmp_path) == ["something"]


def test_drift_found_by_the_audit_fails_the_demo(monkeypatch, tmp_path):
    show_instances = demo_commands.Demo._show_instances

    def and_a_ghost(self, booted):
        # Placement allocates a vGPU of the A100 to an instance this host never saw.
        a100 = self.node.tree.by_gpu(A100)
        rp = next(u for u, p in self.node.sync.provider_uuids(self.node.tree).items() if p is a100)
        self.node.client.request(
            "PUT",
            f"/allocations/{compute.instance_uuid('ghost')}",
            {
                "allocations": {rp: {"resources": {"VGPU": 1}}},
                "project_id": "p",
                "user_id": "u",
                "consumer_generation": None,
                "consumer_type": "INSTANCE",
            },
        )
        return show_instances(self, booted)

    monkeypatch.setattr(demo_commands.Demo, "_show_instances", and_a_ghost)
    code, out, err = run_in_process(monkeypatch, tmp_path)
    assert code == 2
    assert err.splitlines() == [
        "error: demo step 'vgpu-manage audit' failed: exit code 1: drift, listed above"
    ]
    drift = table_after(out, "--nodename demo-host audit")
    assert [(r[0], r[1], r[3]) for r in drift] == [
        ("allocation-without-mdev", f"{NODE}_pci_0000_41_00_0", compute.instance_uuid("ghost"))
    ]
    assert os.listdir(tmp_path) == [] and demo_domains() == []


def test_metrics_serve_is_scraped_for_the_demo_host(demo, placement_after, domains_after, tmp_path):
    """``metrics serve`` on 127.0.0.1, scraped over HTTP: each series agrees
    with ``status -f json``, Placement and the domains, and each scrape reads
    the host again."""
    _done, kept = demo
    domains = [path.read_text() for path in sorted((kept / "domains").glob("*.xml"))]
    uri = libvirt_domains.node_file(tmp_path / "node.xml", domains)
    cli = [
        sys.executable,
        "-m",
        "vgpu_driver.cmd.manage",
        "--config-file",
        str(kept / "nova.conf"),
        "--nodename",
        NODE,
        "--libvirt-uri",
        uri,
    ]
    with subprocess.Popen(
        [*cli, "metrics", "serve", "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as server:
        try:
            url = serving_url(server)
            status_rows = {
                r["gpu"]: r
                for r in json.loads(
                    subprocess.run(
                        [*cli, "status", "-f", "json"],
                        capture_output=True,
                        text=True,
                        check=True,
                        timeout=60,
                    ).stdout
                )
            }
            found = scraped(url)
            # Each scrape reads the host anew and leaves no file or socket open.
            open_files = len(os.listdir(f"/proc/{server.pid}/fd"))
            for _ in range(40):
                scraped(url)
            assert len(os.listdir(f"/proc/{server.pid}/fd")) <= open_files + 1
            orphan_made = scraped_with_an_orphan(url, kept)
            host_gone, host_back = scraped_while_the_host_is_gone(url, kept)
            server.send_signal(signal.SIGTERM)
            assert server.wait(timeout=30) == 0
            log = server.stderr.read()
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()

    _allocations, inventories, usages = placement_after
    assert found["vgpu_scrape_success"] == {(): 1}
    for gpu, row in status_rows.items():
        labels = (("gpu", gpu), ("type", row["type"]))
        total, reserved = inventories[row["provider"]]
        assert found["vgpu_gpu_vgpus_capacity"][labels] == row["total"] == total, gpu
        assert found["vgpu_gpu_vgpus_reserved"][labels] == row["reserved"] == reserved
        assert found["vgpu_gpu_vgpus_used"][labels] == row["used"] == usages[row["provider"]]
        assert found["vgpu_gpu_guests"][(("gpu", gpu),)] == len(
            {g["instance"] for g in row["guests"]}
        )
        info = (
            ("gpu", gpu),
            ("model", row_model(found, gpu)),
            ("pci_bus_id", "0000" + gpu.upper()),
            ("provider", row["provider"]),
            ("resource_class", "VGPU"),
            ("unit", "vGPUs"),
        )
        assert found["vgpu_gpu_info"][info] == 1
    assert set(found["vgpu_gpu_guests"]) == {(("gpu", g),) for g in status_rows}
    assert found["vgpu_claims"][(("state", "attached"),)] == sum(
        len(mdevs) for _u, mdevs, _m in domains_after.values()
    )
    assert found["vgpu_orphan_vgpus"] == {(): 0}
    assert found["vgpu_sriov_boards"][(("state", "enabled"),)] == 1
    assert found["vgpu_guests_known"] == {(): 1}
    # An mdev made behind the driver's back shows at the next scrape.
    assert orphan_made["vgpu_orphan_vgpus"] == {(): 1}
    assert orphan_made["vgpu_gpu_vgpus_used"] == found["vgpu_gpu_vgpus_used"]
    # A host it cannot read is a failed scrape, said and logged, not stale
    # numbers; the next scrape that can read it is whole again.
    assert set(host_gone) == {"vgpu_scrape_success", "vgpu_scrape_duration_seconds"}
    assert host_gone["vgpu_scrape_success"] == {(): 0}
    assert log.count("A scrape could not read the host: ") == 1, log
    assert host_back["vgpu_scrape_success"] == {(): 1}
    assert host_back["vgpu_gpu_vgpus_used"] == found["vgpu_gpu_vgpus_used"]


def serving_url(server):
    """The URL ``metrics serve`` says it answers on, once it listens."""
    ready, _, _ = select.select([server.stdout], [], [], 60)
    line = server.stdout.readline() if ready else ""
    if not line.startswith("serving metrics on http://127.0.0.1:"):
        server.kill()
        raise AssertionError(f"{line!r}; {server.communicate()[1]}")
    return line.split()[-1]


def scraped_with_an_orphan(url, kept):
    host = fakekernel.FakeKernel(str(kept / "sys"))
    host.create_mdev("0000:35:00.0", "nvidia-231", ORPHAN)
    try:
        return scraped(url)
    finally:
        host.remove_mdev(ORPHAN)


def scraped_while_the_host_is_gone(url, kept):
    """A scrape while the sysfs tree is away, and one once it is back."""
    (kept / "sys").rename(kept / "sys.away")
    try:
        gone = scraped(url)
    finally:
        (kept / "sys.away").rename(kept / "sys")
    return dict(gone), scraped(url)


def scraped(url):
    """``{name: {sorted label pairs: value}}`` of one scrape, parsed by
    prometheus_client's own parser."""
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200
        text = response.read().decode()
    found = collections.defaultdict(dict)
    for family in prometheus_parser.text_string_to_metric_families(text):
        for sample in family.samples:
            found[sample.name][tuple(sorted(sample.labels.items()))] = sample.value
    return found


def row_model(found, gpu):
    (labels,) = [dict(k) for k in found["vgpu_gpu_info"] if dict(k)["gpu"] == gpu]
    assert labels["model"].startswith("10de:")
    return labels["model"]
