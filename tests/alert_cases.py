"""Hand-made series on each side of each shipped alert's threshold.

``CASES[alert] = (fires, quiet, labels)``: ``fires`` and ``quiet`` are
``{series: promtool values}`` over 100 minutes of a host ``h`` scraped by
job ``vgpu``; at :data:`EVAL_AT` the alert fires on ``fires`` with
``labels`` and not on ``quiet``.  promtool's clock starts at 0, so a
``_timestamp_seconds`` of 0 is 90 minutes old at :data:`EVAL_AT`.
"""

from tests import promtool

EVAL_AT = "90m"
H = {"instance": "h", "job": "vgpu"}
GPU = {**H, "gpu": "0000:41:00.0"}
ALL = "x100"


def s(name, **labels):
    return promtool.selector(name, {**H, **labels})


def series(values):
    return [{"series": name, "values": value} for name, value in values.items()]


CONFIGURED = {s("vgpu_gpu_configured_type_info", gpu=GPU["gpu"], type="nvidia-468"): "1" + ALL}
REASONS = ("no_capacity", "blocked", "draining", "max_instances", "unreadable", "claims")


def _reasons(held):
    return {
        s(
            "vgpu_gpu_vgpus_reserved_by_reason", gpu=GPU["gpu"], reason=r
        ): f"{8 if r == held else 0}{ALL}"
        for r in REASONS
    }


def _type(used, capacity=10, reserved=0):
    return {
        s(f"vgpu_gpu_vgpus_{n}", gpu=GPU["gpu"], type="nvidia-468"): f"{v}{ALL}"
        for n, v in (("capacity", capacity), ("reserved", reserved), ("used", used))
    }


CASES = {
    "VgpuRemovalStuck": (
        {s("vgpu_removals_stuck_oldest_timestamp_seconds"): "0" + ALL},
        {s("vgpu_removals_stuck_oldest_timestamp_seconds"): "5000" + ALL},
        H,
    ),
    "VgpuMigrationClaimTooOld": (
        {s("vgpu_claims_waiting_oldest_timestamp_seconds", state="migrating_in"): "0" + ALL},
        {s("vgpu_claims_waiting_oldest_timestamp_seconds", state="migrating_in"): "3000" + ALL},
        {**H, "state": "migrating_in"},
    ),
    "VgpuClaimsPastGrace": (
        {s("vgpu_claims_past_grace", state="claimed"): "1" + ALL},
        # Past it for 9 minutes only: the reconciler drops it in its next passes.
        {s("vgpu_claims_past_grace", state="claimed"): "0x80 1x20"},
        {**H, "state": "claimed"},
    ),
    "VgpuSriovOff": (
        {s("vgpu_gpu_sriov_vfs", gpu=GPU["gpu"]): "0" + ALL, **CONFIGURED},
        # A board nova.conf gives no type: its VFs may well be off.
        {s("vgpu_gpu_sriov_vfs", gpu=GPU["gpu"]): "0" + ALL},
        GPU,
    ),
    "VgpuBoardServesNothing": (
        {
            s("vgpu_gpu_sriov_vfs", gpu=GPU["gpu"]): "16" + ALL,
            s("vgpu_gpu_served", gpu=GPU["gpu"]): "0" + ALL,
            **CONFIGURED,
        },
        {
            s("vgpu_gpu_sriov_vfs", gpu=GPU["gpu"]): "16" + ALL,
            s("vgpu_gpu_served", gpu=GPU["gpu"]): "1" + ALL,
            **CONFIGURED,
        },
        GPU,
    ),
    "VgpuGpuUnusable": (
        {**_reasons("blocked"), **_type(0, capacity=8, reserved=8)},
        # Held back while guests of the old type drain: by design.
        {**_reasons("draining"), **_type(0, capacity=8, reserved=8)},
        GPU,
    ),
    "VgpuTypeNearlyFull": (_type(10), _type(5), {"type": "nvidia-468"}),
    "VgpuPlacementDrift": (
        {s("vgpu_placement_drift", kind="allocation-without-mdev"): "1" + ALL},
        {s("vgpu_placement_drift", kind="allocation-without-mdev"): "0" + ALL},
        {**H, "kind": "allocation-without-mdev"},
    ),
    "VgpuAuditStale": (
        {s("vgpu_audit_last_run_timestamp_seconds"): "-300000" + ALL},
        {s("vgpu_audit_last_run_timestamp_seconds"): "0" + ALL},
        H,
    ),
    "VgpuReconcilerDown": (
        {s("vgpu_reconciler_up"): "0" + ALL},
        {s("vgpu_reconciler_up"): "1" + ALL},
        H,
    ),
    "VgpuInventoryUpdateStale": (
        {s("vgpu_inventory_update_timestamp_seconds"): "0" + ALL},
        {s("vgpu_inventory_update_timestamp_seconds"): "0+60" + ALL},
        H,
    ),
    "VgpuReconcilerErrors": (
        # nova-compute restarted: the counter is gone 40 minutes, then back
        # above 0 and flat (increase() alone sees nothing).
        {s("vgpu_reconciler_errors_total"): "3x40 _x40 5x10"},
        {s("vgpu_reconciler_errors_total"): "3" + ALL},
        H,
    ),
    "VgpuLibvirtUnreachable": (
        {s("vgpu_guests_known"): "0" + ALL},
        {s("vgpu_guests_known"): "1x40 0x60"},
        H,
    ),
    "VgpuMetricsCannotReadHost": (
        {s("vgpu_scrape_success"): "0" + ALL},
        {s("vgpu_scrape_success"): "1" + ALL},
        H,
    ),
    "VgpuMetricsTargetDown": ({s("up"): "0" + ALL}, {s("up"): "1" + ALL}, H),
    "VgpuMetricsAbsent": (
        {s("vgpu_driver_info", nodename="cn1", version="0.1.0"): "1x60 _x40"},
        {s("vgpu_driver_info", nodename="cn1", version="0.1.0"): "1" + ALL},
        H,
    ),
}
