"""The soak's long run: random operations through nova's services, for hours.

``tests/functional_nova/test_soak.py`` runs a few minutes of the soak in CI;
bugs that need a rare order of operations show up only over thousands.
This runs the same engine (``tests/functional_nova/soak.py``) as a unittest
case, with ``--ops`` operations (10,000 by default, about two hours on two
cores) from ``--seed``, and prints progress every 100 operations to stderr,
then what ran, what nova refused, the faults injected and every violation
with the operations before it.  It exits 1 if there is any violation, or
if the case itself failed; timings are reported, not judged.  SIGINT or
SIGTERM ends it after the operation in progress, with the same report for
what ran, and exit status 130.
"""

import argparse
import gc
import os
import resource
import signal
import sys
import time
import traceback
import unittest

import common

sys.path.insert(0, common.REPO)  # the soak imports ``tests`` as a package

from tests.functional_nova import soak  # noqa: E402 - needs the path above

DEFAULT_OPS = 10_000
EXIT_STOPPED = 130  # as a shell reports a command SIGINT ended


class LongSoak(soak.SoakTestBase):
    """The soak case; its result is kept where nova's cleanup leaves it."""

    stop_requested = False
    in_run = False  # between nova's set-up and its clean-up

    def setUp(self):
        super().setUp()
        kept = _keep_in_memory_databases()
        print(
            f"{kept} in-memory database(s) kept from oslo.db's hourly recycling",
            file=sys.stderr,
            flush=True,
        )

    def test_long_soak(self):
        self._long_began = time.monotonic()
        self.in_run = True
        try:
            self._soak_result = self.run_soak(progress=self._progress)
        finally:
            self.in_run = False

    def _step(self, index, op):
        super()._step(index, op)
        self._steps_done = index
        if self.stop_requested:
            print(f"stopping after operation {index}, as asked", file=sys.stderr, flush=True)
            raise KeyboardInterrupt

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
        print(
            f"{index} operations in {elapsed:.0f} s, {len(result.violations)} "
            f"violation(s), max RSS {_max_rss_mb():.0f} MB",
            file=sys.stderr,
            flush=True,
        )
        # Each new violation as soon as it is seen: a run cut short still says it.
        shown = getattr(self, "_shown", set())
        for key, violation in result.violations.items():
            if key not in shown:
                print(
                    f"  [{violation.category}] {violation.subject}: {violation.detail} "
                    f"(first after op {violation.first_op}; before it: "
                    f"{' / '.join(violation.ops_before)})",
                    file=sys.stderr,
                    flush=True,
                )
        self._shown = shown | set(result.violations)
        # nova's log capture would otherwise hold every line of the run.
        self.forget_nova_log()


def _keep_in_memory_databases():
    """Stop oslo.db recycling the connection of each in-memory database.

    oslo.db closes and reopens a connection an hour after it opened it
    (``connection_recycle_time``).  Under eventlet nova's harness (and
    Placement's) keeps each database in one in-memory sqlite connection,
    so that recycling empties the database: a run past its first hour then
    failed on every request with "no such table".  Returns how many engines
    it changed."""
    from sqlalchemy.engine import Engine

    kept = 0
    for engine in [o for o in gc.get_objects() if isinstance(o, Engine)]:
        if engine.url.get_backend_name() == "sqlite" and engine.url.database in (
            None,
            "",
            ":memory:",
        ):
            engine.pool._recycle = -1
            kept += 1
    return kept


def _say_lost_connections(case):
    """Under eventlet nova's harness keeps each database in one in-memory
    sqlite connection, so a connection invalidated or closed during the run
    is an empty database, and every later request fails with "no such
    table".  Print where that happened: nova's log, truncated as the run
    goes, would not keep it.  (On native threads the databases are files.)"""
    from nova import utils as nova_utils  # after the soak's eventlet patching
    from sqlalchemy import event
    from sqlalchemy import pool

    if nova_utils.concurrency_mode_threading():
        return

    def lost(kind):
        def listener(dbapi_connection, record, *exception):
            if case.in_run:
                why = repr(exception[0]) if exception else "no exception"
                print(f"a database connection was {kind} ({why}):", file=sys.stderr, flush=True)
                traceback.print_stack(limit=30, file=sys.stderr)

        return listener

    event.listen(pool.Pool, "invalidate", lost("invalidated"))
    event.listen(pool.Pool, "close", lost("closed"))


def _max_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--ops", type=int, default=DEFAULT_OPS, help=f"Operations to run (default: {DEFAULT_OPS})."
    )
    parser.add_argument(
        "--seed", type=int, help="The random seed (default: a new one, printed first)."
    )
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
    _say_lost_connections(case)
    outcome = unittest.TestResult()
    _stop_between_operations(case)
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


def _stop_between_operations(case):
    """Ctrl-C or SIGTERM (``timeout``'s) ends the run after the operation in
    progress, and it still reports what it did.

    The interrupt is raised in the case's own thread once its operation has
    ended: under eventlet a signal's handler runs in whichever green thread
    the hub is in, so an interrupt raised there would end a nova service's
    database call and lose the in-memory database the services share (every
    later request fails with "no such table"), and the run, rather than stop,
    would fail.  Every signal only asks: one operator action often sends two
    (``pkill -f`` matching both ``timeout`` and the run, which ``timeout``
    then forwards to).  SIGKILL is what stops it at once."""

    def request_stop(signum, frame):
        # Nothing is printed here: the signal may have come in the middle
        # of a write to stderr, which would then be entered twice.
        case.stop_requested = True

    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)


def _report_stopped(case):
    result = case.result_so_far()
    if result is None:
        print("stopped before the first operation ended", file=sys.stderr)
        return EXIT_STOPPED
    print(result.report())
    print(
        f"stopped after {result.ops} operations: the end checks (everything deleted, "
        f"nothing left) did not run; max RSS {_max_rss_mb():.0f} MB"
    )
    return EXIT_STOPPED


if __name__ == "__main__":
    sys.exit(main())
