"""The mixed-size simulation (``benchmarks/bench_mixed_size.py``) at a small size.

The benchmark runs for minutes in the bench lane; this runs its whole path
on three boards and a short trace, so that what it measures stays true:
the real static run rejects what its model says, and neither Placement
inventory grants what the board then refuses.  With ``--shared pool`` the
boards are type pools, which must stay in equal-size mode and take
another size once emptied.
"""

import importlib.util
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "benchmarks", "bench_mixed_size.py")


def run_bench(tmp_path, *args):
    """The benchmark on three boards and 60 requests of seed 7, with
    ``args``; its completed process and the numbers it wrote."""
    out = tmp_path / "numbers.json"
    done = subprocess.run(
        [sys.executable, BENCH, "--boards", "3", "--arrivals", "60", "--seed", "7", *args]
        + ["--json", str(out), "--tmpdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done, json.loads(out.read_text())


def test_both_sides_serve_the_trace_and_placement_grants_only_what_fits(tmp_path):
    done, numbers = run_bench(tmp_path, "--load", "1.2")
    for side in ("static", "mixed"):
        assert numbers[side]["granted_then_refused"] == 0
        assert numbers[side]["served"] + numbers[side]["rejected"] == 60
    # An overloaded fleet rejects on both sides, and the model agreed.
    assert numbers["static"]["rejected"] == numbers["model_rejected"] > 0
    assert numbers["mixed"]["rejected"] > 0
    assert "mixed / static rejections" in done.stdout
    assert numbers["choose"] == "fit"  # the mixed side orders boards as the filter does


def test_type_pools_take_another_size_once_emptied_and_stay_equal_size(tmp_path):
    done, numbers = run_bench(tmp_path, "--shared", "pool", "--static", "model", "--load", "0.3")
    pool = numbers["pool"]
    assert numbers["shared"] == "pool" and "mixed" not in numbers
    assert pool["granted_then_refused"] == 0
    assert pool["served"] + pool["rejected"] == 60
    assert pool["boards_in_mixed_size_mode"] == 0
    # Short lives at 30 % load: boards empty, and take another size after.
    assert pool["retyped"] > 0
    assert any(len(sizes) > 1 for sizes in pool["sizes_by_board"].values())
    # The best split is the best of every split, the operator's among them.
    assert sum(numbers["operator_split"].values()) == 3
    assert numbers["operator_rejected"] >= numbers["model_rejected"]
    assert "pool / operator" in done.stdout


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_mixed_size", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_operators_split_follows_each_sizes_framebuffer_demand():
    bench = _bench_module()
    # Default mix: 4 GB x 0.4, 8 x 0.3, 12 x 0.2, 24 x 0.1, demand 1.6:2.4:2.4:2.4.
    assert bench.operator_split(8) == {4: 2, 8: 2, 12: 2, 24: 2}
    assert bench.operator_split(16) == {4: 3, 8: 5, 12: 4, 24: 4}
    # Fewer boards than sizes: the largest demands, the smaller size first.
    assert bench.operator_split(3) == {4: 0, 8: 1, 12: 1, 24: 1}
    bench.MIX = bench.parse_mix("4:0.9,24:0.1")
    # Demand 3.6:2.4, quotas 4.8 and 3.2: the larger remainder gets the 8th.
    assert bench.operator_split(8) == {4: 5, 24: 3}
    # At least one board each, even for a tiny share: taken from the others.
    bench.MIX = bench.parse_mix("4:0.99,8:0.005,24:0.005")
    assert bench.operator_split(3) == {4: 1, 8: 1, 24: 1}
    assert bench.operator_split(6) == {4: 4, 8: 1, 24: 1}


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
