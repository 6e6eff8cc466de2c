"""The shipped alerting rules, evaluated by Prometheus' own ``promtool`` on
what ``vgpu-manage metrics`` scraped from real host states.

Two hosts are scraped through the real CLI: ``busy`` runs a driver (its host
reconciler up) with a vGPU removal the kernel blocks, a claim for an
incoming migration and T4s held back by ``max_instances`` (by design, no
alert); ``fresh`` has no nova-compute, an A100 whose VFs are off, a T4
blocked by an unused vGPU of another type, and a real Placement whose
allocation of a vGPU nobody holds an audit found.  Each scrape becomes promtool
input series over 90 minutes, as scraped, its times moved to promtool's
clock (the scrape at 0): the ages the recording rules compute from them grow
as they would on a host whose file is no longer rewritten.  The inventory
update's time moves on each minute on a host whose nova-compute runs.
promtool then checks, for every alert of the file, exactly which fire.
"""

import contextlib
import io
import re
import subprocess
import time
import uuid

import pytest
import yaml

from tests import alert_cases
from tests import libvirt_domains
from tests import promtool
from tests.functional import test_metrics_rules
from tests.unit import test_host_reconciler
from vgpu_driver import claims
from vgpu_driver import claims_journal
from vgpu_driver import dashboard
from vgpu_driver import host_reconciler
from vgpu_driver import placement
from vgpu_driver import placement_service
from vgpu_driver.cmd import manage

RULES = promtool.ALERTS
RUNBOOK = "https://docs.openstack.org/vgpu-driver/latest/admin/troubleshooting.html"
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
# Times nova-compute's periodic update moves on (every minute) while it runs.
UPDATED_AT = ("vgpu_inventory_update_timestamp_seconds",)


def cli(tmp_path, host, state_dir, *argv, expect=0, extra="", uri="test:///default"):
    conf_file = tmp_path / f"{state_dir.name}.conf"
    conf_file.write_text(CONF + extra)
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
                str(state_dir),
                "--libvirt-uri",
                uri,
                *argv,
            ]
        )
    assert code == expect, err.getvalue()
    return out.getvalue()


def scrape(tmp_path, host, state_dir, extra="", uri="test:///default"):
    """The exposition and the time it was read at."""
    return cli(tmp_path, host, state_dir, "metrics", extra=extra, uri=uri), time.time()


@pytest.fixture
def busy(make_host, make_driver, tmp_path, fake_kernel_cli):
    """A driver's host: a blocked removal, an incoming migration's claim."""
    host = make_host("a100-sriov", "t4x8")
    types = CONF.split("[mdev_", 1)
    vgpu = make_driver(
        host,
        "remove_mdevs_on_release = true\nmdev_remove_timeout = 0.1\n[mdev_" + types[1],
        types="nvidia-468, nvidia-231",
    )
    vgpu.init_host()
    vgpu.provider_tree("cn1")
    held = test_host_reconciler.block_a_removal(vgpu, host)
    incoming = str(uuid.uuid4())
    host.create_mdev("0000:18:00.0", "nvidia-231", incoming)
    with vgpu.journal.transaction() as txn:
        txn.add("moving", incoming, T4, T4, "nvidia-231", state=claims.MIGRATING_IN, created=True)
    assert vgpu.worker.run_now(host_reconciler.PERIODIC)
    time.sleep(1.1)  # the blocked removal's claim is older than a claim_grace of 1 s
    yield scrape(tmp_path, host, tmp_path / "state", "[vgpu]\nclaim_grace = 1\n")
    host.release(held)


@pytest.fixture
def fresh(make_host, tmp_path, fake_kernel_cli, monkeypatch):
    """No nova-compute; the A100's VFs off; a T4 blocked by another type;
    Placement allocating a vGPU nobody holds here, which an audit found."""
    host = make_host(
        "a100-sriov-off",
        "t4x8",
        mdevs=[{"parent": T4, "type": "nvidia-222", "uuid": str(uuid.uuid4())}],
    )
    state = tmp_path / "fresh"
    claims_journal.Journal(str(state))
    with placement_service.EmbeddedPlacement() as service:
        for key, value in service.cli_environment().items():
            monkeypatch.setenv(key, value)
        cli(tmp_path, host, state, "sync")
        client = placement.Client(service.connection())
        (rp,) = client.request("GET", "/resource_providers?name=cn1_pci_0000_19_00_0")[
            "resource_providers"
        ]
        client.request(
            "PUT",
            f"/allocations/{uuid.uuid4()}",
            {
                "allocations": {rp["uuid"]: {"resources": {"VGPU": 1}}},
                "project_id": "p",
                "user_id": "u",
                "consumer_generation": None,
                "consumer_type": "INSTANCE",
            },
        )
        cli(tmp_path, host, state, "audit", expect=1)
    return scrape(tmp_path, host, state)


@pytest.fixture
def stopped(make_host, make_driver, tmp_path):
    """What nova-compute wrote to [vgpu] metrics_textfile before it stopped."""
    host = make_host("a100-sriov")
    (tmp_path / "textfile").mkdir()
    textfile = tmp_path / "textfile" / "vgpu.prom"
    # Its own state directory: the last state_dir line is the one read.
    vgpu = make_driver(
        host, f"metrics_textfile = {textfile}\nstate_dir = {tmp_path / 'stopped-state'}"
    )
    vgpu.init_host()
    vgpu.provider_tree("cn1")
    vgpu.close()
    return textfile.read_text(), time.time()


def input_series(scraped, instance, updating=True):
    """promtool's ``input_series`` of one scrape, as Prometheus would have
    labelled it (``instance``, ``job``), times moved to promtool's clock;
    the inventory update's time moves on with promtool's clock if
    ``updating``, else it stays where it was."""
    text, at = scraped
    found = promtool.samples(text)
    series = []
    for name, labels, value in found:
        step = 0
        if name.endswith("_timestamp_seconds"):
            value = value - at
        if name in UPDATED_AT:
            value, step = 0.0, (60 if updating else 0)
        series.append(
            {
                "series": promtool.selector(name, {**labels, "instance": instance, "job": "vgpu"}),
                "values": f"{value!r}+{step}x{MINUTES}",
            }
        )
    return series, found


def rules():
    with open(RULES) as source:
        return {r["alert"]: r for group in yaml.safe_load(source)["groups"] for r in group["rules"]}


def alert(rule, labels):
    """An expected alert: the series' labels, the rule's, the annotations
    expanded as Prometheus expands ``{{ $labels.x }}``."""
    labels = {**labels, **rule.get("labels", {})}

    def expand(text):
        return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)

    return {
        "exp_labels": labels,
        "exp_annotations": {k: expand(v) for k, v in rule["annotations"].items()},
    }


def gpu_labels(gpu, instance):
    return {"gpu": gpu, "instance": instance, "job": "vgpu"}


def test_the_rules_are_valid():
    for path in promtool.RULE_FILES:
        done = subprocess.run(
            ["promtool", "check", "rules", path], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


def test_each_alert_fires_where_the_scraped_state_calls_for_it(busy, fresh, stopped, tmp_path):
    busy_series, busy_found = input_series(busy, "busy")
    fresh_series, fresh_found = input_series(fresh, "fresh")
    stopped_series, _ = input_series(stopped, "stopped", updating=False)
    assert any(n in UPDATED_AT for n, _l, _v in busy_found)
    host = {"job": "vgpu"}
    expected = {name: [] for name in rules()}
    expected["VgpuRemovalStuck"] = [{"instance": "busy", **host}]
    expected["VgpuMigrationClaimTooOld"] = [{"instance": "busy", "state": "migrating_in", **host}]
    expected["VgpuReconcilerDown"] = [{"instance": "fresh", **host}]
    expected["VgpuInventoryUpdateStale"] = [{"instance": "stopped", **host}]
    expected["VgpuPlacementDrift"] = [
        {"instance": "fresh", "kind": "allocation-without-mdev", **host}
    ]
    expected["VgpuSriovOff"] = [gpu_labels(A100, "fresh")]
    expected["VgpuGpuUnusable"] = [gpu_labels(T4, "fresh")]
    # The blocked removal's releasing claim is past a grace of 1 s, yet it
    # is the kernel that holds it (VgpuRemovalStuck), not the reconciler.
    assert ("vgpu_claims", {"state": "releasing"}, 1.0) in busy_found
    assert ("vgpu_claims_past_grace", {"state": "releasing"}, 0.0) in busy_found
    found = rules()
    series = busy_series + fresh_series + stopped_series
    promtool.run_tests(
        tmp_path,
        [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {
                        "eval_time": EVAL_AT,
                        "alertname": name,
                        "exp_alerts": [alert(found[name], labels) for labels in wanted],
                    }
                    for name, wanted in expected.items()
                ],
            }
        ],
    )


def test_a_long_migration_whose_guest_came_is_no_alarm(make_host, tmp_path, fake_kernel_cli):
    """A live migration's destination claim whose guest has arrived (its
    domain uses the vGPU) may take hours; only one nobody came for is."""
    host = make_host("t4x8")
    arrived, abandoned = str(uuid.uuid4()), str(uuid.uuid4())
    state = tmp_path / "state"
    journal = claims_journal.Journal(str(state))
    for vgpu in (arrived, abandoned):
        host.create_mdev(T4, "nvidia-231", vgpu)
    with journal.transaction() as txn:
        txn.add(
            str(uuid.uuid4()),
            arrived,
            T4,
            T4,
            "nvidia-231",
            state=claims.MIGRATING_IN,
            created=True,
        )
    uri = libvirt_domains.node_file(
        tmp_path / "node.xml",
        [libvirt_domains.domain_xml("instance-00000001", [arrived], str(uuid.uuid4()))],
    )
    healthy, _ = input_series(scrape(tmp_path, host, state, uri=uri), "moving")
    with journal.transaction() as txn:
        txn.add(
            str(uuid.uuid4()),
            abandoned,
            T4,
            T4,
            "nvidia-231",
            state=claims.MIGRATING_IN,
            created=True,
        )
    dead, _ = input_series(scrape(tmp_path, host, state, uri=uri), "moving")
    rule = rules()["VgpuMigrationClaimTooOld"]
    promtool.run_tests(
        tmp_path,
        [
            {
                "interval": "1m",
                "input_series": healthy,
                "alert_rule_test": [
                    {
                        "eval_time": EVAL_AT,
                        "alertname": "VgpuMigrationClaimTooOld",
                        "exp_alerts": [],
                    }
                ],
            },
            {
                "interval": "1m",
                "input_series": dead,
                "alert_rule_test": [
                    {
                        "eval_time": EVAL_AT,
                        "alertname": "VgpuMigrationClaimTooOld",
                        "exp_alerts": [
                            alert(
                                rule, {"instance": "moving", "job": "vgpu", "state": "migrating_in"}
                            )
                        ],
                    }
                ],
            },
        ],
    )


def test_every_alert_has_a_runbook_section():
    with open("doc/source/admin/troubleshooting.rst") as page:
        anchors = set(re.findall(r"^\.\. _([\w-]+):$", page.read(), re.M))
    for name, rule in rules().items():
        url = rule["annotations"]["runbook_url"]
        assert url == f"{RUNBOOK}#alert-{name.lower()}", name
        assert f"alert-{name.lower()}" in anchors, name


@pytest.mark.parametrize("name", sorted(alert_cases.CASES))
def test_each_alert_fires_and_does_not_fire(name, tmp_path):
    """Hand-made series around each alert's threshold: promtool says it
    fires on one and not on the other."""
    rule = rules()[name]
    fires, quiet, labels = alert_cases.CASES[name]
    promtool.run_tests(
        tmp_path,
        [
            {
                "interval": "1m",
                "input_series": alert_cases.series(fires),
                "alert_rule_test": [
                    {
                        "eval_time": alert_cases.EVAL_AT,
                        "alertname": name,
                        "exp_alerts": [alert(rule, labels)],
                    }
                ],
            },
            {
                "interval": "1m",
                "input_series": alert_cases.series(quiet),
                "alert_rule_test": [
                    {"eval_time": alert_cases.EVAL_AT, "alertname": name, "exp_alerts": []}
                ],
            },
        ],
    )


def test_every_alert_has_cases():
    assert set(alert_cases.CASES) == set(rules())


def test_the_dashboard_is_what_the_code_makes():
    with open(dashboard.PATH) as shipped:
        assert shipped.read() == dashboard.text()


def test_every_panel_query_parses_and_names_exported_series(busy, fresh, tmp_path, mixed_host):
    """Each query, its variables set to every value, parsed by promtool (as
    a recording rule); each series it names is exported by ``metrics`` on
    the fake hosts (or recorded by the shipped rules)."""
    queries = [q.replace("$instance", ".*").replace("$type", ".*") for q in dashboard.queries()]
    panels = tmp_path / "panels.yml"
    panels.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "panels",
                        "rules": [
                            {"record": f"panel:query_{i}", "expr": q} for i, q in enumerate(queries)
                        ],
                    }
                ]
            }
        )
    )
    done = subprocess.run(
        ["promtool", "check", "rules", str(panels)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    exported = {
        name
        for text, _at in (busy, fresh, mixed_host)
        for name, _labels, _value in promtool.samples(text)
    }
    with open(promtool.RECORDS) as source:
        recorded = {
            r["record"] for group in yaml.safe_load(source)["groups"] for r in group["rules"]
        }
    named = {n for q in queries for n in re.findall(r"[a-z_:]*vgpu_[a-z_:]+", q)}
    assert named and named <= exported | recorded, named - exported - recorded
    assert {"vgpu_vgpu_info", "vgpu_gpu_framebuffer_reserved_bytes", "vgpu_removals_stuck"} <= named


@pytest.fixture
def mixed_host(make_host, tmp_path, fake_kernel_cli):
    """What ``metrics`` prints for T4s and an L40S serving mixed sizes."""
    (tmp_path / "mixed").mkdir()
    host, uri = test_metrics_rules.make_mixed(make_host, tmp_path / "mixed")
    return test_metrics_rules.cli(tmp_path / "mixed", host, uri, "metrics"), time.time()


def test_promtool_finds_nothing_to_lint_in_the_exposition(busy, fresh, mixed_host):
    for text, _at in (busy, fresh, mixed_host):
        code, said = promtool.check_metrics(text)
        assert (code, said) == (0, ""), said
