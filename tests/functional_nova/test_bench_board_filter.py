"""The scheduler filter's benchmark (``benchmarks/bench_board_filter.py``)
at a small size.

The benchmark runs 1000 hosts for minutes in the bench lane; this runs its
whole path on three hosts, in this lane because it runs nova's scheduler
pieces: the fleet synced into Placement on PostgreSQL, nova's request,
filters and weighers, ours, and the board reads through nova's report
client, every claimed host's first candidate on the board the rule puts
first and the weigher's first hosts those whose best board ranks best.
"""

import json
import os
import subprocess
import sys
import tempfile

from tests import postgres
from tests.functional_nova import deadline

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "benchmarks", "bench_board_filter.py")
STEPS = (
    "candidates",
    "nova_filters",
    "nova_weighers",
    "our_filter",
    "our_weigher",
    "our_reads",
)


class BenchBoardFilterTest(deadline.TestCase):
    def run_bench(self, *args):
        tmp = self.scratch()
        out = os.path.join(tmp, "numbers.json")
        done = subprocess.run(
            [sys.executable, BENCH, *args, "--json", out, "--tmpdir", tmp],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env={**os.environ, "PYTHONPATH": REPO},
        )
        return done, out, tmp

    def scratch(self):
        tmp = tempfile.mkdtemp(prefix="bench-board-filter-test-")
        os.chmod(tmp, 0o755)  # the postgres user runs initdb under it
        self.addCleanup(subprocess.run, ["rm", "-rf", tmp], check=False)
        return tmp

    def test_three_hosts_every_step_timed_and_the_right_board_first(self):
        self.assertIsNone(postgres.unavailable())
        done, out, _tmp = self.run_bench("--hosts", "3", "--rounds", "2")
        self.assertEqual(0, done.returncode, done.stdout + done.stderr)
        with open(out) as f:
            numbers = json.load(f)
        self.assertEqual(
            (3, 4, 2), (numbers["hosts"], numbers["boards_per_host"], numbers["rounds"])
        )
        # Every host's four boards can take the vGPU: one candidate each.
        self.assertEqual(12, numbers["candidates_found"])
        # nova's allocation-candidates request, and one per host of 3.
        self.assertEqual(1 + 3, numbers["placement_gets_per_round"])
        for step in STEPS:
            self.assertEqual(2, len(numbers["ms"][step]["samples"]))
            self.assertGreater(numbers["ms"][step]["median"], 0)
        self.assertAlmostEqual(
            numbers["ratio"], numbers["added_ms"] / numbers["baseline_ms"], places=6
        )
        self.assertAlmostEqual(
            numbers["weigher_ratio"],
            numbers["ms"]["our_weigher"]["median"] / numbers["baseline_ms"],
            places=6,
        )
        self.assertAlmostEqual(
            numbers["baseline_ms"],
            sum(numbers["ms"][step]["median"] for step in STEPS[:3]),
            places=6,
        )
        self.assertIn("added / nova =", done.stdout)
        self.assertIn("weigher / nova =", done.stdout)

    def test_too_few_hosts_is_refused_before_anything_runs(self):
        done, out, tmp = self.run_bench("--hosts", "2")
        self.assertEqual(2, done.returncode)
        self.assertIn("--hosts must be at least 3", done.stderr)
        self.assertEqual([], os.listdir(tmp))
