"""Waiting for the claims journal never freezes an eventlet service.

nova-compute may run on eventlet, where a thread that sleeps in C (as
sqlite's own busy handler does) stops every green thread.  Another process
(``vgpu-manage``) holds the journal's write lock for a while; a green
thread of an eventlet process waits for it in ``Journal.transaction()``
while another green thread ticks.  The ticks must go on during the wait.
"""

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time

import fixtures

from tests.functional_nova import deadline
from vgpu_driver import claims_journal

HOLD = 1.5

WAITER = textwrap.dedent("""
    import eventlet
    eventlet.monkey_patch()
    import json, sys, time
    from vgpu_driver import claims_journal

    journal = claims_journal.Journal(sys.argv[1])
    ticks = []

    def tick():
        while True:
            ticks.append(time.monotonic())
            eventlet.sleep(0.01)

    ticker = eventlet.spawn(tick)
    print("ready", flush=True)
    sys.stdin.readline()                  # the other process holds the lock now
    started = time.monotonic()
    with journal.transaction():
        waited = time.monotonic() - started
    ticker.kill()
    during = [t for t in ticks if t >= started]
    gaps = [b - a for a, b in zip(during, during[1:])]
    print(json.dumps({"waited": waited, "longest_gap": max(gaps), "ticks": len(during)}))
""")


class JournalUnderEventletTests(deadline.TestCase):
    def test_a_writer_of_another_process_is_waited_for_without_freezing(self):
        state = self.useFixture(fixtures.TempDir()).path
        claims_journal.Journal(state)
        waiter = subprocess.Popen(
            [sys.executable, "-c", WAITER, state],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.addCleanup(waiter.wait)
        self.addCleanup(waiter.stdout.close)
        self.addCleanup(waiter.stdin.close)
        self.assertEqual("ready", waiter.stdout.readline().strip())
        holder = sqlite3.connect(
            os.path.join(state, claims_journal.Journal.FILENAME), isolation_level=None
        )
        self.addCleanup(holder.close)
        holder.execute("BEGIN IMMEDIATE")
        waiter.stdin.write("go\n")
        waiter.stdin.flush()
        time.sleep(HOLD)
        holder.execute("COMMIT")
        result = json.loads(waiter.stdout.readline())
        self.assertEqual(0, waiter.wait(timeout=30))
        self.assertGreater(result["waited"], HOLD * 0.6)
        # sqlite may sleep in C for one short try at a time (BUSY_POLL); the
        # bound leaves room for a loaded machine, and is far below the whole
        # hold, which is what a wait inside sqlite's busy handler freezes for.
        self.assertLess(result["longest_gap"], HOLD / 3, result)
        self.assertGreater(result["ticks"], 30, result)
