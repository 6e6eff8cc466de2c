"""The mixed-size simulation (``benchmarks/bench_mixed_size.py``) at a small size.

The benchmark runs for minutes in the bench lane; this runs its whole path
on three boards and a short trace, so that what it measures stays true:
the real static run rejects what its model says, and neither Placement
inventory grants what the board then refuses.
"""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "benchmarks", "bench_mixed_size.py")


def test_both_sides_serve_the_trace_and_placement_grants_only_what_fits(tmp_path):
    out = tmp_path / "numbers.json"
    done = subprocess.run(
        [
            sys.executable,
            BENCH,
            "--boards",
            "3",
            "--arrivals",
            "60",
            "--load",
            "1.2",
            "--seed",
            "7",
            "--json",
            str(out),
            "--tmpdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    numbers = json.loads(out.read_text())
    for side in ("static", "mixed"):
        assert numbers[side]["granted_then_refused"] == 0
        assert numbers[side]["served"] + numbers[side]["rejected"] == 60
    # An overloaded fleet rejects on both sides, and the model agreed.
    assert numbers["static"]["rejected"] == numbers["model_rejected"] > 0
    assert numbers["mixed"]["rejected"] > 0
    assert "mixed / static rejections" in done.stdout
    assert numbers["choose"] == "fit"  # the mixed side orders boards as the filter does


def test_a_nonsensical_fleet_is_refused_before_anything_runs(tmp_path):
    done = subprocess.run(
        [sys.executable, BENCH, "--boards", "0", "--tmpdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "--boards and --arrivals must be at least 1" in done.stderr
    assert os.listdir(tmp_path) == []
