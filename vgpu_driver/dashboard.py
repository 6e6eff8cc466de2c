"""The Grafana dashboard shipped in ``etc/grafana``, made here.

A dashboard is JSON nobody reviews by eye; made from this list of panels,
each query is one line a test can parse (``promtool check rules`` on a
recording rule per query) and whose series it can check ``vgpu-manage
metrics`` exports.  ``python -m vgpu_driver.dashboard [FILE]`` writes it.
"""

import json
import sys

PATH = "etc/grafana/vgpu-driver-dashboard.json"
UID = "vgpu-driver"
# Grafana's template variables, and what a test puts in their place to
# evaluate a query (every value).
VARIABLES = {
    "instance": "label_values(vgpu_driver_info, instance)",
    "type": "label_values(vgpu_gpu_vgpus_capacity, type)",
}
HOST = 'instance=~"$instance"'
TYPE = 'type=~"$type"'
WIDTH, HEIGHT = 12, 8

# (title, kind, unit, [(query, legend)]); kind: timeseries, stat or table.
PANELS = (
    (
        "Free vGPUs by type",
        "timeseries",
        "none",
        [(f"sum by (type) (instance_type:vgpu_vgpus_free:sum{{{HOST},{TYPE}}})", "{{type}}")],
    ),
    (
        "Capacity, used and reserved vGPUs by type",
        "timeseries",
        "none",
        [
            (f"sum by (type) (vgpu_gpu_vgpus_capacity{{{HOST},{TYPE}}})", "{{type}} capacity"),
            (f"sum by (type) (vgpu_gpu_vgpus_used{{{HOST},{TYPE}}})", "{{type}} used"),
            (f"sum by (type) (vgpu_gpu_vgpus_reserved{{{HOST},{TYPE}}})", "{{type}} reserved"),
        ],
    ),
    (
        "vGPUs held back, by reason",
        "timeseries",
        "none",
        [(f"sum by (reason) (vgpu_gpu_vgpus_reserved_by_reason{{{HOST}}})", "{{reason}}")],
    ),
    (
        "Mixed-size framebuffer held back, by reason",
        "timeseries",
        "bytes",
        [(f"sum by (reason) (vgpu_gpu_framebuffer_reserved_bytes{{{HOST}}})", "{{reason}}")],
    ),
    (
        "GPUs by type: used of capacity",
        "table",
        "none",
        [
            (
                f"vgpu_gpu_vgpus_used{{{HOST},{TYPE}}} * on (instance, gpu) group_left (model, "
                f"provider) vgpu_gpu_info",
                "used",
            ),
            (
                f"vgpu_gpu_vgpus_capacity{{{HOST},{TYPE}}} * on (instance, gpu) group_left "
                f"(model, provider) vgpu_gpu_info",
                "capacity",
            ),
        ],
    ),
    (
        "GPUs serving nothing",
        "table",
        "none",
        [(f"vgpu_gpu_served{{{HOST}}} == 0", "{{instance}} {{gpu}}")],
    ),
    (
        "Claims by state",
        "timeseries",
        "none",
        [
            (f"sum by (state) (vgpu_claims{{{HOST}}})", "{{state}}"),
            (f"sum by (state) (vgpu_claims_past_grace{{{HOST}}})", "{{state}} past grace"),
        ],
    ),
    (
        "Migrations in flight",
        "timeseries",
        "none",
        [
            (f'sum by (instance) (vgpu_claims{{{HOST},state="migrating_in"}})', "{{instance}}"),
            (
                f'state:vgpu_claims_waiting_oldest_age_seconds{{{HOST},state="migrating_in"}}',
                "{{instance}} oldest waiting, s",
            ),
        ],
    ),
    (
        "Host reconciler",
        "timeseries",
        "none",
        [
            (f"vgpu_reconciler_up{{{HOST}}}", "{{instance}} up"),
            (f"increase(vgpu_reconciler_errors_total{{{HOST}}}[1h])", "{{instance}} errors/h"),
            (f"vgpu_reconciler_queue_length{{{HOST}}}", "{{instance}} queued"),
        ],
    ),
    (
        "Inventory update and audit age",
        "timeseries",
        "s",
        [
            (f"instance:vgpu_inventory_update_age_seconds{{{HOST}}}", "{{instance}} update"),
            (f"instance:vgpu_audit_age_seconds{{{HOST}}}", "{{instance}} audit"),
        ],
    ),
    (
        "Removals the kernel blocks",
        "timeseries",
        "none",
        [
            (f"sum by (instance) (vgpu_removals_stuck{{{HOST}}})", "{{instance}}"),
            (
                f"instance:vgpu_removals_stuck_oldest_age_seconds{{{HOST}}}",
                "{{instance}} oldest, s",
            ),
        ],
    ),
    (
        "Placement drift (last audit)",
        "stat",
        "none",
        [(f"sum by (kind) (vgpu_placement_drift{{{HOST}}})", "{{kind}}")],
    ),
    (
        "Guests' vGPUs",
        "table",
        "none",
        [(f'vgpu_vgpu_info{{{HOST},{TYPE},instance_uuid!=""}}', "")],
    ),
    (
        "Exporter",
        "timeseries",
        "s",
        [
            (f"vgpu_scrape_duration_seconds{{{HOST}}}", "{{instance}} scrape"),
            (f"vgpu_scrape_success{{{HOST}}} == 0", "{{instance}} failed"),
        ],
    ),
)


def _variable(name, query):
    return {
        "name": name,
        "type": "query",
        "query": query,
        "refresh": 2,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
    }


def _panel(number, title, kind, unit, queries):
    table = kind == "table"
    return {
        "id": number,
        "type": kind,
        "title": title,
        "gridPos": {
            "h": HEIGHT,
            "w": WIDTH,
            "x": (number - 1) % 2 * WIDTH,
            "y": (number - 1) // 2 * HEIGHT,
        },
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "expr": expr,
                "legendFormat": legend,
                "instant": table,
                "format": "table" if table else "time_series",
            }
            for i, (expr, legend) in enumerate(queries)
        ],
    }


def dashboard():
    """The dashboard, as Grafana imports it."""
    return {
        "uid": UID,
        "title": "vGPUs (vgpu-driver)",
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "1m",
        "time": {"from": "now-6h", "to": "now"},
        "tags": ["vgpu", "openstack"],
        "templating": {
            "list": [
                {"name": "datasource", "type": "datasource", "query": "prometheus"},
                *(_variable(name, query) for name, query in VARIABLES.items()),
            ]
        },
        "panels": [_panel(i, *spec) for i, spec in enumerate(PANELS, start=1)],
    }


def text():
    return json.dumps(dashboard(), indent=2, sort_keys=True) + "\n"


def queries():
    """Every panel's query, as written in the dashboard."""
    return [target["expr"] for panel in dashboard()["panels"] for target in panel["targets"]]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0] if argv else PATH, "w") as out:
        out.write(text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
