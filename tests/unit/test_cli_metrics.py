"""``vgpu-manage metrics``: real CLI, fake kernel, real journal, libvirt's
test driver, and prometheus_client's own parser reading what it printed."""

import contextlib
import io
import json
import os
import socket
import time

import prometheus_client
import pytest
from prometheus_client import parser

from tests.unit import test_cli_status
from tests.unit import test_host_reconciler
from vgpu_driver import audit
from vgpu_driver import claims
from vgpu_driver import inventory
from vgpu_driver import metrics
from vgpu_driver import reconciler_state
from vgpu_driver.cmd import manage
from vgpu_driver.cmd import metrics_commands

cli = test_cli_status.cli
busy_t4 = test_cli_status.busy_t4
T4_MODEL = "10de:1eb8"


def samples(text):
    """``{(name, frozenset(labels)): value}`` of every sample, parsed by
    prometheus_client (a malformed exposition raises)."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in parser.text_string_to_metric_families(text)
        for s in family.samples
    }


def per_gpu(found, name):
    return {dict(labels)["gpu"]: value for (n, labels), value in found.items() if n == name}


def value(found, name, **labels):
    return found[(name, frozenset(labels.items()))]


def test_every_gpu_series_agrees_with_status(busy_t4, cli):
    host, ids, inst, uri = busy_t4
    code, out, err = cli("--sysfs-root", host.paths.root, "status", "-f", "json", uri=uri)
    assert code == 0, err
    rows = {r["gpu"]: r for r in json.loads(out)}
    code, out, err = cli("--sysfs-root", host.paths.root, "metrics", uri=uri)
    assert (code, err) == (0, "")
    found = samples(out)

    # One type per series, counted in vGPUs, as status counts each type.
    for name in ("capacity", "used", "reserved"):
        assert {
            (dict(k)["gpu"], dict(k)["type"]): v
            for (n, k), v in found.items()
            if n == f"vgpu_gpu_vgpus_{name}"
        } == {(g, t["type"]): t[name] for g, r in rows.items() for t in r["vgpus"]}, name
    assert per_gpu(found, "vgpu_gpu_served") == {
        g: int(bool(r["provider"])) for g, r in rows.items()
    }
    assert per_gpu(found, "vgpu_gpu_guests") == {
        g: len({x["instance"] for x in r["guests"]}) for g, r in rows.items()
    }
    # What describes a GPU is on its info series alone, as status says it.
    for (name, labels), _ in found.items():
        if name == "vgpu_gpu_info":
            labels = dict(labels)
            row = rows[labels["gpu"]]
            assert labels["provider"] == (row["provider"] or "")
            assert labels["model"] == T4_MODEL
            assert labels["resource_class"] == ("VGPU" if row["provider"] else "")
            assert labels["pci_bus_id"] == "0000" + labels["gpu"].upper()
        elif name.startswith("vgpu_gpu_"):
            assert set(dict(labels)) <= {"gpu", "type", "reason"}, name
    assert value(found, "vgpu_gpu_vgpus_used", gpu="0000:18:00.0", type="nvidia-231") == 3
    assert per_gpu(found, "vgpu_gpu_guests")["0000:18:00.0"] == 2
    # Every reserved unit has one reason, each reason a series.
    by_reason = {}
    for (name, labels), units in found.items():
        if name == "vgpu_gpu_vgpus_reserved_by_reason":
            labels = dict(labels)
            by_reason.setdefault(labels["gpu"], {})[labels["reason"]] = units
    assert {g: sum(r.values()) for g, r in by_reason.items()} == {
        g: r["reserved"] for g, r in rows.items()
    }
    assert all(set(r) == set(inventory.RESERVED_FOR) for r in by_reason.values())
    assert rows["0000:19:00.0"]["reserved"] > 0
    assert by_reason["0000:19:00.0"]["blocked"] == rows["0000:19:00.0"]["reserved"]


def test_host_series_count_claims_orphans_and_boards(busy_t4, cli):
    host, ids, inst, uri = busy_t4
    code, out, err = cli("--sysfs-root", host.paths.root, "metrics", uri=uri)
    found = samples(out)
    assert value(found, "vgpu_scrape_success") == 1
    assert {s: value(found, "vgpu_claims", state=s) for s in claims.STATES} == {
        "claimed": 1,
        "attached": 1,
        "migrating_in": 1,
        "releasing": 0,
    }
    # The unused nvidia-222 on 19:00.0: no claim, no domain.  The mdev the
    # legacy domain uses is no orphan, claimed or not.
    assert value(found, "vgpu_orphan_vgpus") == 1
    assert value(found, "vgpu_guests_known") == 1
    assert {
        s: value(found, "vgpu_sriov_boards", state=s) for s in ("enabled", "partial", "off")
    } == {"enabled": 0, "partial": 0, "off": 0}
    assert value(found, "vgpu_claims_past_grace", state="claimed") == 0
    # The claim waits for its guest: when it last changed, which an age
    # computed by Prometheus keeps growing from.
    assert (
        0
        <= time.time()
        - value(found, "vgpu_claims_waiting_oldest_timestamp_seconds", state="claimed")
        < 60
    )
    assert 0 <= value(found, "vgpu_scrape_duration_seconds") < 60
    assert (
        value(
            found,
            "vgpu_driver_info",
            nodename="cn1",
            version="0.1.0",
            types="nvidia-231,nvidia-222",
        )
        == 1
    )
    # The journal's claims were made now: with no grace, the claim and the
    # incoming migration's are past it.
    conf = test_cli_status.T4_CONF + "[vgpu]\nclaim_grace = 0\nmigration_claim_timeout = 0.01\n"
    time.sleep(0.02)
    code, out, err = cli("--sysfs-root", host.paths.root, "metrics", uri=uri, conf=conf)
    found = samples(out)
    assert {
        s: value(found, "vgpu_claims_past_grace", state=s)
        for s in ("claimed", "migrating_in", "releasing")
    } == {"claimed": 1, "migrating_in": 1, "releasing": 0}


def test_sriov_boards_follow_their_vfs(make_host, cli):
    host = make_host("a100-sriov")
    conf = test_cli_status.A100_CONF
    found = samples(cli("--sysfs-root", host.paths.root, "metrics", conf=conf)[1])
    assert value(found, "vgpu_sriov_boards", state="enabled") == 1
    (vfs,) = per_gpu(found, "vgpu_gpu_sriov_vfs").values()
    assert vfs == 16 and list(per_gpu(found, "vgpu_gpu_sriov_vfs_max").values()) == [16]
    host.set_vfs("0000:41:00.0", 0)
    found = samples(cli("--sysfs-root", host.paths.root, "metrics", conf=conf)[1])
    assert value(found, "vgpu_sriov_boards", state="off") == 1
    assert per_gpu(found, "vgpu_gpu_sriov_vfs") == {"0000:41:00.0": 0}
    assert per_gpu(found, "vgpu_gpu_served") == {"0000:41:00.0": 0}
    # Served or not, the board has the type nova.conf gives it.
    assert value(found, "vgpu_gpu_configured_type_info", gpu="0000:41:00.0", type="nvidia-468") == 1
    assert (
        value(
            found,
            "vgpu_gpu_info",
            gpu="0000:41:00.0",
            provider="",
            resource_class="",
            model="10de:20f1",
            pci_bus_id="00000000:41:00.0",
            unit="vGPUs",
        )
        == 1
    )
    assert not per_gpu(found, "vgpu_gpu_vgpus_reserved_by_reason")


def test_without_libvirt_guests_are_unknown_and_it_says_why(busy_t4, cli):
    host, ids, inst, uri = busy_t4
    code, out, err = cli(
        "--sysfs-root", host.paths.root, "metrics", uri=test_cli_status.UNREACHABLE
    )
    assert code == 0
    assert err.startswith("warning: ") and "vgpu_guests_known 0" in err
    assert err.count("\n") == 1
    found = samples(out)
    assert value(found, "vgpu_guests_known") == 0
    assert not per_gpu(found, "vgpu_gpu_guests")
    assert not [k for k in found if k[0] == "vgpu_orphan_vgpus"]
    # used counts claims only, as status does.
    assert value(found, "vgpu_gpu_vgpus_used", gpu="0000:18:00.0", type="nvidia-231") == 2


def test_output_replaces_the_file_whole(busy_t4, cli, tmp_path):
    host, ids, inst, uri = busy_t4
    target = tmp_path / "textfile" / "vgpu.prom"
    target.parent.mkdir()
    target.write_text("old contents\n")
    umask = os.umask(0o077)  # node_exporter reads it as another user all the same
    try:
        code, out, err = cli(
            "--sysfs-root", host.paths.root, "metrics", "--output", str(target), uri=uri
        )
    finally:
        os.umask(umask)
    assert (code, out, err) == (0, "", "")
    assert value(samples(target.read_text()), "vgpu_orphan_vgpus") == 1
    assert os.listdir(target.parent) == ["vgpu.prom"]  # no temporary file left
    assert oct(target.stat().st_mode & 0o777) == "0o644"


def test_a_missing_output_directory_is_one_error_line(busy_t4, cli, tmp_path):
    host, ids, inst, uri = busy_t4
    target = tmp_path / "missing" / "vgpu.prom"
    code, out, err = cli(
        "--sysfs-root", host.paths.root, "metrics", "--output", str(target), uri=uri
    )
    assert code == 2 and out == ""
    assert err.startswith("error: ") and err.count("\n") == 1 and "missing" in err
    assert not (tmp_path / "missing").exists()


def test_reconciler_series_come_from_nova_computes_reconciler(
    make_host, make_driver, tmp_path, fake_kernel_cli
):
    """A removal the kernel blocks and a step that fails, in the worker a
    driver runs, are read by another process's scrape."""
    host = make_host("a100-sriov")
    vgpu = make_driver(host, "remove_mdevs_on_release = true\nmdev_remove_timeout = 0.1")
    vgpu.init_host()

    def broken(reasons):
        raise RuntimeError("the definitions could not be listed")

    vgpu.worker.add_step("definitions", broken)
    held = test_host_reconciler.block_a_removal(vgpu, host)
    vgpu.provider_tree("cn1")  # nova-compute's periodic update, its pass first
    conf_file = tmp_path / "cli.conf"
    conf_file.write_text(f"{test_cli_status.A100_CONF}[vgpu]\nsysfs_root = {host.paths.root}\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert (
            manage.main(
                [
                    "--config-file",
                    str(conf_file),
                    "--nodename",
                    "cn1",
                    "--state-dir",
                    str(tmp_path / "state"),
                    "--libvirt-uri",
                    "test:///default",
                    "metrics",
                ]
            )
            == 0
        )
    found = samples(out.getvalue())
    state = reconciler_state.read(str(tmp_path / "state"))
    assert value(found, "vgpu_reconciler_up") == 1
    assert value(found, "vgpu_removals_stuck") == 1
    assert value(found, "vgpu_removals_stuck_oldest_timestamp_seconds") <= time.time()
    assert value(found, "vgpu_claims", state="releasing") == 1
    assert value(found, "vgpu_reconciler_passes_total") == state["passes"] >= 2
    assert value(found, "vgpu_reconciler_errors_total") == state["errors"] >= 1
    assert (
        value(found, "vgpu_reconciler_last_error_timestamp_seconds", step="definitions")
        == state["last_error"]["at"]
    )
    assert (
        value(found, "vgpu_reconciler_last_pass_duration_seconds") == state["last_pass"]["duration"]
    )
    update = state["last_update"]
    assert value(found, "vgpu_inventory_update_duration_seconds") == update["duration"] > 0
    assert value(found, "vgpu_inventory_update_timestamp_seconds") == update["started_at"]
    assert update["started_at"] <= state["last_pass"]["started_at"]
    host.release(held)
    vgpu.close()


def test_listen_addresses():
    assert metrics_commands.parse_listen("127.0.0.1:9839") == ("127.0.0.1", 9839)
    assert metrics_commands.parse_listen("[::1]:0") == ("::1", 0)
    assert metrics_commands.parse_listen("0.0.0.0:80") == ("0.0.0.0", 80)


def test_a_bad_listen_address_is_one_error_line(busy_t4, cli):
    host, ids, inst, uri = busy_t4
    for bad in ("9839", "localhost", ":9839", "127.0.0.1:http", "127.0.0.1:70000"):
        code, out, err = cli(
            "--sysfs-root", host.paths.root, "metrics", "serve", "--listen", bad, uri=uri
        )
        assert code == 2 and out == "", bad
        assert err.startswith("error: ") and err.count("\n") == 1 and "--listen" in err, err


def test_a_taken_port_is_one_error_line_naming_it(busy_t4, cli):
    host, ids, inst, uri = busy_t4
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listen = f"127.0.0.1:{taken.getsockname()[1]}"
        code, out, err = cli(
            "--sysfs-root", host.paths.root, "metrics", "serve", "--listen", listen, uri=uri
        )
    assert (code, out) == (2, "")
    assert err == f"error: Cannot serve the metrics on {listen}: Address already in use.\n"


def test_unreadable_state_files_are_warned_of_not_hidden(busy_t4, cli, tmp_path):
    """A corrupt audit record or reconciler state: the scrape still works,
    says what it left out, and the files are left as they were."""
    host, ids, inst, uri = busy_t4
    state = tmp_path / "state"
    (state / audit.RECORD_FILE).write_text("{half a record")
    (state / reconciler_state.STATE_FILE).write_text("")
    code, out, err = cli("--sysfs-root", host.paths.root, "metrics", uri=uri)
    assert code == 0
    warnings = err.splitlines()
    assert len(warnings) == 2 and all(w.startswith("warning: ") for w in warnings)
    assert "host reconciler's state is unreadable" in warnings[0]
    assert "last audit's record is unreadable" in warnings[1]
    found = samples(out)
    assert value(found, "vgpu_reconciler_up") == 0
    assert not [k for k in found if k[0] == "vgpu_placement_drift"]
    assert (state / audit.RECORD_FILE).read_text() == "{half a record"
    assert (state / reconciler_state.STATE_FILE).read_text() == ""


def test_a_read_that_fails_unforeseen_is_a_scrape_saying_so():
    """What ``metrics serve`` registers: any error reading the host is a
    scrape with ``vgpu_scrape_success 0`` and its duration, handed to the
    server's log (told whether it was foreseen), never an HTTP 500."""
    seen = []

    def read():
        raise RuntimeError("a bug")

    scrape = metrics.registry_of(
        read, (OSError,), lambda exc, expected: seen.append((str(exc), expected))
    )
    found = samples(prometheus_client.generate_latest(scrape).decode())
    assert {name for name, _labels in found} == {
        "vgpu_scrape_success",
        "vgpu_scrape_duration_seconds",
    }
    assert value(found, "vgpu_scrape_success") == 0
    assert 0 <= value(found, "vgpu_scrape_duration_seconds") < 60
    assert seen == [("a bug", False)]
    # ``metrics`` itself (no server): the error is the command's.
    with pytest.raises(RuntimeError):
        prometheus_client.generate_latest(metrics.registry_of(read, (OSError,)))


def test_an_output_the_textfile_collector_would_skip_is_one_error_line(busy_t4, cli, tmp_path):
    host, ids, inst, uri = busy_t4
    for name in ("vgpu.txt", ".prom", "vgpu.prom.new"):
        code, out, err = cli(
            "--sysfs-root", host.paths.root, "metrics", "--output", str(tmp_path / name), uri=uri
        )
        assert (code, out) == (2, ""), name
        assert err.startswith("error: --output ") and err.count("\n") == 1, err
        assert "*.prom" in err and not (tmp_path / name).exists()
