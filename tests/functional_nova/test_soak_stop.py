"""The long run stopped by a signal: it ends between operations and reports.

``benchmarks/bench_soak.py`` runs for hours, usually under ``timeout``; a
stopped run must still say what it did.  It runs here as an operator runs
it, a process of its own, stopped by two SIGTERMs while an operation is in
progress, in whichever threading mode this lane runs nova in.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "benchmarks", "bench_soak.py")
TRACED = re.compile(r"^op (\d+): ")
WAIT_FOR_OPS = 3
TIMEOUT = 240


class StoppedLongRunTest(unittest.TestCase):
    def test_sigterm_stops_after_the_operation_in_progress_and_reports(self):
        proc = subprocess.Popen(
            [sys.executable, BENCH, "--ops", "1000", "--seed", "4242"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, VGPU_SOAK_TRACE="1"),
            start_new_session=True,
        )
        self.addCleanup(_kill_group, proc)
        out, err = _Reader(proc.stdout), _Reader(proc.stderr)
        if not err.wait_for_op(WAIT_FOR_OPS, TIMEOUT):
            self.fail(
                f"no operation {WAIT_FOR_OPS} within {TIMEOUT} s (exit "
                f"{proc.poll()}): {err.text()[-4000:]}"
            )
        # One operator action often sends two (pkill -f matching both the
        # run and the timeout around it, which forwards its own).
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=TIMEOUT)
        out, err = out.all(), err.all()

        self.assertEqual(130, proc.returncode, err[-4000:])
        stopped = re.search(r"stopped after (\d+) operations", out)
        self.assertIsNotNone(stopped, out)
        # Every operation that started was finished and counted, and none
        # started after the one the signal came in.
        traced = [int(m.group(1)) for m in map(TRACED.match, err.splitlines()) if m]
        self.assertEqual(list(range(1, len(traced) + 1)), traced, err[-4000:])
        self.assertEqual(len(traced), int(stopped.group(1)), out)
        self.assertGreaterEqual(len(traced), WAIT_FOR_OPS)
        self.assertIn(f"{len(traced)} operations in", out)
        self.assertIn("violations: 0 (seed 4242)", out)
        # nova's services went on untouched to the end.
        self.assertNotIn("no such table", err)
        self.assertNotIn("did not finish", err)
        self.assertIn(f"stopping after operation {len(traced)}, as asked", err)


class _Reader:
    """A pipe read to its end on a thread of its own, so neither pipe fills."""

    def __init__(self, pipe):
        self._lines, self._op = [], 0
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe):
        for line in pipe:
            traced = TRACED.match(line)
            with self._changed:
                self._lines.append(line)
                self._op = int(traced.group(1)) if traced else self._op
                self._changed.notify_all()
        with self._changed:
            self._op = None  # the end: nothing more will come
            self._changed.notify_all()

    def wait_for_op(self, op, timeout):
        """Whether operation ``op`` was traced (the trace follows its end)."""
        with self._changed:
            self._changed.wait_for(lambda: self._op is None or self._op >= op, timeout)
            return self._op is not None and self._op >= op

    def text(self):
        with self._changed:
            return "".join(self._lines)

    def all(self):
        self._thread.join(TIMEOUT)
        return self.text()


def _kill_group(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
