"""The soak's long run: random operations through nova's services, for hours.

``tests/functional_nova/test_soak.py`` runs a few minutes of the soak in CI;
bugs that need a rare order of operations show up only over thousands.
This runs the same engine (``tests/functional_nova/soak.py``) as a unittest
case, with ``--ops`` operations (10,000 by default, about two hours on two
cores) from ``--seed``, and prints progress every 100 operations to stderr,
then what ran, what nova refused, the faults injected and every violation
with the operations before it.  It exits 1 if there is any violation, or
if the case itself failed; timings are reported, not judged.
"""

import argparse
import os
import resource
import signal
import sys
import time
import unittest

import common

sys.path.insert(0, common.REPO)   # the soak imports ``tests`` as a package

from tests.functional_nova import soak  # noqa: E402 - needs the path above

DEFAULT_OPS = 10_000
EXIT_STOPPED = 130          # as a shell reports a command SIGINT ended


class LongSoak(soak.SoakTestBase):
    """The soak case; its result is kept where nova's cleanup leaves it."""

    def test_long_soak(self):
        self._long_began = time.monotonic()
        self._soak_result = self.run_soak(progress=self._progress)

    def _step(self, index, op):
        super()._step(index, op)
        self._steps_done = index

    def result_so_far(self):
        """What a run stopped early did (its end checks never ran), or None."""
        result = getattr(self, "_result", None)
        if result is None or not getattr(self, "_steps_done", 0):
            return None
        result.ops = self._steps_done
        result.elapsed = time.monotonic() - self._long_began
        return result

    def _progress(self, index, result):
        elapsed = time.monotonic() - self._long_began
        print(f"{index} operations in {elapsed:.0f} s, {len(result.violations)} "
              f"violation(s), max RSS {_max_rss_mb():.0f} MB", file=sys.stderr, flush=True)
        # Each new violation as soon as it is seen: a run cut short still says it.
        shown = getattr(self, "_shown", set())
        for key, violation in result.violations.items():
            if key not in shown:
                print(f"  [{violation.category}] {violation.subject}: {violation.detail} "
                      f"(first after op {violation.first_op}; before it: "
                      f"{' / '.join(violation.ops_before)})", file=sys.stderr, flush=True)
        self._shown = shown | set(result.violations)
        # nova's log capture would otherwise hold every line of the run.
        self.stdlog.logger._output.seek(0)
        self.stdlog.logger._output.truncate()


def _max_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=DEFAULT_OPS,
                        help=f"Operations to run (default: {DEFAULT_OPS}).")
    parser.add_argument("--seed", type=int,
                        help="The random seed (default: a new one, printed first).")
    args = parser.parse_args(argv)
    if args.ops < 1:
        parser.error("--ops must be at least 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    os.environ[soak.OPS_ENV] = str(args.ops)
    if args.seed is not None:
        os.environ[soak.SEED_ENV] = str(args.seed)
    case = LongSoak("test_long_soak")
    outcome = unittest.TestResult()
    # A run cut short (Ctrl-C, or timeout's SIGTERM) still reports what it did.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        case.run(outcome)
    except KeyboardInterrupt:
        return _report_stopped(case)
    for test, trace in outcome.errors + outcome.failures:
        print(f"{test.id()} did not finish:\n{trace}", file=sys.stderr)
    result = getattr(case, "_soak_result", None)
    if result is None:
        return 1
    print(result.report())
    print(f"max RSS {_max_rss_mb():.0f} MB")
    return 1 if result.violations or not outcome.wasSuccessful() else 0


def _report_stopped(case):
    result = case.result_so_far()
    if result is None:
        print("stopped before the first operation ended", file=sys.stderr)
        return EXIT_STOPPED
    print(result.report())
    print(f"stopped after {result.ops} operations: the end checks (everything deleted, "
          f"nothing left) did not run; max RSS {_max_rss_mb():.0f} MB")
    return EXIT_STOPPED


if __name__ == "__main__":
    sys.exit(main())
