"""The benchmark through nova's scheduler (``benchmarks/bench_nova_schedule.py``)
at a small size.

The benchmark serves 600 requests a run in the bench lane; this runs its
whole path on one host of two L40S boards past their size, so that some
requests are turned away: nova's API, scheduler with the board filter and
weigher, Placement and the driver, each server ACTIVE or refused for want
of a host, every vGPU on one board, and no build a board refused.
"""

import json
import os
import subprocess
import sys
import tempfile

from tests.functional_nova import deadline

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "benchmarks", "bench_nova_schedule.py")
ARRIVALS = 6


class BenchNovaScheduleTest(deadline.TestCase):
    def test_a_small_trace_is_served_or_refused_one_request_at_a_time(self):
        tmp = tempfile.mkdtemp(prefix="bench-nova-schedule-test-")
        self.addCleanup(subprocess.run, ["rm", "-rf", tmp], check=False)
        out = os.path.join(tmp, "numbers.json")
        args = ("--hosts", "1", "--boards", "2", "--arrivals", str(ARRIVALS))
        args += ("--load", "2.5", "--seed", "2", "--periodic-every", "4", "--json", out)
        done = subprocess.run(
            [sys.executable, BENCH, *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env={**os.environ, "PYTHONPATH": REPO, "TMPDIR": tmp},
        )
        self.assertEqual(0, done.returncode, done.stdout + done.stderr[-4000:])
        with open(out) as f:
            numbers = json.load(f)
        self.assertEqual(
            ("mixed", "ours", 1, 2),
            tuple(numbers[k] for k in ("shared", "scheduler", "hosts", "boards_per_host")),
        )
        self.assertEqual(ARRIVALS, numbers["served"] + numbers["rejected"])
        # Past the boards' size some requests find no host ...
        self.assertGreater(numbers["rejected"], 0)
        self.assertEqual(numbers["rejected"], sum(numbers["rejected_by_size"].values()))
        # ... and each served one landed on a board of the host.
        self.assertEqual({"host1": numbers["served"]}, numbers["served_by_host"])
        self.assertEqual((0, 0), (numbers["rescheduled"], numbers["failed"]))
        self.assertIn("rejected", done.stdout)
