"""The shipped alerting rules, evaluated by Prometheus' own ``promtool`` on
what ``vgpu-manage metrics`` scraped from real host states.

Two hosts are scraped through the real CLI: ``busy`` runs a driver (its host
reconciler up) with a vGPU removal the kernel blocks, a claim for an
incoming migration and T4s held back by ``max_instances`` (by design, no
alert); ``fresh`` has no nova-compute, an A100 whose VFs are off, a T4
blocked by an unused vGPU of another type, and a real Placement whose
allocation of a vGPU nobody holds an audit found.  Each scrape becomes promtool
input series over 90 minutes: ages grow by 60 s a minute while their
subject is there, everything else stays as scraped.  promtool then checks,
for every alert of the file, exactly which fire.
"""

import contextlib
import io
import re
import shutil
import subprocess
import uuid

import pytest
import yaml
from prometheus_client import parser

from tests.unit import test_host_reconciler
from vgpu_driver import claims
from vgpu_driver import claims_journal
from vgpu_driver import host_reconciler
from vgpu_driver import placement
from vgpu_driver import placement_service
from vgpu_driver.cmd import manage

RULES = "etc/prometheus/vgpu-driver-alerts.yml"
A100 = "0000:41:00.0"
T4 = "0000:18:00.0"
MINUTES = 90
EVAL_AT = "80m"
CONF = """[devices]
enabled_mdev_types = nvidia-468, nvidia-231
[mdev_nvidia-468]
device_addresses = 0000:41:00.0
[mdev_nvidia-231]
max_instances = 24
"""
# Series whose value is an age: it grows while what it measures is there.
AGES = {"vgpu_removals_stuck_oldest_seconds": ("vgpu_removals_stuck", None),
        "vgpu_claims_oldest_age_seconds": ("vgpu_claims", "state")}
# Times nova-compute's periodic update moves on (every minute) while it runs.
UPDATED_AT = ("vgpu_inventory_update_timestamp_seconds",)

def cli(tmp_path, host, state_dir, *argv, expect=0):
    conf_file = tmp_path / f"{state_dir.name}.conf"
    conf_file.write_text(CONF)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = manage.main(["--config-file", str(conf_file), "--nodename", "cn1",
                            "--sysfs-root", host.paths.root, "--state-dir", str(state_dir),
                            "--libvirt-uri", "test:///default", *argv])
    assert code == expect, err.getvalue()
    return out.getvalue()


def scrape(tmp_path, host, state_dir):
    return cli(tmp_path, host, state_dir, "metrics")


@pytest.fixture
def busy(make_host, make_driver, tmp_path, fake_kernel_cli):
    """A driver's host: a blocked removal, an incoming migration's claim."""
    host = make_host("a100-sriov", "t4x8")
    types = CONF.split("[mdev_", 1)
    vgpu = make_driver(host, "remove_mdevs_on_release = true\nmdev_remove_timeout = 0.1\n"
                             "[mdev_" + types[1], types="nvidia-468, nvidia-231")
    vgpu.init_host()
    vgpu.provider_tree("cn1")
    held = test_host_reconciler.block_a_removal(vgpu, host)
    incoming = str(uuid.uuid4())
    host.create_mdev("0000:18:00.0", "nvidia-231", incoming)
    with vgpu.journal.transaction() as txn:
        txn.add("moving", incoming, T4, T4, "nvidia-231", state=claims.MIGRATING_IN,
                created=True)
    assert vgpu.worker.run_now(host_reconciler.PERIODIC)
    yield scrape(tmp_path, host, tmp_path / "state")
    host.release(held)


@pytest.fixture
def fresh(make_host, tmp_path, fake_kernel_cli, monkeypatch):
    """No nova-compute; the A100's VFs off; a T4 blocked by another type;
    Placement allocating a vGPU nobody holds here, which an audit found."""
    host = make_host("a100-sriov-off", "t4x8", mdevs=[
        {"parent": T4, "type": "nvidia-222", "uuid": str(uuid.uuid4())}])
    state = tmp_path / "fresh"
    claims_journal.Journal(str(state))
    with placement_service.EmbeddedPlacement() as service:
        for key, value in service.cli_environment().items():
            monkeypatch.setenv(key, value)
        cli(tmp_path, host, state, "sync")
        client = placement.Client(service.connection())
        (rp,) = client.request("GET", "/resource_providers?name=cn1_pci_0000_19_00_0")[
            "resource_providers"]
        client.request("PUT", f"/allocations/{uuid.uuid4()}", {
            "allocations": {rp["uuid"]: {"resources": {"VGPU": 1}}}, "project_id": "p",
            "user_id": "u", "consumer_generation": None, "consumer_type": "INSTANCE"})
        cli(tmp_path, host, state, "audit", expect=1)
    return scrape(tmp_path, host, state)


@pytest.fixture
def stopped(make_host, make_driver, tmp_path):
    """What nova-compute wrote to [vgpu] metrics_textfile before it stopped."""
    host = make_host("a100-sriov")
    (tmp_path / "textfile").mkdir()
    textfile = tmp_path / "textfile" / "vgpu.prom"
    # Its own state directory: the last state_dir line is the one read.
    vgpu = make_driver(host, f"metrics_textfile = {textfile}\n"
                             f"state_dir = {tmp_path / 'stopped-state'}")
    vgpu.init_host()
    vgpu.provider_tree("cn1")
    vgpu.close()
    return textfile.read_text()


def input_series(text, instance, updating=True):
    """promtool's ``input_series`` of one scrape, as Prometheus would have
    labelled it (``instance``, ``job``); the inventory update's time moves on
    with promtool's clock if ``updating``, else it stays where it was."""
    found = [(s.name, s.labels, s.value) for family in
             parser.text_string_to_metric_families(text) for s in family.samples]
    present = {(name, labels.get("state")): value for name, labels, value in found}
    series = []
    for name, labels, value in found:
        step = 0
        if name in AGES:
            subject, key = AGES[name]
            step = 60 if present.get((subject, labels.get(key) if key else None)) else 0
        if name in UPDATED_AT:
            value, step = 0.0, (60 if updating else 0)
        labels = {**labels, "instance": instance, "job": "vgpu"}
        series.append({"series": name + _labels(labels),
                       "values": f"{value!r}+{step}x{MINUTES}"})
    return series, found


def _labels(labels):
    quoted = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
    return "{" + quoted + "}"


def _escape(value):
    return value.replace("\\", "\\\\").replace('"', '\\"')


def rules():
    with open(RULES) as source:
        return {r["alert"]: r for group in yaml.safe_load(source)["groups"]
                for r in group["rules"]}


def alert(rule, labels):
    """An expected alert: the series' labels, the rule's, the annotations
    expanded as Prometheus expands ``{{ $labels.x }}``."""
    labels = {**labels, **rule.get("labels", {})}

    def expand(text):
        return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""),
                      text)
    return {"exp_labels": labels,
            "exp_annotations": {k: expand(v) for k, v in rule["annotations"].items()}}


def gpu_labels(found, name, gpu, instance):
    (labels,) = [lbl for n, lbl, _v in found if n == name and lbl["gpu"] == gpu]
    # Prometheus drops a label whose value is empty.
    return {k: v for k, v in labels.items() if k != "reason" and v} | {
        "instance": instance, "job": "vgpu"}


def test_the_rules_are_valid():
    done = subprocess.run(["promtool", "check", "rules", RULES], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


def test_each_alert_fires_where_the_scraped_state_calls_for_it(busy, fresh, stopped,
                                                                 tmp_path):
    busy_series, busy_found = input_series(busy, "busy")
    fresh_series, fresh_found = input_series(fresh, "fresh")
    stopped_series, _ = input_series(stopped, "stopped", updating=False)
    assert any(n in UPDATED_AT for n, _l, _v in busy_found)
    host = {"job": "vgpu"}
    expected = {name: [] for name in rules()}
    expected["VgpuRemovalStuck"] = [{"instance": "busy", **host}]
    expected["VgpuMigrationClaimTooOld"] = [{"instance": "busy", "state": "migrating_in",
                                             **host}]
    expected["VgpuReconcilerDown"] = [{"instance": "fresh", **host}]
    expected["VgpuInventoryUpdateStale"] = [{"instance": "stopped", **host}]
    expected["VgpuPlacementDrift"] = [{"instance": "fresh", "kind": "allocation-without-mdev",
                                       **host}]
    expected["VgpuSriovOff"] = [gpu_labels(fresh_found, "vgpu_gpu_sriov_vfs", A100, "fresh")]
    expected["VgpuGpuUnusable"] = [
        gpu_labels(fresh_found, "vgpu_gpu_vgpus_capacity", T4, "fresh")]
    found = rules()
    series = busy_series + fresh_series + stopped_series
    tests = {"rule_files": [str(tmp_path / "rules.yml")], "evaluation_interval": "1m",
             "tests": [{"interval": "1m", "input_series": series,
                        "alert_rule_test": [
                            {"eval_time": EVAL_AT, "alertname": name,
                             "exp_alerts": [alert(found[name], labels) for labels in wanted]}
                            for name, wanted in expected.items()]}]}
    shutil.copy(RULES, tmp_path / "rules.yml")
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests))
    done = subprocess.run(["promtool", "test", "rules", str(tmp_path / "tests.yml")],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
