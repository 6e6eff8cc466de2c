"""Prometheus' own ``promtool`` run on what ``vgpu-manage metrics`` printed.

A scrape becomes promtool ``input_series`` labelled as Prometheus labels a
target (``instance``, ``job``), each value held for the test's span; the
shipped rule files are evaluated by ``promtool test rules``.
"""

import os
import subprocess

import yaml
from prometheus_client import parser

RECORDS = "etc/prometheus/vgpu-driver-rules.yml"
ALERTS = "etc/prometheus/vgpu-driver-alerts.yml"
RULE_FILES = (RECORDS, ALERTS)
JOB = "vgpu"


def samples(text):
    """``[(name, labels, value)]`` of an exposition, parsed by prometheus_client."""
    return [
        (s.name, s.labels, s.value)
        for family in parser.text_string_to_metric_families(text)
        for s in family.samples
    ]


def selector(name, labels):
    """``name{k="v",...}`` with Prometheus' escaping; empty values dropped, as
    Prometheus drops them."""
    quoted = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()) if v != "")
    return name + "{" + quoted + "}"


def _escape(value):
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def input_series(text, instance, minutes, steps=None, job=JOB):
    """promtool's ``input_series`` of one scrape held for ``minutes``;
    ``steps`` ``{name: per-minute step}`` moves some on."""
    steps = steps or {}
    return [
        {
            "series": selector(name, {**labels, "instance": instance, "job": job}),
            "values": f"{value!r}+{steps.get(name, 0)}x{minutes}",
        }
        for name, labels, value in samples(text)
    ]


def run_tests(tmp_path, tests, rule_files=RULE_FILES):
    """Run ``promtool test rules`` on ``tests`` (its ``tests`` list) with the
    shipped ``rule_files``; promtool's output when it fails."""
    document = {
        "rule_files": [os.path.abspath(f) for f in rule_files],
        "evaluation_interval": "1m",
        "tests": tests,
    }
    path = tmp_path / "promtool-tests.yml"
    path.write_text(yaml.safe_dump(document))
    done = subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def check_metrics(text):
    """``promtool check metrics`` of an exposition: its complaints."""
    done = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    return done.returncode, done.stdout + done.stderr
